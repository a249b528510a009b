//! `ft simulate`: the discrete-event simulator on a host and model, every strategy side by
//! side with the analytic model's prediction and the legacy ratio's verdict.
//!
//! With no flags it answers the field report (shared/seeds): the report's host
//! (`rtx4090-2x-xeon4310`) and model (`qwen3.8-flash-next`) at 1 and 2 streams, with a
//! cache sized so that offload misses the report's measured 38% at two streams, and the
//! report's measured figures printed beside the simulated ones. `--sweep` runs a cross
//! product in parallel and writes CSV.

use anyhow::{bail, Context, Result};
use std::io::Write;

use ft_model::strategy::{CpuLayers, FetchFraction, Strategy, StrategyKind};
use ft_sim::compare::{compare, CacheChoice, CompareConfig, Comparison};
use ft_sim::field_report as fr;
use ft_sim::sweep::{self, SweepPoint};

/// Arguments of `ft simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Host: a preset (rtx4090-2x-xeon4310, rtxpro4000-gen3-epyc7302, gh200, h200-xeon-emr,
    /// 2x-rtx3090-tp-ryzen7950x), a host TOML file, or a profile JSON written by `ft probe`
    /// (fitted parameters). A host with `[gpu] count > 1` decodes on that many GPUs, laid
    /// out by `[gpu] placement`; cache sizes are then each GPU's.
    #[arg(long, default_value = fr::HOST)]
    host: String,
    /// Model: a preset, a model TOML file, a Hugging Face config.json or a GGUF file.
    #[arg(long, default_value = fr::MODEL)]
    model: String,
    /// Concurrent streams (repeatable or a comma list); default 1 and 2.
    #[arg(long, value_delimiter = ',')]
    streams: Vec<usize>,
    /// Expert cache slots.
    #[arg(long, conflicts_with_all = ["cache_gb", "miss_rate"])]
    cache_slots: Option<usize>,
    /// Expert cache size in GiB.
    #[arg(long, conflicts_with = "miss_rate")]
    cache_gb: Option<f64>,
    /// Prompt tokens (the context at a request's first decode step; it grows by one per
    /// generated token).
    #[arg(long, default_value_t = fr::PROMPT_TOKENS)]
    context: u64,
    /// Output tokens per request (a stream then starts a new request).
    #[arg(long, default_value_t = fr::OUTPUT_TOKENS)]
    output_tokens: u64,
    /// Offload's miss rate measured elsewhere (0 to 1): the cache is sized so that offload
    /// misses this rate at each stream count; the other strategies' rates follow from that
    /// cache through their own histories.
    #[arg(long)]
    miss_rate: Option<f64>,
    /// offload, hybrid, resident, cpu, layer-split[:N], layer-split-cached[:N] (a comma list)
    /// or all.
    #[arg(long, default_value = "all")]
    strategy: String,
    /// Hybrid's fetch fraction: a number in [0, 1] or auto (the analytic model's optimum).
    #[arg(long, default_value = "auto")]
    fetch_fraction: String,
    /// Layer split's CPU layers: a number or auto (the analytic model's optimum among the
    /// counts whose other layers fit the GPU); a `layer-split:N` in --strategy gives it too.
    #[arg(long, default_value = "auto")]
    cpu_layers: String,
    /// Routing preset (uniform, mild, typical, skewed), process TOML or trace file.
    #[arg(long, default_value = "typical")]
    routing: String,
    /// The cache's policy, topology and admission.
    #[command(flatten)]
    cache_args: crate::cache_args::CacheArgs,
    /// Measured decode steps.
    #[arg(long, default_value_t = ft_sim::compare::DEFAULT_STEPS)]
    steps: u64,
    /// Unmeasured warm-up steps before them (they fill the cache).
    #[arg(long, default_value_t = ft_sim::compare::DEFAULT_WARMUP_STEPS)]
    warmup: u64,
    /// Seed of the run (routing and jitter).
    #[arg(long, default_value_t = ft_sim::compare::DEFAULT_SEED)]
    seed: u64,
    /// Relative standard deviation of a multiplicative jitter on every duration (0: none).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Sweep an axis: KEY=V1,V2,... (repeatable; the cross product runs in parallel). Keys:
    /// host, model, streams, strategy, fetch-fraction, cache-slots, cache-gb, miss-rate,
    /// context, routing, policy, seed, steps, jitter.
    #[arg(long)]
    sweep: Vec<String>,
    /// With --sweep: also run the analytic model for every point (adds its columns and the
    /// legacy ratio and verdict beside each row).
    #[arg(long)]
    with_model: bool,
    /// Write the rows as CSV to this file (a sweep's rows, or the comparison's).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Print JSON: one object per stream count (a list when there are several), or with
    /// --sweep the list of rows.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// Every input-derived size against its documented limit (`ft_model::limits`), before
    /// anything is allocated: each stream count, the steps, the context a request reaches.
    fn check_limits(&self, streams: &[usize]) -> Result<()> {
        use ft_model::limits;
        for &b in streams {
            limits::check_streams("--streams", b as u64)?;
        }
        limits::check(
            "--streams (the number of stream counts)",
            streams.len(),
            limits::MAX_SWEEP_POINTS,
            "ft_model::limits::MAX_SWEEP_POINTS: one simulation each",
        )?;
        limits::check_steps("--steps", self.steps)?;
        limits::check_steps("--warmup", self.warmup)?;
        let reached = self.context.saturating_add(self.output_tokens);
        limits::check_context(
            &format!("--context {} + --output-tokens", self.context),
            reached,
        )?;
        if let Some(slots) = self.cache_slots {
            limits::check_cache_slots("--cache-slots", slots as u64)?;
        }
        Ok(())
    }

    /// The strategies of --strategy (`all`, or `KIND` / `KIND:PARAM` names).
    fn parsed_strategies(&self) -> Result<Vec<Strategy>> {
        Strategy::parse_list(&self.strategy).context("--strategy")
    }

    fn strategies(&self) -> Result<Vec<StrategyKind>> {
        Ok(self.parsed_strategies()?.iter().map(|s| s.kind()).collect())
    }

    /// Layer split's CPU layers: a `layer-split:N` of --strategy, else --cpu-layers.
    fn cpu_layers(&self) -> Result<CpuLayers> {
        match Strategy::given_cpu_layers(&self.parsed_strategies()?) {
            Some(n) => Ok(n),
            None => Ok(CpuLayers::parse("--cpu-layers", &self.cpu_layers)?),
        }
    }

    /// True when the run is the field report's (host and model unchanged).
    fn is_field_report(&self) -> bool {
        self.host == fr::HOST && self.model == fr::MODEL
    }

    fn config(&self, streams: usize) -> Result<CompareConfig> {
        if streams == 0 {
            bail!("--streams: must be at least 1");
        }
        let size_flag = [
            (self.cache_slots.is_some(), "--cache-slots"),
            (self.cache_gb.is_some(), "--cache-gb"),
            (self.miss_rate.is_some(), "--miss-rate"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag));
        let cache_options = self.cache_args.options(size_flag)?;
        Ok(CompareConfig {
            streams,
            strategies: self.strategies()?,
            fetch: FetchFraction::parse("--fetch-fraction", &self.fetch_fraction)?,
            cpu_layers: self.cpu_layers()?,
            cache: CacheChoice::from_flags(
                self.cache_slots,
                self.cache_gb,
                self.miss_rate,
                self.is_field_report(),
            ),
            cache_options,
            routing: self.routing.clone(),
            warmup_steps: self.warmup,
            steps: self.steps,
            seed: self.seed,
            jitter: self.jitter,
            workload: ft_sim::decode::Workload {
                prompt_tokens: self.context,
                output_tokens: self.output_tokens,
                prefill_ns: 0,
            },
            threshold: ft_model::perf::legacy::DEFAULT_THRESHOLD,
        })
    }
}

/// Run `ft simulate`.
pub fn run(args: Args) -> Result<()> {
    let streams = if args.streams.is_empty() {
        vec![1, 2]
    } else {
        args.streams.clone()
    };
    args.check_limits(&streams)?;
    if !args.sweep.is_empty() {
        return run_sweep(&args, &streams);
    }
    let host =
        ft_sim::hosts::resolve_host(&args.host).with_context(|| format!("--host {}", args.host))?;
    let model = ft_model::ModelSpec::resolve(&args.model)
        .with_context(|| format!("--model {}", args.model))?;
    let mut comparisons = Vec::new();
    for &b in &streams {
        let cfg = args.config(b)?;
        tracing::info!(host = %host.name, model = %model.name, streams = b, "simulating");
        comparisons.push(compare(&host, &model, &cfg)?);
    }
    let field = args.is_field_report()
        && args.cache_slots.is_none()
        && args.cache_gb.is_none()
        && args.miss_rate.is_none();
    if let Some(path) = &args.out {
        write_comparison_csv(path, &comparisons)?;
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        let mut values: Vec<serde_json::Value> = comparisons
            .iter()
            .map(serde_json::to_value)
            .collect::<std::result::Result<_, _>>()?;
        if field {
            for v in values.iter_mut() {
                v["field_report"] = serde_json::to_value(fr::reported())?;
            }
        }
        let doc = if values.len() == 1 {
            values.remove(0)
        } else {
            serde_json::Value::Array(values)
        };
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    for c in &comparisons {
        print_table(&mut out, c)?;
    }
    if field {
        print_field_report(&mut out, &comparisons)?;
    }
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn print_table(out: &mut impl Write, c: &Comparison) -> Result<()> {
    writeln!(
        out,
        "ft simulate: host {}, model {}, {} stream(s), {} measured steps after {} warm-up, seed {}",
        c.host, c.model, c.streams, c.config.steps, c.config.warmup_steps, c.config.seed
    )?;
    writeln!(out, "gpus: {} ({})", c.gpus, c.placement)?;
    let per_gpu = if c.gpus > 1 { " per GPU" } else { "" };
    writeln!(
        out,
        "cache: {} slots ({:.1} GiB){per_gpu}: {}",
        c.cache.slots, c.cache.gib, c.cache.how
    )?;
    writeln!(
        out,
        "{:<22} {:>6} {:>7} {:>12} {:>11} {:>6} | {:>12} {:>17} {:>6} {:>8}",
        "strategy",
        "fetch",
        "miss",
        "tok/s/stream",
        "tok/s total",
        "bound",
        "model tok/s",
        "interval",
        "bound",
        "sim-mod"
    )?;
    for r in &c.strategies {
        let [lo, hi] = r.model.tok_s_per_stream_interval;
        writeln!(
            out,
            "{:<22} {:>6.3} {:>7} {:>12.2} {:>11.2} {:>6} | {:>12.2} {:>17} {:>6} {:>8}{}",
            match r.sim.strategy.cpu_layers() {
                Some(_) => format!("{}:{}", r.strategy, r.sim.cpu_layers),
                None => r.strategy.clone(),
            },
            r.fetch_fraction,
            pct(r.miss_rate),
            r.tok_s_per_stream,
            r.tok_s_total,
            r.bound,
            r.model.tok_s_per_stream,
            format!("[{lo:.1}, {hi:.1}]"),
            r.model.bound,
            format!("{:+.1}%", 100.0 * r.sim_vs_model),
            if r.feasible {
                String::new()
            } else {
                format!("  (not feasible: {})", r.note.clone().unwrap_or_default())
            }
        )?;
    }
    let l = &c.legacy;
    let verdict_note = if l.verdict == c.best {
        "agrees with the simulated best".to_string()
    } else {
        format!("differs from the simulated best ({})", c.best)
    };
    writeln!(out, "best (simulated, feasible): {}", c.best)?;
    writeln!(
        out,
        "legacy ratio: cpu_moe {:.2} / pcie_gather {:.2} GB/s = {:.3} (threshold {:.1}) -> {}: {}",
        l.cpu_moe_gbs, l.pcie_gather_gbs, l.ratio, l.threshold, l.verdict, verdict_note
    )?;
    writeln!(out)?;
    Ok(())
}

fn print_field_report(out: &mut impl Write, cs: &[Comparison]) -> Result<()> {
    writeln!(
        out,
        "field report (shared/seeds, measured) beside the simulation:"
    )?;
    writeln!(out, "  {:<44} {:>14} {:>12}", "", "reported", "simulated")?;
    for r in fr::beside(cs) {
        writeln!(
            out,
            "  {:<44} {:>14} {:>12}",
            r.label, r.reported, r.simulated
        )?;
    }
    Ok(())
}

fn write_comparison_csv(path: &std::path::Path, cs: &[Comparison]) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("--out {}", path.display()))?;
    ft_sim::compare::write_csv(cs, f)?;
    Ok(())
}

fn run_sweep(args: &Args, streams: &[usize]) -> Result<()> {
    let swept = args
        .sweep
        .iter()
        .map(|s| sweep::parse_axis(s))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // The stream counts and strategies of the plain flags are axes too, unless swept.
    let axes = sweep::with_flag_axes(swept, streams, &args.strategies()?);
    let base = SweepPoint {
        host: args.host.clone(),
        model: args.model.clone(),
        strategy: StrategyKind::Offload,
        config: args.config(streams[0])?,
    };
    let points = sweep::expand(&base, &axes)?;
    tracing::info!(points = points.len(), "sweep");
    let bar = crate::progress::bar(points.len() as u64, "points");
    let started = std::time::Instant::now();
    let rows = sweep::run_sweep(&points, args.with_model, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let events: u64 = rows.iter().map(|r| r.events).sum();
    tracing::info!(
        "sweep: {} configurations in {secs:.2} s on {} threads ({events} events, {:.2} M events/s)",
        rows.len(),
        rayon::current_num_threads(),
        events as f64 / secs / 1e6
    );
    match &args.out {
        Some(path) => {
            let f =
                std::fs::File::create(path).with_context(|| format!("--out {}", path.display()))?;
            sweep::write_csv(&rows, f)?;
        }
        None if !args.json => sweep::write_csv(&rows, std::io::stdout().lock())?,
        None => {}
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
