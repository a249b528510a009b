//! The strategies of a run: one from `--strategy` (with `--fetch-fraction`), or the
//! `--interleave` list, each parsed into a [`VariantSpec`] and resolved into a [`Variant`]
//! ready to decode: an `auto` fetch fraction or number of CPU layers decided by the
//! performance model of `--host` ([`ft_model::resolve`]), and decided again at the CPU check
//! before the first round where `--host` is a profile that kept its checks.

use ft_model::cache::{CacheOptions, CacheSize};
use ft_model::perf::{PerfModel, PredictConfig};
use ft_model::profile::CpuCheck;
use ft_model::report::CheckedSpeed;
use ft_model::resolve::{self, StrategyRequest};
use ft_model::{CpuLayers, FetchFraction, LayerPlacement, ModelSpec, Strategy, StrategyKind};

use super::error::{Context, Result};
use super::RunRequest;

/// The performance model that resolves `--fetch-fraction auto` (`--host`), and the probe's
/// CPU checks a check before the first round is set against.
#[derive(Debug, Clone)]
pub struct AutoHost {
    name: String,
    perf: PerfModel,
    /// The probe's CPU checks (a profile's; empty for a spec).
    pub cpu_checks: Vec<CpuCheck>,
}

impl AutoHost {
    /// `--host` as given; an error naming the flag where it is missing or unreadable.
    pub fn of_request(req: &RunRequest) -> Result<AutoHost> {
        let Some(host) = &req.host else {
            bail!(
                "an auto fetch fraction or number of CPU layers needs the performance model's \
                 parameters: give --host HOST (a host preset, a host TOML or a profile JSON), or \
                 a number (--fetch-fraction F, layer-split:N)"
            );
        };
        let h = ft_model::hosts::resolve_host(host).with_context(|| format!("--host {host}"))?;
        Ok(AutoHost {
            name: h.name,
            perf: h.perf,
            cpu_checks: h.cpu_checks,
        })
    }

    /// `strategy`'s `auto` parameter decided by `perf` (this host's model, or it rescaled)
    /// for the run ([`ft_model::resolve`]): its traffic simulation counts the run's own steps
    /// after its warm-up, of the routing the run decodes (as `ft predict --steps --warmup
    /// --seed` does), with the run's cache of `slots` where the strategy keeps one
    /// (a layer split's count among those whose resident layers fit the host's GPU memory
    /// budget).
    fn decide(
        perf: &PerfModel,
        req: &RunRequest,
        model: &ModelSpec,
        strategy: Strategy,
        slots: usize,
        cache_options: &CacheOptions,
    ) -> Result<Strategy> {
        let kind = strategy.kind();
        let cache = match kind {
            StrategyKind::Hybrid | StrategyKind::LayerSplitCached => {
                Some(CacheSize::Slots(slots.max(1)))
            }
            StrategyKind::LayerSplit
            | StrategyKind::Offload
            | StrategyKind::Resident
            | StrategyKind::Cpu => None,
        };
        let base = PredictConfig {
            streams: req.streams,
            context: req.context,
            cache,
            cache_options: cache_options.clone(),
            routing: req.routing.clone(),
            seed: Some(req.seed),
            warmup_steps: req.warmup,
            steps: req.steps,
            ..Default::default()
        };
        let what = match kind {
            StrategyKind::Hybrid => "hybrid's best fetch fraction".to_string(),
            StrategyKind::LayerSplit
            | StrategyKind::LayerSplitCached
            | StrategyKind::Offload
            | StrategyKind::Resident
            | StrategyKind::Cpu => format!("{kind}'s best number of CPU layers"),
        };
        let resolved = resolve::resolve(&StrategyRequest::Given(strategy), model, perf, &base)
            .with_context(|| format!("predicting {what}"))?;
        Ok(resolved.strategy)
    }

    /// Hybrid's best fetch fraction by `perf` for the run (see [`AutoHost::decide`]).
    fn fraction(
        perf: &PerfModel,
        req: &RunRequest,
        model: &ModelSpec,
        slots: usize,
        policy: &CacheOptions,
    ) -> Result<f64> {
        let auto = Strategy::Hybrid {
            fetch: FetchFraction::Auto,
        };
        let s = Self::decide(perf, req, model, auto, slots, policy)?;
        Ok(s.policy(model.geometry.moe_layers)?.fetch_fraction())
    }

    /// The fraction at the speed the host was probed (or specified) at, and where it came from.
    fn resolve(
        &self,
        req: &RunRequest,
        model: &ModelSpec,
        slots: usize,
        policy: &CacheOptions,
    ) -> Result<(f64, String)> {
        let f = Self::fraction(&self.perf, req, model, slots, policy)?;
        Ok((f, self.source_of(&self.perf)))
    }

    /// Layer split's best number of CPU layers by this host's model for the run (`kind` one of
    /// the layer splits), as `ft predict --strategy KIND:auto` finds it.
    fn cpu_layers(
        &self,
        req: &RunRequest,
        model: &ModelSpec,
        kind: StrategyKind,
        slots: usize,
        cache_options: &CacheOptions,
    ) -> Result<(usize, String)> {
        let auto = Strategy::from_parts(kind, None, Some(CpuLayers::Auto));
        let s = Self::decide(&self.perf, req, model, auto, slots, cache_options)?;
        let n = match s.cpu_layers() {
            Some(CpuLayers::Fixed(n)) => n,
            Some(CpuLayers::Auto) | None => {
                bail!("the performance model has no {kind} prediction")
            }
        };
        Ok((n, self.source_of(&self.perf)))
    }

    /// Where an auto fraction decided by `perf` (this host's model, or it rescaled) came from.
    fn source_of(&self, perf: &PerfModel) -> String {
        format!(
            "auto: the performance model of host '{}' ({})",
            self.name, perf.source
        )
    }
}

/// Decide the auto variants' fraction again at the CPU check `now` (taken before the first
/// round), with the host's CPU side scaled by its speed against the probe's check of the same
/// work ([`CheckedSpeed::against`], [`CheckedSpeed::scale`]), as `ft serve` does at
/// start. Leaves them as they are where the host holds no check of this work (logged).
pub fn resolve_auto_at_check(
    host: &AutoHost,
    now: &CpuCheck,
    variants: &mut [Variant],
    req: &RunRequest,
    model: &ModelSpec,
    slots: usize,
    policy: &CacheOptions,
) -> Result<()> {
    let Some(checked) = CheckedSpeed::against(&host.cpu_checks, *now)
        .context("setting the CPU check before the first round against --host's")?
    else {
        tracing::info!(
            threads = now.threads,
            "--host holds no CPU check of this work: the auto fraction stays at the probed speed"
        );
        return Ok(());
    };
    let scaled = checked
        .scale(&host.perf, "before the first round")
        .context("scaling the CPU side by the check before the first round")?;
    let source = host.source_of(&scaled);
    let f = AutoHost::fraction(&scaled, req, model, slots, policy)?;
    tracing::info!("{source}: fetch fraction {f:.3}");
    for v in variants
        .iter_mut()
        .filter(|v| v.auto && v.strategy.kind() == StrategyKind::Hybrid)
    {
        v.fetch = f;
        v.strategy = Strategy::Hybrid {
            fetch: FetchFraction::fixed(v.label.as_str(), f)?,
        };
        v.fetch_source = source.clone();
        v.auto_cpu_speed = Some(checked.speed);
    }
    Ok(())
}

/// One strategy of a run as given: `--strategy` with `--fetch-fraction`, or one item of
/// `--interleave`.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantSpec {
    /// Names the variant's report.
    pub label: String,
    /// The strategy's kind.
    pub kind: StrategyKind,
    /// Hybrid's fetch fraction as given (a number or auto).
    pub fetch: Option<String>,
    /// Layer split's CPU layers as given (a number or auto).
    pub cpu_layers: Option<String>,
    /// The flag it came from, for errors.
    pub flag: &'static str,
}

/// A strategy ready to decode.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Names the variant's report.
    pub label: String,
    /// The strategy, every parameter a number.
    pub strategy: Strategy,
    /// Fetch fraction the plans use.
    pub fetch: f64,
    /// Where it came from (given, auto with its host, the strategy's own).
    pub fetch_source: String,
    /// Hybrid's fraction given as auto (decided by `--host`'s performance model).
    pub auto: bool,
    /// Layer split's CPU layers (`None` for the other strategies).
    pub cpu_layers: Option<usize>,
    /// Whether some layer gathers misses over the link.
    pub gathers: bool,
    /// Whether some layer computes experts on the CPU.
    pub uses_cpu: bool,
    /// The CPU speed against the probe's that an auto fraction was decided at (the check
    /// before the first round), if it was.
    pub auto_cpu_speed: Option<f64>,
}

/// Parse one `--interleave` item: `[LABEL=]STRATEGY[:F]`.
pub fn parse_variant_spec(item: &str) -> Result<VariantSpec> {
    let item = item.trim();
    let (label, rest) = match item.split_once('=') {
        Some((l, r)) => (Some(l.trim()), r.trim()),
        None => (None, item),
    };
    let (kind, param) = match rest.split_once(':') {
        Some((k, f)) => (k.trim(), Some(f.trim().to_string())),
        None => (rest, None),
    };
    let kind: StrategyKind = kind
        .parse()
        .with_context(|| format!("--interleave '{item}'"))?;
    let (fetch, cpu_layers) = match (kind, param) {
        (StrategyKind::Resident, _) => bail!(
            "--interleave '{item}': resident needs an engine of its own (every expert cached); \
             run it with --strategy resident"
        ),
        (StrategyKind::LayerSplit, _) => bail!(
            "--interleave '{item}': layer-split needs an engine of its own (its resident layers' \
             slots); run it with --strategy layer-split:N"
        ),
        (StrategyKind::Hybrid, None) => bail!(
            "--interleave '{item}': hybrid needs its fetch fraction, e.g. hybrid:0.4 or hybrid:auto"
        ),
        (StrategyKind::Hybrid, Some(f)) => (Some(f), None),
        (StrategyKind::LayerSplitCached, None) => bail!(
            "--interleave '{item}': layer-split-cached needs its CPU layers, e.g. \
             layer-split-cached:4"
        ),
        (StrategyKind::LayerSplitCached, Some(n)) => (None, Some(n)),
        (StrategyKind::Offload | StrategyKind::Cpu, Some(_)) => bail!(
            "--interleave '{item}': only hybrid takes a fetch fraction (STRATEGY:F), and \
             layer-split-cached its CPU layers (STRATEGY:N)"
        ),
        (StrategyKind::Offload | StrategyKind::Cpu, None) => (None, None),
    };
    let label = label.map_or_else(|| kind.to_string(), str::to_string);
    if label.is_empty()
        || !label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bail!("--interleave '{item}': a label is letters, digits, '-', '_' or '.'");
    }
    Ok(VariantSpec {
        label,
        kind,
        fetch,
        cpu_layers,
        flag: "--interleave",
    })
}

/// The run's strategies as given: one from `--strategy`, or the `--interleave` list (labels
/// distinct).
pub fn variant_specs(req: &RunRequest) -> Result<Vec<VariantSpec>> {
    if req.interleave.is_empty() {
        let given = req.strategy.as_deref().unwrap_or_default();
        let (name, param) = match given.split_once(':') {
            Some((k, p)) => (k, Some(p.to_string())),
            None => (given, None),
        };
        let kind: StrategyKind = name.parse().context("--strategy")?;
        let (fetch, cpu_layers, flag) = match (kind, param) {
            (StrategyKind::Hybrid, Some(_)) if req.fetch_fraction.is_some() => bail!(
                "--strategy {given}: give hybrid's fetch fraction once (hybrid:F or \
                 --fetch-fraction F)"
            ),
            (StrategyKind::Hybrid, Some(f)) => (Some(f), None, "--strategy"),
            (StrategyKind::LayerSplit | StrategyKind::LayerSplitCached, n) => (
                req.fetch_fraction.clone(),
                Some(n.unwrap_or_else(|| "auto".into())),
                "--strategy",
            ),
            (StrategyKind::Offload | StrategyKind::Resident | StrategyKind::Cpu, Some(p)) => {
                bail!("--strategy {given}: {kind} takes no parameter (got '{p}')")
            }
            (
                StrategyKind::Hybrid
                | StrategyKind::Offload
                | StrategyKind::Resident
                | StrategyKind::Cpu,
                None,
            ) => (req.fetch_fraction.clone(), None, "--fetch-fraction"),
        };
        return Ok(vec![VariantSpec {
            label: kind.to_string(),
            kind,
            fetch,
            cpu_layers,
            flag,
        }]);
    }
    let specs = req
        .interleave
        .iter()
        .map(|i| parse_variant_spec(i))
        .collect::<Result<Vec<_>>>()?;
    for (i, a) in specs.iter().enumerate() {
        if specs[..i].iter().any(|b| b.label == a.label) {
            bail!(
                "--interleave: two variants are labelled '{}'; label them (LABEL=STRATEGY)",
                a.label
            );
        }
    }
    Ok(specs)
}

/// Resolve a variant's fetch fraction and CPU layers (`auto` by the performance model of
/// `--host`, read into `auto_host` at the first variant that needs it).
pub fn resolve_variant(
    req: &RunRequest,
    spec: &VariantSpec,
    model: &ModelSpec,
    cache_slots: usize,
    policy: &CacheOptions,
    auto_host: &mut Option<AutoHost>,
    notes: &mut Vec<String>,
) -> Result<Variant> {
    let host = |slot: &mut Option<AutoHost>| -> Result<()> {
        if slot.is_none() {
            *slot = Some(AutoHost::of_request(req)?);
        }
        Ok(())
    };
    let (strategy, fetch_source, auto) = match spec.kind {
        StrategyKind::Hybrid => match spec.fetch.as_deref() {
            None => bail!("hybrid needs --fetch-fraction F (0 to 1) or auto"),
            Some(s) => match FetchFraction::parse(spec.flag, s)? {
                FetchFraction::Fixed(f) => (
                    Strategy::Hybrid {
                        fetch: FetchFraction::Fixed(f),
                    },
                    "given".to_string(),
                    false,
                ),
                FetchFraction::Auto => {
                    host(auto_host)?;
                    let h = auto_host.as_ref().expect("read above");
                    let (f, source) = h.resolve(req, model, cache_slots, policy)?;
                    (
                        Strategy::Hybrid {
                            fetch: FetchFraction::fixed(spec.flag, f)?,
                        },
                        source,
                        true,
                    )
                }
            },
        },
        StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => {
            let given = spec.cpu_layers.as_deref().unwrap_or("auto");
            let field = format!("{} {}'s CPU layers", spec.flag, spec.kind);
            let (n, source) = match CpuLayers::parse(&field, given)? {
                CpuLayers::Fixed(n) => (n, "given".to_string()),
                CpuLayers::Auto => {
                    host(auto_host)?;
                    let h = auto_host.as_ref().expect("read above");
                    h.cpu_layers(req, model, spec.kind, cache_slots, policy)?
                }
            };
            if n > model.geometry.moe_layers {
                bail!(
                    "{field}: {n} is more than the run's {} MoE layers",
                    model.geometry.moe_layers
                );
            }
            if spec.fetch.is_some() {
                notes.push(format!(
                    "--fetch-fraction ignored: {}'s cached layers gather every miss",
                    spec.kind
                ));
            }
            (
                Strategy::from_parts(spec.kind, None, Some(CpuLayers::Fixed(n))),
                format!("{n} CPU layers: {source}"),
                false,
            )
        }
        StrategyKind::Offload | StrategyKind::Resident | StrategyKind::Cpu => {
            if spec.fetch.is_some() {
                notes.push(format!(
                    "--fetch-fraction ignored: {} has a fixed fraction",
                    spec.kind
                ));
            }
            (
                Strategy::from_kind(spec.kind, None),
                "strategy".into(),
                false,
            )
        }
    };
    let layers = model.geometry.moe_layers;
    let placement = strategy
        .policy(layers)
        .with_context(|| format!("{} {}", spec.flag, spec.label))?;
    let fetch = placement.fetch_fraction();
    let cached = placement.cpu_layers < layers;
    let (gathers, cached_cpu) = match placement.rest {
        LayerPlacement::Cached { fetch_fraction } => (
            cached && fetch_fraction > 0.0,
            cached && fetch_fraction < 1.0,
        ),
        LayerPlacement::Resident | LayerPlacement::CpuOnly => (false, false),
    };
    Ok(Variant {
        label: spec.label.clone(),
        strategy,
        fetch,
        fetch_source,
        auto,
        auto_cpu_speed: None,
        cpu_layers: strategy.cpu_layers().map(|_| placement.cpu_layers),
        // Resident runs on a cache that holds every expert: nothing to gather.
        gathers: gathers && spec.kind != StrategyKind::Resident,
        uses_cpu: cached_cpu || placement.cpu_layers > 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleave_items_parse_with_labels_and_parameters() {
        let v = parse_variant_spec(" fast = hybrid:0.35 ").unwrap();
        assert_eq!(v.label, "fast");
        assert_eq!(v.kind, StrategyKind::Hybrid);
        assert_eq!(v.fetch.as_deref(), Some("0.35"));
        assert_eq!(v.cpu_layers, None);
        let v = parse_variant_spec("layer-split-cached:4").unwrap();
        assert_eq!(v.label, "layer-split-cached");
        assert_eq!(v.cpu_layers.as_deref(), Some("4"));
        let v = parse_variant_spec("offload").unwrap();
        assert_eq!(
            (v.label.as_str(), v.fetch, v.cpu_layers),
            ("offload", None, None)
        );
    }

    #[test]
    fn interleave_items_that_cannot_share_an_engine_are_refused_by_name() {
        for (item, says) in [
            ("resident", "--strategy resident"),
            ("layer-split:3", "--strategy layer-split:N"),
            ("hybrid", "hybrid:0.4"),
            ("layer-split-cached", "layer-split-cached:4"),
            ("offload:0.5", "only hybrid takes a fetch fraction"),
            ("a b=offload", "a label is letters"),
        ] {
            let e = parse_variant_spec(item).unwrap_err().to_string();
            assert!(e.contains(item.trim()) && e.contains(says), "{item}: {e}");
        }
    }
}
