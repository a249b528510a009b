//! The reference engine's bandwidth profile (`benchbw.json`, version 4; schema in
//! `docs/probe.md`) written with this model's decision: per expert format, the verdict and
//! fetch fraction are the performance model's, encoded in the fields the reference engine
//! reads (`ft probe --export-freetoken`), so that the engine, reading them as usual, does
//! what the model decided. An existing file keeps its other formats' entries.

use std::path::Path;

use serde::Serialize;

use crate::cache::CacheOptions;
use crate::error::{ModelError, Result};
use crate::perf::legacy::{fraction_q16, BenchBw, LegacyRatio, FRACTION_ONE};
use crate::perf::predict::PredictConfig;
use crate::perf::{decide, predict, Decision, ExpertShape, Prediction};
use crate::profile::Profile;
use crate::{CacheSize, ModelSpec, StrategyKind};

/// The reference engine's profile layout version this module writes.
pub const FREETOKEN_VERSION: u32 = 4;

/// Smallest share of the contended pair given to the side the model's fraction leaves
/// empty (see [`encode_fraction`]): small enough that the Q16 fraction the reference engine
/// derives rounds to exactly 0 or 1 of the link, positive so that it derives one at all.
pub const EXPORT_MIN_SHARE: f64 = 1e-6;

/// The reference engine's key for an expert format (read and written alike).
pub use crate::calibrate::host_inputs::freetoken_format_key;

/// The reference engine's backend name of a strategy (`resident` is its `fused`).
pub fn freetoken_backend(kind: StrategyKind) -> &'static str {
    match kind {
        StrategyKind::Offload => "offload",
        StrategyKind::Hybrid => "hybrid",
        StrategyKind::Cpu => "cpu",
        StrategyKind::Resident => "fused",
        // The reference engine places every layer alike; the export's prediction leaves
        // layer split out (`PredictConfig::layer_split` is `None`), so it never chooses one.
        StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => "offload",
    }
}

/// The contended pair `(cpu, pcie)` in GB/s whose reference-engine fraction
/// `pcie / (pcie + cpu)` is `fraction`, with the measured contended total `total_gbs`
/// between them. A side left empty gets [`EXPORT_MIN_SHARE`] of the total (the reference
/// engine derives no fraction from a zero), and a fraction below one Q16 step is raised to
/// it: the reference engine reads a Q16 fraction of 0 as "none configured", which fetches
/// every miss.
pub fn encode_fraction(fraction: f64, total_gbs: f64) -> (f64, f64) {
    let min_q16 = 1.0 / FRACTION_ONE as f64;
    let f = fraction.clamp(min_q16, 1.0 - EXPORT_MIN_SHARE);
    ((1.0 - f) * total_gbs, f * total_gbs)
}

/// The served geometry in an export entry.
#[derive(Debug, Clone, Serialize)]
pub struct ExportExpert {
    /// Expert format (ft's name).
    pub format: String,
    /// Model width, elements.
    pub hidden: usize,
    /// Expert FFN width, elements.
    pub intermediate: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// MoE layers.
    pub moe_layers: usize,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
}

/// The bandwidths measured at the served geometry (top-k experts, one token, the serving
/// threads), GB/s, and where each came from.
#[derive(Debug, Clone, Serialize)]
pub struct ServedBandwidths {
    /// CPU-MoE alone.
    pub cpu_moe_gbs: f64,
    /// PCIe gather alone.
    pub pcie_gather_gbs: f64,
    /// CPU-MoE while a gather runs.
    pub cpu_moe_overlap_gbs: f64,
    /// PCIe gather while the CPU kernel runs.
    pub pcie_gather_overlap_gbs: f64,
    /// `measured` (probe samples) or `modelled` (fitted model, a point was not probed).
    pub source: String,
}

/// One format's entry of `dtype_kernels`: the reference engine's fields first
/// (`cpu_moe_gbs`, `pcie_gather_gbs`, `cpu_moe_overlap_gbs`, `pcie_gather_overlap_gbs`,
/// `recommended`), then what its bench also writes (`ratio`, `verdict`, `fetch_fraction`),
/// then ft's own (ignored by the reference engine's reader).
#[derive(Debug, Clone, Serialize)]
pub struct ExportEntry {
    /// CPU-MoE bandwidth alone at the served geometry, GB/s (measured).
    pub cpu_moe_gbs: f64,
    /// PCIe-gather bandwidth alone at the served geometry, GB/s (measured).
    pub pcie_gather_gbs: f64,
    /// The contended CPU-MoE bandwidth, re-split to carry the model's fraction, GB/s.
    pub cpu_moe_overlap_gbs: f64,
    /// The contended PCIe-gather bandwidth, re-split to carry the model's fraction, GB/s.
    pub pcie_gather_overlap_gbs: f64,
    /// The model's verdict (reference engine backend name).
    pub recommended: String,
    /// `cpu_moe_gbs / pcie_gather_gbs` (informational; the verdict is not the ratio's).
    pub ratio: f64,
    /// The model's verdict (same as `recommended`).
    pub verdict: String,
    /// The model's fetch fraction (hybrid: share of each layer's misses over the link;
    /// 1 for offload and fused, 0 for cpu).
    pub fetch_fraction: f64,
    /// The Q16 fraction the reference engine derives from the contended pair.
    pub fetch_fraction_q16: u64,
    /// The served geometry.
    pub expert: ExportExpert,
    /// The bandwidths as measured (the contended pair before re-splitting).
    pub measured: ServedBandwidths,
    /// The legacy bench at its tuning geometry (measured by the probes), if probed.
    pub bench: Option<BenchBw>,
    /// The legacy rule's verdict at the tuning geometry.
    pub legacy_verdict: Option<String>,
    /// Who decided.
    pub decided_by: String,
    /// The prediction behind the decision: streams, context, cache, tok/s per strategy.
    pub decision: ExportDecision,
}

/// The prediction behind an exported verdict.
#[derive(Debug, Clone, Serialize)]
pub struct ExportDecision {
    /// Streams.
    pub streams: usize,
    /// Context, tokens.
    pub context: usize,
    /// Expert cache slots.
    pub cache_slots: usize,
    /// Predicted total tok/s per feasible strategy.
    pub tok_s_total: std::collections::BTreeMap<String, f64>,
    /// Margin over the runner-up (relative).
    pub margin: f64,
    /// True when the choice and the runner-up's intervals overlap.
    pub near_tie: bool,
}

/// Which GPU the profile describes (the reference engine's `gpu`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExportGpu {
    /// Device ordinal.
    pub index: u32,
    /// Name as the driver reports it (the reference engine refuses a profile of another).
    pub name: String,
    /// UUID (not known to ft: null, which the reference engine accepts).
    pub uuid: Option<String>,
}

/// The measured bandwidths at the served geometry (samples where probed, else the model).
pub fn served_bandwidths(profile: &Profile, model: &ModelSpec) -> ServedBandwidths {
    let s = &profile.samples;
    let k = model.geometry.top_k as u32;
    let b = model.expert_bytes() as f64;
    let same = |x: f64| (x - b).abs() < 0.5;
    let threads = s
        .cpu_step
        .iter()
        .map(|c| c.threads)
        .max()
        .unwrap_or(profile.params.cpu_threads);
    let ct = s
        .gather
        .iter()
        .filter_map(|g| g.contended_cpu_threads)
        .max()
        .unwrap_or(threads);
    let gbs = |us: f64| k as f64 * b / (us * 1e3);
    let gather = |c: Option<u32>| {
        s.gather
            .iter()
            .find(|g| g.experts == k && same(g.expert_bytes) && g.contended_cpu_threads == c)
            .map(|g| gbs(g.time_us))
    };
    let cpu = |contended: bool| {
        s.cpu_step
            .iter()
            .find(|c| {
                c.experts == k
                    && c.tokens_per_expert == 1
                    && c.threads == threads
                    && same(c.expert_bytes)
                    && c.contended == contended
            })
            .map(|c| gbs(c.time_us))
    };
    match (cpu(false), gather(None), cpu(true), gather(Some(ct))) {
        (Some(c), Some(p), Some(co), Some(po)) => ServedBandwidths {
            cpu_moe_gbs: c,
            pcie_gather_gbs: p,
            cpu_moe_overlap_gbs: co,
            pcie_gather_overlap_gbs: po,
            source: "measured".into(),
        },
        _ => {
            let m = BenchBw::modelled_at(&profile.params, ExpertShape::of(model), k);
            ServedBandwidths {
                cpu_moe_gbs: m.cpu_moe_gbs,
                pcie_gather_gbs: m.pcie_gather_gbs,
                cpu_moe_overlap_gbs: m.cpu_moe_overlap_gbs.unwrap_or(m.cpu_moe_gbs),
                pcie_gather_overlap_gbs: m.pcie_gather_overlap_gbs.unwrap_or(m.pcie_gather_gbs),
                source: "modelled".into(),
            }
        }
    }
}

/// The model's verdict and fraction of a prediction: the best feasible strategy.
pub fn verdict_of(pred: &Prediction, decision: &Decision) -> (StrategyKind, f64) {
    let kind = decision.kind;
    let f = match kind {
        StrategyKind::Hybrid => pred.get(StrategyKind::Hybrid).fetch_fraction,
        StrategyKind::Cpu => 0.0,
        _ => 1.0,
    };
    (kind, f)
}

/// Build (and merge into `existing`, a previous file's JSON) the reference engine's profile
/// for one format. Returns the document and the entry written.
#[allow(clippy::too_many_arguments)]
pub fn freetoken_document(
    existing: Option<serde_json::Value>,
    model: &ModelSpec,
    profile: &Profile,
    gpu: &ExportGpu,
    pred: &Prediction,
    decision: &Decision,
    threshold: f64,
) -> Result<(serde_json::Value, ExportEntry)> {
    use serde_json::{json, Value};
    let (kind, fraction) = verdict_of(pred, decision);
    let measured = served_bandwidths(profile, model);
    let total = measured.cpu_moe_overlap_gbs + measured.pcie_gather_overlap_gbs;
    let (cpu_ov, pcie_ov) = encode_fraction(fraction, total);
    let q16 = fraction_q16(pcie_ov / (pcie_ov + cpu_ov));
    let g = model.geometry;
    let legacy = profile
        .bench_bw
        .map(|b| LegacyRatio::from_bench(&b, threshold));
    let entry = ExportEntry {
        cpu_moe_gbs: measured.cpu_moe_gbs,
        pcie_gather_gbs: measured.pcie_gather_gbs,
        cpu_moe_overlap_gbs: cpu_ov,
        pcie_gather_overlap_gbs: pcie_ov,
        recommended: freetoken_backend(kind).into(),
        ratio: measured.cpu_moe_gbs / measured.pcie_gather_gbs,
        verdict: freetoken_backend(kind).into(),
        fetch_fraction: fraction,
        fetch_fraction_q16: q16,
        expert: ExportExpert {
            format: model.format.name().into(),
            hidden: g.hidden,
            intermediate: g.intermediate,
            experts: g.experts,
            top_k: g.top_k,
            moe_layers: g.moe_layers,
            expert_bytes: model.expert_bytes(),
        },
        measured,
        bench: profile.bench_bw,
        legacy_verdict: legacy.map(|l| l.verdict.name().to_string()),
        decided_by: format!(
            "ft {} performance model (ft probe profile of {})",
            env!("CARGO_PKG_VERSION"),
            profile.key.host.gpu_name
        ),
        decision: ExportDecision {
            streams: pred.config.streams,
            context: pred.config.context,
            cache_slots: pred.cache_slots,
            tok_s_total: pred
                .strategies
                .iter()
                .filter(|s| s.feasible)
                .map(|s| (s.strategy.to_string(), s.tok_s_total))
                .collect(),
            margin: decision.margin,
            near_tie: decision.near_tie,
        },
    };
    let key = freetoken_format_key(model.format);
    let mut doc = match existing {
        Some(Value::Object(m)) => Value::Object(m),
        _ => json!({}),
    };
    let obj = doc.as_object_mut().expect("an object");
    let same_gpu = obj
        .get("gpu")
        .and_then(|g| g.get("name"))
        .and_then(Value::as_str)
        .is_none_or(|n| n == gpu.name);
    if !same_gpu {
        // Another card's numbers are worse than none: start over rather than mix.
        tracing::warn!("the existing profile describes another GPU; its entries are dropped");
        obj.clear();
    }
    obj.insert("version".into(), json!(FREETOKEN_VERSION));
    obj.insert("threshold".into(), json!(threshold));
    obj.insert("gpu".into(), serde_json::to_value(gpu).map_err(json_error)?);
    for section in ["dtypes", "dtype_kernels", "workloads"] {
        if !obj.get(section).is_some_and(Value::is_object) {
            obj.insert(section.into(), json!({}));
        }
    }
    obj["dtypes"][key] = json!(freetoken_backend(kind));
    obj["dtype_kernels"][key] = serde_json::to_value(&entry).map_err(json_error)?;
    obj.insert(
        "ft".into(),
        json!({
            "program_version": env!("CARGO_PKG_VERSION"),
            "profile_key": profile.key,
            "profile_created_unix_s": profile.created_unix_s,
            "note": "verdicts and fetch fractions are ft's performance model's; see docs/probe.md",
        }),
    );
    Ok((doc, entry))
}
/// A JSON conversion of the document failed (it holds only numbers and strings).
fn json_error(e: serde_json::Error) -> ModelError {
    ModelError::Json {
        path: "benchbw.json".into(),
        message: e.to_string(),
    }
}

/// The decision an export writes: predicted at these streams, context and cache.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    /// Streams the decision is made for.
    pub streams: usize,
    /// Context the decision is made for, tokens.
    pub context: usize,
    /// Expert cache (default: what the GPU holds).
    pub cache: Option<CacheSize>,
    /// The cache's policy, topology and admission.
    pub cache_options: CacheOptions,
    /// Threshold of the legacy ratio rule (reported beside the model, written to the file).
    pub threshold: f64,
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportSummary {
    /// The file.
    pub path: String,
    /// The format key in the reference engine's profile.
    pub format_key: String,
    /// The model's verdict, in the reference engine's backend names.
    pub verdict: String,
    /// The model's fetch fraction (hybrid's share of misses over the link).
    pub fetch_fraction: f64,
    /// The same fraction in Q16, as the reference engine will derive it.
    pub fetch_fraction_q16: u64,
    /// The legacy rule's verdict on the same host.
    pub legacy_verdict: String,
}

/// Decide for `model` on `profile` as `req` says and write the reference engine's profile
/// to `out` atomically, merged into the file already there (a file that is not JSON is
/// replaced, with a warning).
pub fn export(
    model: &ModelSpec,
    profile: &Profile,
    gpu: &ExportGpu,
    req: &ExportRequest,
    out: &Path,
) -> Result<ExportSummary> {
    let config = PredictConfig {
        streams: req.streams,
        context: req.context,
        cache: req.cache,
        cache_options: req.cache_options.clone(),
        threshold: req.threshold,
        bench: profile.bench_bw,
        ..PredictConfig::default()
    };
    let perf = profile.perf_model("ft probe profile");
    let pred = predict(model, &perf, &config)?;
    let decision = decide(&pred);
    let existing = match std::fs::read_to_string(out) {
        Ok(text) => match serde_json::from_str(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(path = %out.display(), "not JSON ({e}); it is replaced");
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(ModelError::Io {
                path: out.display().to_string(),
                source,
            })
        }
    };
    let (doc, entry) = freetoken_document(
        existing,
        model,
        profile,
        gpu,
        &pred,
        &decision,
        req.threshold,
    )?;
    let bytes = serde_json::to_vec_pretty(&doc).map_err(json_error)?;
    crate::profile::write_atomic(out, &bytes)?;
    Ok(ExportSummary {
        path: out.display().to_string(),
        format_key: freetoken_format_key(model.format).into(),
        verdict: entry.verdict,
        fetch_fraction: entry.fetch_fraction,
        fetch_fraction_q16: entry.fetch_fraction_q16,
        legacy_verdict: pred.legacy.verdict.name().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;
    use crate::ExpertFormat;

    fn gpu() -> ExportGpu {
        ExportGpu {
            index: 0,
            name: "NVIDIA GeForce RTX 4090".into(),
            uuid: None,
        }
    }

    #[test]
    fn format_keys_follow_the_reference_engine() {
        for f in ExpertFormat::ALL {
            assert_eq!(
                freetoken_format_key(f),
                ferrox_core::bench_profile::bench_format(f.name()),
                "{f}"
            );
        }
    }

    /// The encoded pair gives back the fraction through the reference engine's own rule and
    /// Q16 rounding, for fractions across [0, 1] including both ends.
    #[test]
    fn the_encoded_pair_carries_the_fraction_through_the_reference_rule() {
        for i in 0..=200 {
            let f = i as f64 / 200.0;
            let (c, p) = encode_fraction(f, 37.5);
            assert!((c + p - 37.5).abs() < 1e-9);
            let back =
                ferrox_core::qstar::fetch_fraction_from_overlap(c, p).expect("both positive");
            let policy = ferrox_core::qstar::QStarPolicy::from_fraction(back);
            let want = fraction_q16(f).max(1);
            assert_eq!(policy.fraction_q16(), want, "f = {f}");
            // The split of misses is the one ft's planner makes at the same fraction.
            for m in 0..=40usize {
                let fq = want as f64 / FRACTION_ONE as f64;
                assert_eq!(
                    policy.split(m).fetch,
                    crate::plan::fetch_count(fq, m),
                    "f = {f}, m = {m}"
                );
            }
        }
        // Zero stays "fetch nothing", never the reference engine's unconfigured default.
        let (c, p) = encode_fraction(0.0, 10.0);
        let q = ferrox_core::qstar::QStarPolicy::from_fraction(p / (p + c));
        assert_eq!(q.split(12).fetch, 0);
    }

    /// The document parses as the reference engine's profile, names the model's verdict,
    /// yields the model's fraction, and keeps another format's entry.
    #[test]
    fn the_document_is_read_by_the_reference_engine_as_the_model_decided() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let p = test_profile(&model, Some((33.4, 12.8)));
        assert_eq!(p.params.cpu_threads, 24);
        let config = PredictConfig {
            streams: 2,
            steps: 60,
            warmup_steps: 30,
            bench: p.bench_bw,
            cache: Some(CacheSize::Slots(4000)),
            ..PredictConfig::default()
        };
        let pred = predict(&model, &p.perf_model("test"), &config).unwrap();
        let decision = decide(&pred);
        let existing = serde_json::json!({
            "version": 4,
            "gpu": {"name": "NVIDIA GeForce RTX 4090"},
            "dtypes": {"bf16": "offload"},
            "dtype_kernels": {"bf16": {"cpu_moe_gbs": 10.0, "pcie_gather_gbs": 20.0}},
        });
        let (doc, entry) =
            freetoken_document(Some(existing), &model, &p, &gpu(), &pred, &decision, 2.0).unwrap();
        let read: ferrox_core::qstar::BandwidthProfile =
            serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(read.version, Some(4));
        assert!(read.matches_gpu(Some("NVIDIA GeForce RTX 4090")));
        let want = match decision.kind {
            StrategyKind::Offload => ferrox_core::qstar::MoeBackend::Offload,
            StrategyKind::Hybrid => ferrox_core::qstar::MoeBackend::Hybrid,
            StrategyKind::Cpu => ferrox_core::qstar::MoeBackend::Cpu,
            StrategyKind::Resident => ferrox_core::qstar::MoeBackend::Fused,
            StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => {
                unreachable!("the export's prediction leaves layer split out")
            }
        };
        assert_eq!(read.backend_for("nvfp4"), Some(want));
        let (_, f) = verdict_of(&pred, &decision);
        assert_eq!(
            read.policy_for("nvfp4").fraction_q16(),
            fraction_q16(f).max(1)
        );
        assert_eq!(entry.fetch_fraction_q16, fraction_q16(f).max(1));
        // The other format's entry is kept.
        assert_eq!(
            read.backend_for("bf16"),
            Some(ferrox_core::qstar::MoeBackend::Offload)
        );
        assert_eq!(
            doc["dtype_kernels"]["nvfp4"]["expert"]["expert_bytes"],
            2_772_480
        );
        // With no samples the served bandwidths are the model's.
        assert_eq!(entry.measured.source, "modelled");
        // Another GPU's file is not mixed with this one's.
        let other = serde_json::json!({"gpu": {"name": "Other"}, "dtypes": {"bf16": "hybrid"}});
        let (doc, _) =
            freetoken_document(Some(other), &model, &p, &gpu(), &pred, &decision, 2.0).unwrap();
        assert!(doc["dtypes"].get("bf16").is_none());
    }
}
