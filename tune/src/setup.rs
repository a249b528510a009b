//! From tune's flags to what it runs: the candidate configurations, the concurrencies every
//! run measures, and the cache sizes, each checked against the template before anything
//! starts.
//!
//! Why it is here and not in the binary: what a tune varies decides what its runs can
//! identify (how speed moves with streams and with the cache's residency), so it is part of
//! the protocol, tested with it, and the same for any front end.

use ft_model::observe::{ObservedCache, ObservedStrategy, MAX_OBSERVED_STREAMS};

use crate::error::{Result, TuneError};
use crate::template::{Template, STRATEGY_NAMES};

/// Most cache sizes one tune runs: the decision's and a few more to identify the miss
/// rate's slope; beyond four the runs are a sweep, better made with `ft run`'s grids.
pub const MAX_CACHE_SIZES: usize = 4;

/// Most concurrencies each run measures (1 and the requested ones): every concurrency adds
/// its requests to every run.
pub const MAX_CONCURRENCIES: usize = 6;

/// The configurations to choose between: `strategies` (all the template maps where empty),
/// hybrid at each of `fetch_fractions` (or the template's fixed one), a layer split at each
/// of `cpu_layers`.
pub fn candidates(
    template: &Template,
    strategies: &[String],
    fetch_fractions: &[f64],
    cpu_layers: &[usize],
) -> Result<Vec<ObservedStrategy>> {
    let names: Vec<String> = if strategies.is_empty() {
        STRATEGY_NAMES
            .iter()
            .filter(|s| template.strategies().any(|t| t == **s))
            .map(|s| s.to_string())
            .collect()
    } else {
        strategies.to_vec()
    };
    let mut out = Vec::new();
    for name in &names {
        if !template.strategies().any(|t| t == name) {
            return Err(TuneError::invalid(
                "--strategies",
                format!(
                    "{name}: template {} maps {}",
                    template.path,
                    template.strategies().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        match name.as_str() {
            "offload" => out.push(ObservedStrategy::Offload),
            "cpu" => out.push(ObservedStrategy::Cpu),
            "resident" => out.push(ObservedStrategy::Resident),
            "hybrid" => match template.hybrid_fixed_fraction() {
                Some(f) => out.push(ObservedStrategy::Hybrid { fetch_fraction: f }),
                None => {
                    for &f in fetch_fractions {
                        if !(0.0..=1.0).contains(&f) {
                            return Err(TuneError::invalid(
                                "--fetch-fractions",
                                format!("{f} is outside [0, 1]"),
                            ));
                        }
                        out.push(ObservedStrategy::Hybrid { fetch_fraction: f });
                    }
                }
            },
            split => {
                if cpu_layers.is_empty() {
                    return Err(TuneError::invalid(
                        "--cpu-layers",
                        format!("{split} needs the N to try (--cpu-layers 8,16)"),
                    ));
                }
                for &n in cpu_layers {
                    out.push(if split == "layer-split" {
                        ObservedStrategy::LayerSplit { cpu_layers: n }
                    } else {
                        ObservedStrategy::LayerSplitCached { cpu_layers: n }
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The concurrencies every run measures: 1, then `streams` in the order given (the first of
/// them is the decision's), without repeats.
pub fn concurrencies(streams: &[usize]) -> Result<Vec<usize>> {
    if streams.is_empty() {
        return Err(TuneError::invalid("--streams", "give at least one"));
    }
    let mut out = vec![1];
    for &s in streams {
        if s == 0 || s > MAX_OBSERVED_STREAMS {
            return Err(TuneError::invalid(
                "--streams",
                format!("{s} is outside [1, {MAX_OBSERVED_STREAMS}]"),
            ));
        }
        if !out.contains(&s) {
            out.push(s);
        }
    }
    if out.len() > MAX_CONCURRENCIES {
        return Err(TuneError::invalid(
            "--streams",
            format!(
                "{} concurrencies with 1; at most {MAX_CONCURRENCIES} (each adds its requests to every run)",
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// The decision's cache and the other sizes runs are made at, from `--cache-gb` or
/// `--cache-residency` (at most one of them non-empty; the first size is the decision's).
/// More than one size needs a template whose command sets `{cache_gb}`: a residency, or an
/// engine whose flags do not size its cache, cannot be varied by tune.
pub fn cache_sizes(
    template: &Template,
    cache_gb: &[f64],
    residency: &[f64],
) -> Result<(Option<ObservedCache>, Vec<ObservedCache>)> {
    let mut sizes = Vec::new();
    for &g in cache_gb {
        if !(g.is_finite() && g > 0.0 && g <= 1e6) {
            return Err(TuneError::invalid(
                "--cache-gb",
                format!("{g} is outside (0, 1e6]"),
            ));
        }
        sizes.push(ObservedCache::Gib(g));
    }
    for &r in residency {
        if !(r.is_finite() && r > 0.0 && r <= 1.0) {
            return Err(TuneError::invalid(
                "--cache-residency",
                format!("{r} is outside (0, 1]"),
            ));
        }
        sizes.push(ObservedCache::Residency(r));
    }
    if !cache_gb.is_empty() && !residency.is_empty() {
        return Err(TuneError::invalid(
            "--cache-residency",
            "give the cache as --cache-gb or as --cache-residency, not both",
        ));
    }
    if sizes.len() > MAX_CACHE_SIZES {
        return Err(TuneError::invalid(
            "--cache-gb",
            format!("{} sizes; at most {MAX_CACHE_SIZES}", sizes.len()),
        ));
    }
    for (i, a) in sizes.iter().enumerate() {
        if sizes[..i].contains(a) {
            return Err(TuneError::invalid(
                "--cache-gb",
                format!("{a:?} is given twice"),
            ));
        }
    }
    if sizes.len() > 1 {
        if !residency.is_empty() {
            return Err(TuneError::invalid(
                "--cache-residency",
                "tune cannot set a residency in the engine's command: give one (or sizes in GiB, --cache-gb, with a template that uses {cache_gb})",
            ));
        }
        if !template.uses("cache_gb") {
            return Err(TuneError::invalid(
                "--cache-gb",
                format!(
                    "template {} does not use {{cache_gb}}, so tune cannot run other cache sizes: give one",
                    template.path
                ),
            ));
        }
    }
    let mut it = sizes.into_iter();
    Ok((it.next(), it.collect()))
}

/// The value `{cache_gb}` takes for a run at `cache`, where it is a size in GiB.
pub fn cache_gb_value(cache: &ObservedCache) -> Option<String> {
    match cache {
        ObservedCache::Gib(g) => Some(g.to_string()),
        _ => None,
    }
}

/// A cache in words: `7 GiB`, `20% of the experts`, `1024 slots`.
pub fn cache_text(cache: &ObservedCache) -> String {
    match cache {
        ObservedCache::Gib(g) => format!("{g} GiB"),
        ObservedCache::Residency(r) => format!("{}% of the experts", r * 100.0),
        ObservedCache::Slots(n) => format!("{n} slots"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TPL: &str = r#"
name = "t"
command = ["{ft}", "serve", "--port", "{port}", "--cache-gb", "{cache_gb}", "{strategy_args}"]
[strategies.offload]
args = ["--moe-strategy", "offload"]
[strategies.hybrid]
args = ["--moe-strategy", "hybrid", "--fetch-fraction", "{fetch_fraction}"]
[strategies.layer-split]
args = ["--n-cpu-moe", "{cpu_layers}"]
"#;

    fn template(text: &str) -> Template {
        Template::parse(text, "t.toml", &[], &[("cache_gb", Some("1".into()))]).unwrap()
    }

    #[test]
    fn candidates_expand_fractions_and_splits() {
        let t = template(TPL);
        let c = candidates(&t, &[], &[0.25, 0.5], &[4]).unwrap();
        assert_eq!(
            c,
            [
                ObservedStrategy::Offload,
                ObservedStrategy::Hybrid {
                    fetch_fraction: 0.25
                },
                ObservedStrategy::Hybrid {
                    fetch_fraction: 0.5
                },
                ObservedStrategy::LayerSplit { cpu_layers: 4 },
            ]
        );
        let e = candidates(&t, &["cpu".into()], &[0.5], &[]).unwrap_err();
        assert!(e.to_string().contains("maps"), "{e}");
        let e = candidates(&t, &["layer-split".into()], &[0.5], &[]).unwrap_err();
        assert!(e.to_string().contains("--cpu-layers"), "{e}");
        let e = candidates(&t, &["hybrid".into()], &[1.5], &[]).unwrap_err();
        assert!(e.to_string().contains("--fetch-fractions"), "{e}");
    }

    #[test]
    fn every_run_measures_one_stream_and_the_requested_ones() {
        assert_eq!(concurrencies(&[2]).unwrap(), [1, 2]);
        assert_eq!(concurrencies(&[4, 1, 2, 4]).unwrap(), [1, 4, 2]);
        assert_eq!(concurrencies(&[1]).unwrap(), [1]);
        let bad: [&[usize]; 3] = [&[], &[0], &[2, 3, 4, 5, 6, 7]];
        for bad in bad {
            let e = concurrencies(bad).unwrap_err();
            assert!(e.to_string().contains("--streams"), "{e}");
        }
    }

    #[test]
    fn more_than_one_cache_size_needs_the_cache_gb_placeholder() {
        let t = template(TPL);
        let (first, rest) = cache_sizes(&t, &[14.0, 7.0], &[]).unwrap();
        assert_eq!(first, Some(ObservedCache::Gib(14.0)));
        assert_eq!(rest, [ObservedCache::Gib(7.0)]);
        assert_eq!(cache_gb_value(&rest[0]).as_deref(), Some("7"));
        assert_eq!(cache_sizes(&t, &[], &[]).unwrap(), (None, vec![]));
        // One residency is recorded; two cannot be set through the command.
        let (first, _) = cache_sizes(&t, &[], &[0.2]).unwrap();
        assert_eq!(first, Some(ObservedCache::Residency(0.2)));
        let e = cache_sizes(&t, &[], &[0.2, 0.4]).unwrap_err();
        assert!(e.to_string().contains("--cache-residency"), "{e}");
        // A template that does not size the cache runs one size only.
        let fixed = template(&TPL.replace(", \"--cache-gb\", \"{cache_gb}\"", ""));
        assert!(!fixed.uses("cache_gb") && t.uses("cache_gb"));
        assert!(cache_sizes(&fixed, &[14.0], &[]).is_ok());
        let e = cache_sizes(&fixed, &[14.0, 7.0], &[]).unwrap_err();
        assert!(e.to_string().contains("{cache_gb}"), "{e}");
        let cases: [(&[f64], &[f64]); 4] = [
            (&[0.0], &[]),
            (&[1.0, 1.0], &[]),
            (&[], &[1.5]),
            (&[1.0], &[0.5]),
        ];
        for (gb, res) in cases {
            assert!(cache_sizes(&t, gb, res).is_err(), "{gb:?} {res:?}");
        }
    }
}
