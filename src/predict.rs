//! `ft predict`: the analytic model's decode tok/s for every strategy on a host, with
//! intervals, the bounding resource, the time per token split by resource, the choice and
//! its margin, and the legacy ratio's verdict beside it.
//!
//! Defaults answer the field report: its host (`rtx4090-2x-xeon4310`) and model
//! (`qwen3.8-flash-next`). Parameters come from a host spec (a preset or a TOML file,
//! through the one mapping `PerfParams::from_host`) or from a fitted profile (`--profile`).
//! The plan, the prediction and the `--json` document are `ft_model::report`'s; this
//! command reads the flags and prints the table.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

use ft_model::cache::CacheSize;
use ft_model::perf::predict::{MissMode, PredictConfig};
use ft_model::perf::prefill::MeasureSpec;
use ft_model::perf::{Decision, Prediction, Resource};
use ft_model::report::{HostInput, HostModel, PredictPlan};
use ft_model::{CpuLayers, FetchFraction, ModelSpec, StrategyKind};
use ft_runtime::device::DeviceKind;

/// The model of the field report, the default `--model`.
pub const DEFAULT_MODEL: &str = "qwen3.8-flash-next";

/// Arguments shared by `ft predict` and `ft explain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a preset name, a model TOML file, a Hugging Face config.json or a GGUF file
    /// (default: with a profile, the model it was
    /// probed for; else qwen3.8-flash-next). A profile probed for another model is refused.
    #[arg(long)]
    pub model: Option<String>,
    /// Host: a preset (see `ft simulate --help`), a host TOML file or a profile JSON (a
    /// `.json` file is read as `--profile`).
    #[arg(long, default_value = ft_model::hosts::DEFAULT_HOST, conflicts_with = "profile")]
    pub host: String,
    /// A fitted profile (JSON, as `ft probe` writes it) instead of a host spec.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Concurrent streams.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// Context length of each stream, in tokens.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Expert cache slots (default: what the GPU holds after dense weights, KV and reserve).
    #[arg(long, conflicts_with_all = ["cache_gb", "miss_rate"])]
    pub cache_slots: Option<usize>,
    /// Expert cache size in GiB.
    #[arg(long, conflicts_with = "miss_rate")]
    pub cache_gb: Option<f64>,
    /// Offload's miss rate (0 to 1) instead of the GPU's cache: the cache is sized so that
    /// offload misses this rate; the other strategies' rates follow from that cache.
    #[arg(long)]
    pub miss_rate: Option<f64>,
    /// Routing preset (uniform, mild, typical, skewed), process TOML or trace file.
    #[arg(long, default_value = "typical")]
    pub routing: String,
    /// The cache's policy, topology and admission.
    #[command(flatten)]
    pub cache_args: crate::cache_args::CacheArgs,
    /// Hybrid's fetch fraction: auto (the model's optimum) or a number in [0, 1].
    #[arg(long, default_value = "auto")]
    pub fetch_fraction: String,
    /// Layer split's CPU layers (the first N layers' experts on the CPU, llama.cpp's
    /// `--n-cpu-moe N`): auto (the model's optimum among those whose other layers fit the
    /// GPU) or a number of layers.
    #[arg(long, default_value = "auto")]
    pub cpu_layers: String,
    /// Threshold of the legacy ratio rule.
    #[arg(long, default_value_t = ft_model::perf::legacy::DEFAULT_THRESHOLD)]
    pub threshold: f64,
    /// Counted steps of the traffic simulation behind the miss rates.
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// Warm-up steps before counting.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Seed replacing the routing process's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The host's CPU side at this multiple of the speed its profile or spec gives (rates
    /// times it, fixed costs divided by it; the link, the GPU and DRAM as they are): a
    /// what-if, or a speed measured elsewhere, e.g. the `auto_cpu_speed` of an `ft run`
    /// report or a same-run STREAM read over the probe's. 1 = as given.
    #[arg(long, default_value_t = 1.0)]
    pub cpu_speed: f64,
    /// Time the CPU side here and now (the CPU check: one layer of top_k experts at one
    /// token, from a bank of the model filled on DEVICE's host memory, `cuda` or `host`,
    /// with the profile's threads) and predict with the CPU side at its speed against the
    /// profile's own check of the same work, as `ft serve` does at start. Needs --profile
    /// from a probe that kept its checks. Taken here, without an engine, the check has run 6
    /// to 9% faster than an engine's check of the same work seconds later (the validation
    /// grids of 2026-12-05T16Z): where a run or a server follows, the speed its own engine
    /// checks (`ft run --fetch-fraction auto --host PROFILE`, `ft serve`) is the one to use.
    #[arg(
        long,
        value_name = "DEVICE",
        requires = "profile",
        conflicts_with = "cpu_speed"
    )]
    pub cpu_check: Option<String>,
    /// What tok/s measures: decode (decode steps only), server-gen (the server's generation
    /// rate, other streams' prefills in it) or client-e2e (a client's output tokens over the
    /// whole request, prefill included); `docs/calibrate.md`.
    #[arg(long, default_value = "decode")]
    pub measure: ft_model::observe::Measure,
    /// Prompt tokens per request (for --measure server-gen and client-e2e).
    #[arg(long, default_value_t = 1200)]
    pub prompt_tokens: usize,
    /// Output tokens per request (for --measure server-gen and client-e2e).
    #[arg(long, default_value_t = 256)]
    pub output_tokens: usize,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The resolved plan of a prediction (`ft_model::report`).
pub type Plan = PredictPlan;

impl Args {
    /// Every input-derived size against its documented limit (`ft_model::limits`).
    fn check_limits(&self) -> Result<()> {
        use ft_model::limits;
        limits::check_streams("--streams", self.streams as u64)?;
        limits::check_steps("--steps", self.steps as u64)?;
        limits::check_steps("--warmup", self.warmup as u64)?;
        limits::check_context("--context", self.context as u64)?;
        if let Some(slots) = self.cache_slots {
            limits::check_cache_slots("--cache-slots", slots as u64)?;
        }
        if let Some(g) = self.cache_gb {
            if !(g.is_finite() && g > 0.0) {
                anyhow::bail!("--cache-gb {g}: not a positive size in GiB");
            }
        }
        for (flag, v) in [
            ("--threshold", self.threshold),
            ("--cpu-speed", self.cpu_speed),
        ] {
            if !(v.is_finite() && v > 0.0) {
                anyhow::bail!("{flag} {v}: not a positive number");
            }
        }
        Ok(())
    }

    /// Resolve the arguments into a plan before any work.
    pub fn plan(&self) -> Result<Plan> {
        self.check_limits()?;
        let input = HostInput::from_flags(&self.host, self.profile.as_deref());
        let profile = input.read_profile()?;
        let model = match (&self.model, &profile) {
            (Some(m), _) => ModelSpec::resolve(m).with_context(|| format!("--model {m}"))?,
            (None, Some(p)) => p.probed_model(),
            (None, None) => ModelSpec::resolve(DEFAULT_MODEL)?,
        };
        let mut host = HostModel::resolve(&input, profile.as_ref(), &model)?;
        if let (Some(device), Some(p)) = (&self.cpu_check, &profile) {
            let kind: DeviceKind = device
                .parse()
                .with_context(|| format!("--cpu-check {device}"))?;
            let c = ft_runtime::cpu_check::check_against_profile(kind, p, &model)
                .context("--cpu-check")?;
            host = host.at_checked_speed(c).context("--cpu-check")?;
        }
        let host = host
            .at_given_speed(self.cpu_speed, "--cpu-speed")
            .context("--cpu-speed")?;
        let bench = host.bench;
        let miss = match self.miss_rate {
            Some(r) => MissMode::FixedOffload { miss_rate: r },
            None => MissMode::Simulated,
        };
        let cache = match (self.cache_slots, self.cache_gb) {
            (Some(n), _) => Some(CacheSize::Slots(n)),
            (_, Some(g)) => Some(CacheSize::GiB(g)),
            _ => None,
        };
        let size_flag = [
            (self.cache_slots.is_some(), "--cache-slots"),
            (self.cache_gb.is_some(), "--cache-gb"),
            (self.miss_rate.is_some(), "--miss-rate"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag));
        let config = PredictConfig {
            streams: self.streams,
            context: self.context,
            cache,
            cache_options: self.cache_args.options(size_flag)?,
            routing: self.routing.clone(),
            seed: self.seed,
            warmup_steps: self.warmup,
            steps: self.steps,
            miss,
            hybrid_fetch: FetchFraction::parse("--fetch-fraction", &self.fetch_fraction)?,
            layer_split: Some(CpuLayers::parse("--cpu-layers", &self.cpu_layers)?),
            threshold: self.threshold,
            confidence: ft_model::perf::predict::DEFAULT_CONFIDENCE,
            bench,
        };
        let mut plan = PredictPlan::new(model, host, config)?;
        plan.warn_if_cache_exceeds_gpu();
        Ok(plan)
    }

    /// What tok/s measures (`--measure`, `--prompt-tokens`, `--output-tokens`).
    pub fn measure_spec(&self) -> MeasureSpec {
        MeasureSpec {
            measure: self.measure,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

/// Run `ft predict`.
pub fn run(args: Args) -> Result<()> {
    let plan = args.plan()?;
    let report = plan.report(&args.measure_spec()).context("prediction")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        // Through a `Value`, as `ft predict --json` has always printed it (keys sorted).
        serde_json::to_writer_pretty(&mut out, &serde_json::to_value(&report)?)?;
        writeln!(out)?;
    } else {
        let (pred, flips) = (&report.prediction, &report.break_evens);
        write_table(&mut out, &plan, pred, &report.decision)?;
        for m in report.measure.iter().flatten() {
            let e = &m.end_to_end;
            writeln!(
                out,
                "{} ({} prompt, {} output tokens): {:<22} {:>7.2} tok/s per stream, ttft {:.2} s (prefill {:.2} s, {}-bound)",
                args.measure,
                e.spec.prompt_tokens,
                e.spec.output_tokens,
                m.strategy,
                e.tok_s_per_stream,
                e.ttft_us / 1e6,
                e.prefill_us / 1e6,
                m.prefill_bound
            )?;
        }
        writeln!(
            out,
            "break-evens (where the choice flips, the rest held; the cache as it is):"
        )?;
        write!(out, "{}", flips.text)?;
    }
    Ok(())
}

/// The header line describing what was predicted.
pub fn header(plan: &Plan, pred: &Prediction) -> String {
    plan.header(pred)
}

fn write_table(out: &mut impl Write, plan: &Plan, pred: &Prediction, d: &Decision) -> Result<()> {
    writeln!(out, "{}", header(plan, pred))?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<26} {:>24} {:>24} {:>6} {:>6}  {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}  {:>7}",
        "strategy",
        "tok/s per stream [95%]",
        "tok/s total [95%]",
        "bound",
        "miss%",
        "pcie",
        "cpu",
        "gpu",
        "sync",
        "dense",
        "other",
        "ms/tok"
    )?;
    for s in &pred.strategies {
        let name = if s.feasible {
            s.strategy.to_string()
        } else {
            format!("{} (n/a)", s.strategy)
        };
        let ms = |r: Resource| s.critical.get(r) / 1e3;
        writeln!(
            out,
            "{:<26} {:>7.1} [{:>6.1}, {:>6.1}] {:>7.1} [{:>6.1}, {:>6.1}] {:>6} {:>6.1}  {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2}  {:>7.2}",
            name,
            s.tok_s_per_stream,
            s.tok_s_per_stream_interval[0],
            s.tok_s_per_stream_interval[1],
            s.tok_s_total,
            s.tok_s_total_interval[0],
            s.tok_s_total_interval[1],
            s.bound.name(),
            100.0 * s.miss_rate,
            ms(Resource::Pcie),
            ms(Resource::Cpu),
            ms(Resource::Gpu),
            ms(Resource::Sync),
            ms(Resource::Dense),
            ms(Resource::Other),
            s.step_us / 1e3
        )?;
    }
    writeln!(
        out,
        "(ms/tok: the critical path of one decode step, in which every stream decodes one token, split by the resource it runs on)"
    )?;
    for s in pred.strategies.iter().filter(|s| !s.feasible) {
        writeln!(
            out,
            "{}: {}",
            s.strategy,
            s.note.as_deref().unwrap_or("cannot run")
        )?;
    }
    writeln!(out)?;
    let runner = d.runner_up.map(|k| k.name()).unwrap_or("-");
    writeln!(
        out,
        "choice: {}, {:+.1}% total tok/s over {}{}",
        d.choice,
        100.0 * d.margin,
        runner,
        ft_model::perf::decide::tie_note(d.near_tie, d.intervals_overlap, d.noise_margin)
    )?;
    let l = &pred.legacy;
    writeln!(
        out,
        "legacy ratio: {:.2} / {:.2} GB/s = {:.2} at {:.2} MB experts, threshold {:.2} -> {} ({}){}",
        l.cpu_moe_gbs,
        l.pcie_gather_gbs,
        l.ratio,
        l.expert_bytes as f64 / 1e6,
        l.threshold,
        l.verdict,
        if d.legacy_agrees { "agrees with the model" } else { "differs from the model" },
        match l.fetch_fraction {
            Some(f) => format!(
                "; its fetch fraction {:.1}% ({} pair)",
                100.0 * f,
                if l.fraction_from_contended { "contended" } else { "standalone" }
            ),
            None => String::new(),
        }
    )?;
    let fs = &pred.fetch_search;
    if !fs.fixed {
        writeln!(
            out,
            "hybrid fetch fraction: {:.3} (grid of {} fractions, then Brent on [{:.2}, {:.2}]: {} iterations, {}; relaxed optimum {:.3})",
            fs.chosen,
            fs.grid.len(),
            fs.bracket[0],
            fs.bracket[1],
            fs.iterations,
            fs.termination,
            fs.relaxed_optimum
        )?;
    }
    let Some(ls) = &pred.layer_split else {
        return Ok(());
    };
    let n = |k: StrategyKind| pred.get(k).cpu_layers.unwrap_or(0);
    writeln!(
        out,
        "layer split: {} of {} layers' experts on the CPU with the rest resident ({} slots a layer; at least {} CPU layers for the rest to fit), {} with the rest cached{}",
        n(StrategyKind::LayerSplit),
        pred.layers,
        ls.slots_per_layer,
        ls.min_cpu_layers,
        n(StrategyKind::LayerSplitCached),
        if ls.fixed {
            " (N given)".to_string()
        } else {
            format!(
                " (N searched: {} counts resident, {} cached)",
                ls.resident.len(),
                ls.cached.len()
            )
        }
    )?;
    Ok(())
}
