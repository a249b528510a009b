//! Writing runs as rows of the observations CSV (`docs/observations.md`), the file
//! `ft calibrate` reads and `ft_model::observe` parses.
//!
//! tune rewrites the whole file after every run (a temporary file renamed over it), so an
//! interrupted tune leaves every finished run on disk and never half a row. A value the
//! reader derived when the file was read (listed in the run's `derived`) is written back as
//! an empty cell, so it stays marked as derived.

use std::path::Path;

use ft_model::observe::{Measure, Observation, ObservedCache, ObservedStrategy};
use serde::Serialize;

use crate::error::{Result, TuneError};

/// One row as written; empty cells for absent values.
#[derive(Debug, Serialize)]
struct OutRow<'a> {
    strategy: &'static str,
    fetch_fraction: Option<f64>,
    cpu_layers: Option<usize>,
    streams: usize,
    prompt_tokens: Option<usize>,
    output_tokens: usize,
    context: Option<usize>,
    cache_slots: Option<usize>,
    cache_gb: Option<f64>,
    cache_residency: Option<f64>,
    cache_policy: Option<String>,
    cache_topology: Option<String>,
    cache_slots_per_layer: Option<usize>,
    admission: Option<String>,
    tok_s: f64,
    per: Option<&'static str>,
    measure: Option<&'static str>,
    miss_rate: Option<f64>,
    fetched_per_layer: Option<f64>,
    cpu_per_layer: Option<f64>,
    layer_us: Option<f64>,
    threads: Option<usize>,
    label: Option<&'a str>,
}

/// The CSV name of a measure.
pub fn measure_name(m: Measure) -> &'static str {
    match m {
        Measure::Decode => "decode",
        Measure::ServerGen => "server-gen",
        Measure::ClientE2e => "client-e2e",
    }
}

fn row(o: &Observation) -> OutRow<'_> {
    let derived = |c: &str| o.derived.iter().any(|d| d == c);
    let (fetch_fraction, cpu_layers) = match o.strategy {
        ObservedStrategy::Hybrid { fetch_fraction } => (Some(fetch_fraction), None),
        ObservedStrategy::LayerSplit { cpu_layers }
        | ObservedStrategy::LayerSplitCached { cpu_layers } => (None, Some(cpu_layers)),
        ObservedStrategy::Offload | ObservedStrategy::Cpu | ObservedStrategy::Resident => {
            (None, None)
        }
    };
    let (mut cache_slots, mut cache_gb, mut cache_residency) = (None, None, None);
    match o.cache {
        Some(ObservedCache::Slots(s)) => cache_slots = Some(s),
        Some(ObservedCache::Gib(g)) => cache_gb = Some(g),
        Some(ObservedCache::Residency(r)) => cache_residency = Some(r),
        None => {}
    }
    let options = o.cache_options.as_ref();
    let given = |c: &str| options.is_some() && !derived(c);
    OutRow {
        cache_policy: options
            .filter(|_| given("cache_policy"))
            .map(|c| c.policy.to_string()),
        cache_topology: options
            .filter(|_| given("cache_topology"))
            .map(|c| c.topology.to_string()),
        cache_slots_per_layer: options
            .filter(|_| given("cache_slots_per_layer"))
            .and_then(|c| c.slots_per_layer),
        admission: options
            .filter(|_| given("admission"))
            .map(|c| c.admission.to_string()),
        strategy: o.strategy.name(),
        fetch_fraction,
        cpu_layers,
        streams: o.streams,
        prompt_tokens: (!derived("prompt_tokens")).then_some(o.prompt_tokens),
        output_tokens: o.output_tokens,
        context: (!derived("context")).then_some(o.context),
        cache_slots,
        cache_gb,
        cache_residency,
        tok_s: o.tok_s_per_stream,
        per: (!derived("per")).then_some("stream"),
        measure: (!derived("measure")).then_some(measure_name(o.measure)),
        miss_rate: o.miss_rate,
        fetched_per_layer: o.fetched_per_layer,
        cpu_per_layer: o.cpu_per_layer,
        layer_us: o.layer_us,
        threads: o.threads,
        label: o.label.as_deref(),
    }
}

/// The observations as CSV text, with a comment line first.
pub fn to_csv(runs: &[Observation], comment: &str) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for o in runs {
        w.serialize(row(o)).map_err(|e| TuneError::Io {
            path: "(observations)".into(),
            source: std::io::Error::other(e),
        })?;
    }
    if runs.is_empty() {
        // The header alone (serialize writes it with the first row).
        w.write_record([
            "strategy",
            "fetch_fraction",
            "cpu_layers",
            "streams",
            "prompt_tokens",
            "output_tokens",
            "context",
            "cache_slots",
            "cache_gb",
            "cache_residency",
            "cache_policy",
            "cache_topology",
            "cache_slots_per_layer",
            "admission",
            "tok_s",
            "per",
            "measure",
            "miss_rate",
            "fetched_per_layer",
            "cpu_per_layer",
            "layer_us",
            "threads",
            "label",
        ])
        .map_err(|e| TuneError::Io {
            path: "(observations)".into(),
            source: std::io::Error::other(e),
        })?;
    }
    let body = w.into_inner().map_err(|e| TuneError::Io {
        path: "(observations)".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let mut text = String::new();
    for line in comment.lines() {
        text += &format!("# {line}\n");
    }
    text += &String::from_utf8_lossy(&body);
    Ok(text)
}

/// Write the observations to `path` atomically (a temporary file renamed over it).
pub fn write(path: &Path, runs: &[Observation], comment: &str) -> Result<()> {
    let text = to_csv(runs, comment)?;
    let tmp = path.with_extension("csv.tmp");
    let io = |source| TuneError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::observe::parse_observations;

    #[test]
    fn written_rows_read_back_as_the_same_runs() {
        let text = "strategy,fetch_fraction,cpu_layers,streams,prompt_tokens,output_tokens,cache_gb,cache_residency,cache_policy,cache_slots_per_layer,admission,tok_s,per,measure,miss_rate,threads,label\n\
                    offload,,,2,1200,256,14,,lfu,,,47.8,total,client-e2e,0.38,12,offload-2\n\
                    hybrid,0.277,,1,,256,,0.2,,4,\"recent,cached-history\",30.8,,,,,\n\
                    hybrid,0.5,,1,,256,,0.2,,,,30.8,,,,,\n\
                    layer-split,,12,1,100,256,,,,,,20,stream,decode,,,\n";
        let runs = parse_observations(text, "in.csv").unwrap();
        let out = to_csv(&runs, "written by a test\nsecond line").unwrap();
        assert!(out.starts_with("# written by a test\n# second line\nstrategy,"));
        let back = parse_observations(&out, "out.csv").unwrap();
        assert_eq!(back, runs, "{out}");
        // The cache's options: as given, the rest derived (and written back empty).
        let o = runs[1].cache_options.as_ref().unwrap();
        assert_eq!(o.slots_per_layer, Some(4));
        assert_eq!(o.admission.to_string(), "recent,cached-history");
        assert!(runs[1].derived.iter().any(|d| d == "cache_policy"));
        assert_eq!(
            runs[0].cache_options.as_ref().unwrap().policy.to_string(),
            "lfu"
        );
        assert_eq!(runs[2].cache_options, None);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.csv");
        write(&p, &runs, "x").unwrap();
        assert_eq!(
            ft_model::observe::read_observations(&p).unwrap().len(),
            runs.len()
        );
    }
}
