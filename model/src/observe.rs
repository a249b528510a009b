//! End-to-end observations of any engine: the runs `ft calibrate` and `ft tune` fit to.
//!
//! ft's own probes see ft's own runtime. The engines people run (FreeToken, llama.cpp,
//! KTransformers, vLLM's offload) have costs ft's runtime does not: CPU kernels that serve
//! below their bench rate, fixed costs per layer-step, caches that admit differently,
//! attention that grows with context (mechanism 5 of the design brief). The only view of them
//! is a few measured runs of the engine itself, so this module reads such runs from a file a
//! user can write by hand or a tool can append to, and says which values were given and which
//! were derived.
//!
//! The format (`docs/observations.md` has the reference): a CSV file, one run per row, with a
//! header row naming the columns. Lines starting with `#` are comments. Columns:
//!
//! | column | required | meaning |
//! |---|---|---|
//! | `strategy` | yes | `offload`, `hybrid`, `cpu`, `resident`, `layer-split` (N layers' experts on the CPU, the rest resident) or `layer-split-cached` (N on the CPU, the rest cached with fetched misses) |
//! | `fetch_fraction` | hybrid | share of each layer's misses gathered over the link, 0..=1 |
//! | `cpu_layers` | layer splits | N, the MoE layers whose experts run on the CPU |
//! | `streams` | yes | concurrent streams |
//! | `output_tokens` | yes | tokens generated per request |
//! | `prompt_tokens` | no (0) | prompt length, tokens |
//! | `context` | no | mean context of the decode steps; derived as `prompt + output / 2` |
//! | `cache_slots`, `cache_gb`, `cache_residency` | cached strategies (one of them) | the expert cache: slots, GiB (2^30 B), or the share of all experts it holds |
//! | `cache_policy`, `cache_topology`, `cache_slots_per_layer`, `admission` | no | the cache's options, as `--cache-policy` etc. take them ([`crate::cache::CacheOptions`]); any one given makes the row carry all four, the rest at their defaults |
//! | `tok_s` | yes | measured tokens per second |
//! | `per` | no (`stream`) | whether `tok_s` is per stream or the total over streams |
//! | `measure` | no (`decode`) | `decode` (decode steps only), `server-gen` (the server's generation rate), or `client-e2e` (a client's output tokens over the whole request, prefill included) |
//! | `miss_rate`, `fetched_per_layer`, `cpu_per_layer`, `layer_us`, `threads` | no | what the engine reports, where it does |
//! | `label` | no | a name for the run (its round, its engine build) |

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::cache::{CacheOptions, CachePolicy, CacheTopology};
use crate::error::{ModelError, Result};
use crate::plan::AdmissionPolicy;

/// Largest observations file read, bytes (16 MiB): far beyond any hand-written or tuned set of
/// runs (a row is about 100 bytes), small enough that a wrong path (a device, a model file)
/// fails at once instead of filling memory.
pub const MAX_OBSERVATIONS_FILE_BYTES: u64 = 16 << 20;

/// Most runs in one file: a calibration fits a handful of terms, and tune stops after tens of
/// runs; 10,000 rows is far beyond both and keeps a fit's matrices small.
pub const MAX_OBSERVATIONS: usize = 10_000;

/// Most concurrent streams an observation may claim (the largest serving batch ft models).
pub const MAX_OBSERVED_STREAMS: usize = 4096;

/// Longest prompt, output or context an observation may claim, tokens (16 Mi tokens: beyond
/// every published context window).
pub const MAX_OBSERVED_TOKENS: usize = 1 << 24;

/// Most MoE layers a layer split may name.
pub const MAX_OBSERVED_LAYERS: usize = 4096;

/// Highest tok/s an observation may claim: a decode of a host-RAM MoE model beyond 10^6
/// tokens/s is a typo, not a measurement.
pub const MAX_OBSERVED_TOK_S: f64 = 1e6;

/// How an observed run placed its experts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ObservedStrategy {
    /// Every miss gathered over the link.
    Offload,
    /// A share of each layer's misses gathered, the rest computed on the CPU.
    Hybrid {
        /// Share of each layer's misses gathered over the link.
        fetch_fraction: f64,
    },
    /// Every miss computed on the CPU.
    Cpu,
    /// Every expert resident on the GPU.
    Resident,
    /// `cpu_layers` layers' experts on the CPU, the rest resident (llama.cpp's `--n-cpu-moe`).
    LayerSplit {
        /// MoE layers whose experts run on the CPU.
        cpu_layers: usize,
    },
    /// `cpu_layers` layers' experts on the CPU, the rest cached with fetched misses.
    LayerSplitCached {
        /// MoE layers whose experts run on the CPU.
        cpu_layers: usize,
    },
}

impl ObservedStrategy {
    /// The strategy's column name.
    pub fn name(&self) -> &'static str {
        match self {
            ObservedStrategy::Offload => "offload",
            ObservedStrategy::Hybrid { .. } => "hybrid",
            ObservedStrategy::Cpu => "cpu",
            ObservedStrategy::Resident => "resident",
            ObservedStrategy::LayerSplit { .. } => "layer-split",
            ObservedStrategy::LayerSplitCached { .. } => "layer-split-cached",
        }
    }

    /// Whether the strategy runs a cache whose size the row must give.
    pub fn needs_cache(&self) -> bool {
        match self {
            ObservedStrategy::Offload
            | ObservedStrategy::Hybrid { .. }
            | ObservedStrategy::Cpu
            | ObservedStrategy::LayerSplitCached { .. } => true,
            ObservedStrategy::Resident | ObservedStrategy::LayerSplit { .. } => false,
        }
    }
}

/// What a run's tok/s measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// Decode steps only (an engine's own step timer, ft's `run`).
    #[default]
    Decode,
    /// The server's reported generation rate (decode, with other streams' prefill stalls).
    ServerGen,
    /// A client's output tokens over the whole request, prefill included.
    ClientE2e,
}

impl Measure {
    /// Every measure, in the order of the docs.
    pub const ALL: [Measure; 3] = [Measure::Decode, Measure::ServerGen, Measure::ClientE2e];

    /// The measure's name (`decode`, `server-gen`, `client-e2e`).
    pub fn name(self) -> &'static str {
        match self {
            Measure::Decode => "decode",
            Measure::ServerGen => "server-gen",
            Measure::ClientE2e => "client-e2e",
        }
    }
}

impl std::fmt::Display for Measure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Measure {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        Measure::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| ModelError::UnknownName {
                kind: "measure",
                name: s.to_string(),
                known: "decode, server-gen, client-e2e".into(),
            })
    }
}

/// Whether tok/s is per stream or summed over streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Per {
    /// Tokens per second of one stream (the mean over streams).
    #[default]
    Stream,
    /// Tokens per second summed over all streams.
    Total,
}

/// The expert cache of a run, as the row gave it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "unit", content = "value", rename_all = "kebab-case")]
pub enum ObservedCache {
    /// Slots (experts) of the cache.
    Slots(usize),
    /// GiB (2^30 bytes) of expert weights.
    Gib(f64),
    /// The share of all experts of all layers the cache holds, 0..=1.
    Residency(f64),
}

/// One measured run of an engine, validated, with the values that were derived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// 1-based data row in the file (comments and the header not counted), for messages.
    pub row: usize,
    /// The run's name, if given.
    pub label: Option<String>,
    /// How it placed its experts.
    pub strategy: ObservedStrategy,
    /// Concurrent streams.
    pub streams: usize,
    /// Prompt length, tokens.
    pub prompt_tokens: usize,
    /// Tokens generated per request.
    pub output_tokens: usize,
    /// Mean context of the decode steps, tokens.
    pub context: usize,
    /// The expert cache (None for resident and layer split).
    pub cache: Option<ObservedCache>,
    /// The cache's policy, topology, slots per layer and admission, where the row gave any
    /// (None: the calibration's own, `ft calibrate`'s cache flags).
    #[serde(default)]
    pub cache_options: Option<CacheOptions>,
    /// Measured tok/s per stream (converted from a total where the row gave one).
    pub tok_s_per_stream: f64,
    /// What tok/s measures.
    pub measure: Measure,
    /// Miss rate the engine reported, 0..=1.
    pub miss_rate: Option<f64>,
    /// Experts fetched per layer-step the engine reported.
    pub fetched_per_layer: Option<f64>,
    /// Experts computed on the CPU per layer-step the engine reported.
    pub cpu_per_layer: Option<f64>,
    /// Time of one layer-step the engine reported, us.
    pub layer_us: Option<f64>,
    /// CPU threads the engine ran its expert pool with.
    pub threads: Option<usize>,
    /// The fields whose values were derived rather than given (column names).
    pub derived: Vec<String>,
}

/// A CSV row as written: every column optional here, checked in [`Row::validate`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    strategy: String,
    fetch_fraction: Option<f64>,
    cpu_layers: Option<usize>,
    streams: Option<usize>,
    output_tokens: Option<usize>,
    prompt_tokens: Option<usize>,
    context: Option<usize>,
    cache_slots: Option<usize>,
    cache_gb: Option<f64>,
    cache_residency: Option<f64>,
    cache_policy: Option<String>,
    cache_topology: Option<String>,
    cache_slots_per_layer: Option<usize>,
    admission: Option<String>,
    tok_s: Option<f64>,
    per: Option<Per>,
    measure: Option<Measure>,
    miss_rate: Option<f64>,
    fetched_per_layer: Option<f64>,
    cpu_per_layer: Option<f64>,
    layer_us: Option<f64>,
    threads: Option<usize>,
    label: Option<String>,
}

/// A finite number in `[lo, hi]`, or an error naming the row's column.
fn in_range(field: &str, value: f64, lo: f64, hi: f64) -> Result<f64> {
    if !value.is_finite() || value < lo || value > hi {
        return Err(ModelError::invalid(
            field,
            format!("{value} is outside [{lo}, {hi}]"),
        ));
    }
    Ok(value)
}

/// A count in `[lo, hi]`, or an error naming the row's column.
fn count_in(field: &str, value: usize, lo: usize, hi: usize) -> Result<usize> {
    if value < lo || value > hi {
        return Err(ModelError::invalid(
            field,
            format!("{value} is outside [{lo}, {hi}]"),
        ));
    }
    Ok(value)
}

impl Row {
    /// The cache's options where the row gives any (the others derived: their defaults).
    fn cache_options(
        &self,
        row: usize,
        strategy: ObservedStrategy,
        derived: &mut Vec<String>,
    ) -> Result<Option<CacheOptions>> {
        let at = |col: &str| format!("row {row}: {col}");
        let given = [
            ("cache_policy", self.cache_policy.is_some()),
            ("cache_topology", self.cache_topology.is_some()),
            (
                "cache_slots_per_layer",
                self.cache_slots_per_layer.is_some(),
            ),
            ("admission", self.admission.is_some()),
        ];
        let Some(first) = given.iter().find(|g| g.1) else {
            return Ok(None);
        };
        if !strategy.needs_cache() {
            return Err(ModelError::invalid(
                at(first.0),
                format!("{} runs no cache", strategy.name()),
            ));
        }
        for (col, g) in given {
            if !g {
                derived.push(col.to_string());
            }
        }
        let parse_err = |col: &str, e: ModelError| ModelError::invalid(at(col), e.to_string());
        let policy: CachePolicy = match &self.cache_policy {
            Some(p) => p.trim().parse().map_err(|e| parse_err("cache_policy", e))?,
            None => CachePolicy::default(),
        };
        let topology = match (&self.cache_topology, self.cache_slots_per_layer) {
            (Some(t), _) => t
                .trim()
                .parse::<CacheTopology>()
                .map_err(|e| parse_err("cache_topology", e))?,
            (None, Some(_)) => CacheTopology::PerLayer,
            (None, None) => CacheTopology::Global,
        };
        let admission: AdmissionPolicy = match &self.admission {
            Some(a) => a.trim().parse().map_err(|e| parse_err("admission", e))?,
            None => AdmissionPolicy::default(),
        };
        let slots_per_layer = self
            .cache_slots_per_layer
            .map(|n| count_in(&at("cache_slots_per_layer"), n, 1, 1 << 24))
            .transpose()?;
        Ok(Some(CacheOptions {
            policy,
            topology,
            slots_per_layer,
            admission,
        }))
    }

    fn validate(self, row: usize) -> Result<Observation> {
        let at = |col: &str| format!("row {row}: {col}");
        let need = |col: &str, v: Option<usize>| {
            v.ok_or_else(|| ModelError::invalid(at(col), "missing (required)"))
        };
        let mut derived = Vec::new();
        let strategy = match self.strategy.trim().to_ascii_lowercase().as_str() {
            "offload" => ObservedStrategy::Offload,
            "cpu" => ObservedStrategy::Cpu,
            "resident" => ObservedStrategy::Resident,
            "hybrid" => {
                let f = self.fetch_fraction.ok_or_else(|| {
                    ModelError::invalid(at("fetch_fraction"), "missing (required for hybrid)")
                })?;
                ObservedStrategy::Hybrid {
                    fetch_fraction: in_range(&at("fetch_fraction"), f, 0.0, 1.0)?,
                }
            }
            "layer-split" | "layer-split-cached" => {
                let n = self.cpu_layers.ok_or_else(|| {
                    ModelError::invalid(at("cpu_layers"), "missing (required for layer splits)")
                })?;
                let cpu_layers = count_in(&at("cpu_layers"), n, 0, MAX_OBSERVED_LAYERS)?;
                if self.strategy.trim().eq_ignore_ascii_case("layer-split") {
                    ObservedStrategy::LayerSplit { cpu_layers }
                } else {
                    ObservedStrategy::LayerSplitCached { cpu_layers }
                }
            }
            other => {
                return Err(ModelError::UnknownName {
                    kind: "strategy",
                    name: format!("{other} (row {row})"),
                    known: "offload, hybrid, cpu, resident, layer-split, layer-split-cached".into(),
                })
            }
        };
        if self.fetch_fraction.is_some() && !matches!(strategy, ObservedStrategy::Hybrid { .. }) {
            return Err(ModelError::invalid(
                at("fetch_fraction"),
                format!("given for {}; only hybrid has one", strategy.name()),
            ));
        }
        let splits = matches!(
            strategy,
            ObservedStrategy::LayerSplit { .. } | ObservedStrategy::LayerSplitCached { .. }
        );
        if self.cpu_layers.is_some() && !splits {
            return Err(ModelError::invalid(
                at("cpu_layers"),
                format!("given for {}; only layer splits have one", strategy.name()),
            ));
        }
        let streams = count_in(
            &at("streams"),
            need("streams", self.streams)?,
            1,
            MAX_OBSERVED_STREAMS,
        )?;
        let output_tokens = count_in(
            &at("output_tokens"),
            need("output_tokens", self.output_tokens)?,
            1,
            MAX_OBSERVED_TOKENS,
        )?;
        let prompt_tokens = match self.prompt_tokens {
            Some(p) => count_in(&at("prompt_tokens"), p, 0, MAX_OBSERVED_TOKENS)?,
            None => {
                derived.push("prompt_tokens".to_string());
                0
            }
        };
        let context = match self.context {
            Some(c) => count_in(&at("context"), c, 1, MAX_OBSERVED_TOKENS)?,
            None => {
                derived.push("context".to_string());
                (prompt_tokens + output_tokens / 2).max(1)
            }
        };
        let given: Vec<ObservedCache> = [
            self.cache_slots.map(ObservedCache::Slots),
            self.cache_gb.map(ObservedCache::Gib),
            self.cache_residency.map(ObservedCache::Residency),
        ]
        .into_iter()
        .flatten()
        .collect();
        let cache = match (strategy.needs_cache(), given.as_slice()) {
            (_, [_, _, ..]) => {
                return Err(ModelError::invalid(
                    at("cache_slots/cache_gb/cache_residency"),
                    "give one cache size, not several",
                ))
            }
            (true, []) => {
                return Err(ModelError::invalid(
                    at("cache_slots/cache_gb/cache_residency"),
                    format!("{} runs a cache: give its size", strategy.name()),
                ))
            }
            (false, [_]) => {
                return Err(ModelError::invalid(
                    at("cache_slots/cache_gb/cache_residency"),
                    format!("{} runs no cache", strategy.name()),
                ))
            }
            (false, []) => None,
            (true, [c]) => Some(match *c {
                ObservedCache::Slots(s) => {
                    ObservedCache::Slots(count_in(&at("cache_slots"), s, 1, usize::MAX)?)
                }
                ObservedCache::Gib(g) => {
                    ObservedCache::Gib(in_range(&at("cache_gb"), g, f64::MIN_POSITIVE, 1e6)?)
                }
                ObservedCache::Residency(r) => {
                    ObservedCache::Residency(in_range(&at("cache_residency"), r, 0.0, 1.0)?)
                }
            }),
        };
        let cache_options = self.cache_options(row, strategy, &mut derived)?;
        let tok_s = self
            .tok_s
            .ok_or_else(|| ModelError::invalid(at("tok_s"), "missing (required)"))?;
        let tok_s = in_range(&at("tok_s"), tok_s, f64::MIN_POSITIVE, MAX_OBSERVED_TOK_S)?;
        let per = self.per.unwrap_or_else(|| {
            derived.push("per".to_string());
            Per::Stream
        });
        let tok_s_per_stream = match per {
            Per::Stream => tok_s,
            Per::Total => tok_s / streams as f64,
        };
        let measure = self.measure.unwrap_or_else(|| {
            derived.push("measure".to_string());
            Measure::Decode
        });
        let opt = |col: &str, v: Option<f64>, hi: f64| -> Result<Option<f64>> {
            v.map(|x| in_range(&at(col), x, 0.0, hi)).transpose()
        };
        Ok(Observation {
            row,
            label: self.label.filter(|l| !l.trim().is_empty()),
            strategy,
            streams,
            prompt_tokens,
            output_tokens,
            context,
            cache,
            cache_options,
            tok_s_per_stream,
            measure,
            miss_rate: opt("miss_rate", self.miss_rate, 1.0)?,
            fetched_per_layer: opt("fetched_per_layer", self.fetched_per_layer, 1e6)?,
            cpu_per_layer: opt("cpu_per_layer", self.cpu_per_layer, 1e6)?,
            layer_us: opt("layer_us", self.layer_us, 1e9)?,
            threads: self
                .threads
                .map(|t| count_in(&at("threads"), t, 1, 1 << 16))
                .transpose()?,
            derived,
        })
    }
}

/// Parse observations from CSV text; `origin` (a path) names every error.
pub fn parse_observations(text: &str, origin: &str) -> Result<Vec<Observation>> {
    let bad = |message: String| ModelError::Csv {
        path: origin.to_string(),
        message,
    };
    let mut reader = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| bad(format!("the header row: {e}")))?
        .clone();
    if headers.iter().all(|h| h.is_empty()) {
        return Err(bad(
            "no header row (the first line names the columns)".into()
        ));
    }
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let row = i + 1;
        if row > MAX_OBSERVATIONS {
            return Err(bad(format!(
                "more than {MAX_OBSERVATIONS} runs (the limit of one observations file)"
            )));
        }
        let record = record.map_err(|e| bad(format!("row {row}: {e}")))?;
        // An empty cell deserializes as an absent (None) value.
        let parsed: Row = record
            .deserialize(Some(&headers))
            .map_err(|e| bad(format!("row {row}: {e}")))?;
        out.push(parsed.validate(row).map_err(|e| match e {
            ModelError::Invalid { field, reason } => ModelError::Invalid {
                field: format!("{origin}: {field}"),
                reason,
            },
            other => other,
        })?);
    }
    if out.is_empty() {
        return Err(bad("no runs (a header row and no data rows)".into()));
    }
    Ok(out)
}

/// Read an observations file, refusing files over [`MAX_OBSERVATIONS_FILE_BYTES`] before
/// reading them.
pub fn read_observations(path: &Path) -> Result<Vec<Observation>> {
    let origin = path.display().to_string();
    let io = |source| ModelError::Io {
        path: origin.clone(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(ModelError::invalid(
            origin.clone(),
            "not a regular file (an observations file is CSV text)",
        ));
    }
    if meta.len() > MAX_OBSERVATIONS_FILE_BYTES {
        return Err(ModelError::invalid(
            origin.clone(),
            format!(
                "{} bytes, over the {MAX_OBSERVATIONS_FILE_BYTES}-byte limit of an observations file",
                meta.len()
            ),
        ));
    }
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_OBSERVATIONS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    parse_observations(&text, &origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "strategy,fetch_fraction,cpu_layers,streams,prompt_tokens,output_tokens,cache_slots,cache_residency,tok_s,per,measure\n";

    fn parse(rows: &str) -> Result<Vec<Observation>> {
        parse_observations(&format!("{HEADER}{rows}"), "runs.csv")
    }

    fn err(rows: &str) -> String {
        parse(rows).expect_err(rows).to_string()
    }

    #[test]
    fn every_strategy_parses_with_its_parameter_and_derived_fields_are_marked() {
        let runs = parse(concat!(
            "# the field report's A/B\n",
            "offload,,,2,1200,256,2048,,47.8,total,client-e2e\n",
            "hybrid,0.277,,1,1200,256,2048,,30.8,,\n",
            "layer-split,,12,1,,256,,,20,stream,decode\n",
            "layer-split-cached,,12,1,,256,,0.25,20,stream,decode\n",
            "resident,,,4,512,64,,,90,stream,server-gen\n",
            "cpu,,,1,0,16,1,,3,stream,decode\n",
        ))
        .unwrap();
        assert_eq!(runs.len(), 6);
        // A total over two streams is stored per stream.
        assert!((runs[0].tok_s_per_stream - 23.9).abs() < 1e-12);
        assert_eq!(runs[0].measure, Measure::ClientE2e);
        assert_eq!(runs[0].context, 1200 + 128);
        assert_eq!(runs[0].derived, vec!["context".to_string()]);
        assert_eq!(
            runs[1].strategy,
            ObservedStrategy::Hybrid {
                fetch_fraction: 0.277
            }
        );
        assert_eq!(runs[1].derived, vec!["context", "per", "measure"]);
        assert_eq!(
            runs[2].strategy,
            ObservedStrategy::LayerSplit { cpu_layers: 12 }
        );
        assert_eq!(runs[2].cache, None);
        assert!(runs[2].derived.contains(&"prompt_tokens".to_string()));
        assert_eq!(runs[3].cache, Some(ObservedCache::Residency(0.25)));
        assert_eq!(runs[4].strategy, ObservedStrategy::Resident);
        assert_eq!(runs[5].cache, Some(ObservedCache::Slots(1)));
        assert_eq!(
            runs.iter().map(|r| r.row).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5, 6]
        );
    }

    #[test]
    fn a_missing_or_misplaced_parameter_is_an_error_naming_row_and_column() {
        let cases = [
            ("hybrid,,,1,0,16,8,,3,,\n", "row 1: fetch_fraction"),
            ("hybrid,1.5,,1,0,16,8,,3,,\n", "row 1: fetch_fraction"),
            ("offload,0.5,,1,0,16,8,,3,,\n", "only hybrid"),
            ("layer-split,,,1,0,16,,,3,,\n", "row 1: cpu_layers"),
            ("offload,,4,1,0,16,8,,3,,\n", "only layer splits"),
            ("offload,,,0,0,16,8,,3,,\n", "row 1: streams"),
            ("offload,,,1,0,0,8,,3,,\n", "row 1: output_tokens"),
            ("offload,,,1,0,16,,,3,,\n", "give its size"),
            ("offload,,,1,0,16,8,0.5,3,,\n", "not several"),
            ("resident,,,1,0,16,8,,3,,\n", "runs no cache"),
            ("offload,,,1,0,16,8,,NaN,,\n", "row 1: tok_s"),
            ("offload,,,1,0,16,8,,-3,,\n", "row 1: tok_s"),
            ("offload,,,1,0,16,8,,1e300,,\n", "row 1: tok_s"),
            ("offload,,,1,0,16,8,,3,each,\n", "row 1"),
            ("offload,,,1,0,16,8,,3,,wall\n", "row 1"),
            (
                "fused,,,1,0,16,8,,3,,\n",
                "unknown strategy 'fused (row 1)'",
            ),
            ("offload,,,1,0,16,8,1.2,3,,\n", "not several"),
        ];
        for (row, want) in cases {
            let e = err(row);
            assert!(e.contains(want), "{row:?}: {e}");
        }
        let unknown = parse_observations("strategy,tok_s,colour\noffload,1,red\n", "runs.csv")
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("runs.csv") && unknown.contains("colour"),
            "{unknown}"
        );
        let empty = parse_observations(HEADER, "runs.csv")
            .unwrap_err()
            .to_string();
        assert!(empty.contains("no runs"), "{empty}");
        assert!(parse_observations("", "runs.csv").is_err());
    }

    #[test]
    fn a_row_may_give_its_caches_options_and_the_rest_are_derived() {
        let text = "strategy,streams,output_tokens,cache_slots,cache_topology,cache_slots_per_layer,admission,tok_s\n\
                    offload,1,16,64,per-layer,,,3\n\
                    offload,1,16,64,,8,\"order,cached-history\",3\n";
        let runs = parse_observations(text, "runs.csv").unwrap();
        let a = runs[0].cache_options.as_ref().unwrap();
        assert_eq!(a.topology, CacheTopology::PerLayer);
        assert_eq!(
            (a.slots_per_layer, a.policy.clone()),
            (None, CachePolicy::default())
        );
        for col in ["cache_policy", "cache_slots_per_layer", "admission"] {
            assert!(runs[0].derived.iter().any(|d| d == col), "{col}");
        }
        let b = runs[1].cache_options.as_ref().unwrap();
        // Slots per layer without a topology: per layer, as `--cache-slots-per-layer` does.
        assert_eq!(
            (b.topology, b.slots_per_layer),
            (CacheTopology::PerLayer, Some(8))
        );
        assert_eq!(b.admission.to_string(), "order,cached-history");
        let bad = |row: &str| {
            parse_observations(
                &format!("strategy,streams,output_tokens,cache_slots,cache_policy,cache_slots_per_layer,tok_s\n{row}\n"),
                "runs.csv",
            )
            .unwrap_err()
            .to_string()
        };
        assert!(bad("offload,1,16,64,mru,,3").contains("row 1: cache_policy"));
        assert!(bad("offload,1,16,64,,0,3").contains("row 1: cache_slots_per_layer"));
        assert!(bad("resident,1,16,,lru,,3").contains("runs no cache"));
    }

    #[test]
    fn a_file_over_the_limit_or_not_a_file_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.csv");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_OBSERVATIONS_FILE_BYTES + 1).unwrap();
        let e = read_observations(&big).unwrap_err().to_string();
        assert!(e.contains("big.csv") && e.contains("limit"), "{e}");
        let e = read_observations(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let ok = dir.path().join("ok.csv");
        std::fs::write(&ok, format!("{HEADER}cpu,,,1,0,16,1,,3,stream,decode\n")).unwrap();
        assert_eq!(read_observations(&ok).unwrap().len(), 1);
    }

    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("../../docs/observations.md");
        let block = doc
            .split("```csv\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("docs/observations.md has a ```csv example");
        let runs = parse_observations(block, "docs/observations.md").unwrap();
        assert_eq!(runs.len(), 4);
        assert!(runs
            .iter()
            .all(|r| r.measure == Measure::ClientE2e && r.cache == Some(ObservedCache::Gib(14.0))));
    }
}
