//! `ft run`: decode on the real runtime with one strategy and print what happened.
//!
//! The run itself is `ft_runtime::run` (planning, the memory check, `auto` resolved by the
//! performance model of `--host`, the engine, the same-run ceilings, the reports); this file
//! holds the flags and the printing (the tables in `run/table.rs`, or `--json`).

mod table;

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

use ft_runtime::numerics::NumericsReport;
use ft_runtime::run::{self, RunOutcome, RunRequest};

/// Arguments of `ft run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a preset name, a model TOML file, a Hugging Face config.json or a GGUF file.
    #[arg(long, default_value = crate::predict::DEFAULT_MODEL)]
    model: String,
    /// offload, hybrid[:F], resident, cpu, layer-split:N (the experts of the first N layers
    /// on the CPU, the others resident on the GPU: llama.cpp's `--n-cpu-moe N`) or
    /// layer-split-cached:N (the others cached, every miss gathered); N may be auto (the
    /// performance model of --host chooses it under the GPU memory budget).
    #[arg(long, required_unless_present_any = ["probe_overhead", "interleave"], conflicts_with = "interleave")]
    strategy: Option<String>,
    /// Decode several strategies on one engine instead of --strategy, in turn and in rounds
    /// (`--repeat` rounds, each from an empty cache, the order rotated every round), so that
    /// a slow stretch of a shared machine falls on all of them alike and the host bank is
    /// filled once: a comma-separated list of `[LABEL=]STRATEGY[:P]`, e.g.
    /// `offload,hybrid:0.35,rules=hybrid:0.39,cpu,layer-split-cached:4` (P: hybrid's fetch
    /// fraction or auto, layer-split-cached's CPU layers; LABEL names the variant's report,
    /// default the strategy). Not with resident or layer-split (slots of their own).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["fetch_fraction", "compare_numerics", "trace_out", "stamps_out"])]
    interleave: Vec<String>,
    /// With --interleave: write each variant's report (the --json document of a plain run)
    /// to `PREFIX<LABEL>.json`, atomically.
    #[arg(long, requires = "interleave")]
    report_prefix: Option<String>,
    /// Hybrid's fetch fraction: a number in [0, 1], or auto (the performance model of
    /// --host chooses it).
    #[arg(long)]
    fetch_fraction: Option<String>,
    /// Host whose performance model resolves `--fetch-fraction auto`: a preset, a host TOML
    /// or a profile JSON of `ft probe` (this machine as fitted). With a profile that kept its
    /// CPU checks, a run on one GPU decides the fraction at the CPU check before its first
    /// round (the CPU side's speed now against the probe's, as `ft serve` does at start).
    #[arg(long)]
    host: Option<String>,
    /// With `--fetch-fraction auto` and a profile as `--host`: decide the fraction at the CPU
    /// speed the profile was probed at, not at the CPU check before the first round.
    #[arg(long)]
    no_cpu_check: bool,
    /// Concurrent streams.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Measured decode steps.
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Warm-up steps before them (they fill the cache; not measured).
    #[arg(long, default_value_t = 4)]
    warmup: usize,
    /// Expert cache slots (offload, hybrid and cpu).
    #[arg(long, conflicts_with = "cache_gb")]
    cache_slots: Option<usize>,
    /// Expert cache size in GiB (2^30 bytes).
    #[arg(long)]
    cache_gb: Option<f64>,
    /// The cache's policy, topology and admission.
    #[command(flatten)]
    cache_args: crate::cache_args::CacheArgs,
    /// Routing: a preset (uniform, mild, typical, skewed), a process TOML or a trace file.
    #[arg(long, default_value = "typical")]
    routing: String,
    /// Record the routing of every step to this trace file.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Context length of every stream at the first step, tokens (grows by one per step).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// CPU pool workers (default: cores - 1 on CUDA, 1 on the host device).
    #[arg(long)]
    threads: Option<usize>,
    /// cuda, host, or auto (CUDA where available, else host).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Run only the first N MoE layers of the model's geometry (to fit a memory budget).
    #[arg(long)]
    layers: Option<usize>,
    /// Seed of the expert weights, the routing process and the inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of every step to this file.
    #[arg(long)]
    trace_out: Option<PathBuf>,
    /// Write the expert kernels' block timelines of the last measured step (of the median
    /// round) to this CSV file, which `gpu_backend --analyze-stamps FILE` reads: when each
    /// block started, got its weights, computed and ended, per launch. Needs `--device
    /// cuda` with the timelines compiled in (`FT_CUDA_STAMPS=1`, which slows the kernels a
    /// little); one GPU, one strategy.
    #[arg(long)]
    stamps_out: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also run fresh (no warm-up) and as offload, and report the outputs' deviations.
    #[arg(long)]
    compare_numerics: bool,
    /// GPU expert activation path: int8 (W4A8/W8A8) or f32. Default: int8 where the format
    /// has it (the same bits as the CPU's int8 path), else f32.
    #[arg(long)]
    gpu_act: Option<String>,
    /// CPU expert activation path: int8 (W4A8/W8A8) or f32. Default as `--gpu-act`.
    #[arg(long)]
    cpu_act: Option<String>,
    /// Combine order of expert outputs: fixed (placement-independent) or fast.
    #[arg(long, default_value = "fixed")]
    combine: String,
    /// Gather method: copy-engine or zero-copy.
    #[arg(long, default_value = "copy-engine")]
    gather: String,
    /// How the CPU pool waits between layers: spin (the host thread computes as one of
    /// --threads), spin-beside (--threads workers, the host spinning idle beside them) or
    /// park (default: spin on CUDA, park on the host device).
    #[arg(long)]
    pool_wait: Option<String>,
    /// The engine's settings (`--engine-config FILE`, `--fetch-chunks N`), as `ft probe` and
    /// `ft serve` take them.
    #[command(flatten)]
    engine: crate::engine_args::EngineArgs,
    /// Host device only: emulated link bandwidth, GB/s.
    #[arg(long)]
    link_gbps: Option<f64>,
    /// Record no per-operation timing events (only host-side times and counts).
    #[arg(long)]
    no_timeline: bool,
    /// Decode the same steps this many times in this process (the cache emptied before
    /// each) and report the repetition with the median total tok/s, every repetition's
    /// tok/s beside it: one slow stretch of a shared machine then does not make the run.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Measure hybrid's fixed cost per layer with tiny work instead of decoding.
    #[arg(long)]
    probe_overhead: bool,
    /// GPUs decoding together (CUDA devices 0..N, or N host-emulated devices); the cache
    /// size flags are then per GPU and --threads the CPU workers of all GPUs together.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// How experts are laid out over the GPUs: sharded (each expert on GPU `expert % N`) or
    /// tensor-parallel (each expert split into N slices along its intermediate dimension).
    #[arg(long, default_value = "sharded")]
    placement: String,
}

impl Args {
    /// The run's inputs for `ft_runtime::run`.
    fn request(&self) -> Result<RunRequest> {
        let size_flag = [(self.cache_slots.is_some(), "--cache-slots")]
            .into_iter()
            .chain([(self.cache_gb.is_some(), "--cache-gb")])
            .find_map(|(given, flag)| given.then_some(flag));
        Ok(RunRequest {
            model: self.model.clone(),
            strategy: self.strategy.clone(),
            interleave: self.interleave.clone(),
            fetch_fraction: self.fetch_fraction.clone(),
            host: self.host.clone(),
            no_cpu_check: self.no_cpu_check,
            streams: self.streams,
            steps: self.steps,
            warmup: self.warmup,
            cache_slots: self.cache_slots,
            cache_gb: self.cache_gb,
            cache_options: self.cache_args.options(size_flag)?,
            routing: self.routing.clone(),
            record: self.record.clone(),
            context: self.context,
            threads: self.threads,
            device: self.device.clone(),
            layers: self.layers,
            seed: self.seed,
            trace_out: self.trace_out.clone(),
            stamps_out: self.stamps_out.clone(),
            compare_numerics: self.compare_numerics,
            gpu_act: self.gpu_act.clone(),
            cpu_act: self.cpu_act.clone(),
            combine: self.combine.clone(),
            gather: self.gather.clone(),
            pool_wait: self.pool_wait.clone(),
            engine: self.engine.settings()?,
            link_gbps: self.link_gbps,
            no_timeline: self.no_timeline,
            repeat: self.repeat,
            probe_overhead: self.probe_overhead,
            gpus: self.gpus,
            placement: self.placement.clone(),
        })
    }
}

/// The run's progress on `ft`'s bar (stderr).
#[derive(Default)]
struct Bar(Option<indicatif::ProgressBar>);

impl run::Progress for Bar {
    fn start(&mut self, total: u64) {
        self.0 = Some(crate::progress::bar(total, "steps"));
    }
    fn position(&mut self, done: u64) {
        if let Some(b) = &self.0 {
            b.set_position(done);
        }
    }
    fn message(&mut self, message: &str) {
        if let Some(b) = &self.0 {
            b.set_message(message.to_string());
        }
    }
    fn finish(&mut self) {
        if let Some(b) = self.0.take() {
            b.finish_and_clear();
        }
    }
}

/// Run `ft run`.
pub fn run(args: Args) -> Result<()> {
    let outcome = run::run(&args.request()?, &mut Bar::default())?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let reports = match outcome {
        RunOutcome::Overhead(r) => {
            return match args.json {
                true => Ok(writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?),
                false => table::print_overhead(&mut out, &r),
            };
        }
        RunOutcome::Multi(r) => {
            match args.json {
                true => writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?,
                false => table::print_multi(&mut out, &r)?,
            };
            return numerics_passed(r.numerics.iter());
        }
        RunOutcome::Single(reports) => reports,
    };
    if let Some(prefix) = &args.report_prefix {
        for r in &reports {
            let path = PathBuf::from(format!("{prefix}{}.json", r.label));
            ft_model::profile::write_atomic(&path, &serde_json::to_vec_pretty(r)?)
                .with_context(|| format!("--report-prefix: writing {}", path.display()))?;
        }
    }
    match (args.json, reports.len()) {
        (true, 1) => writeln!(out, "{}", serde_json::to_string_pretty(&reports[0])?)?,
        (true, _) => writeln!(out, "{}", serde_json::to_string_pretty(&reports)?)?,
        (false, _) => {
            for (i, r) in reports.iter().enumerate() {
                if i > 0 {
                    writeln!(out)?;
                }
                table::print(&mut out, r)?;
            }
        }
    }
    numerics_passed(reports.iter().filter_map(|r| r.numerics.as_ref()))
}

/// A check failure for the first numerics whose outputs were expected bit-identical and
/// are not.
fn numerics_passed<'a>(numerics: impl Iterator<Item = &'a NumericsReport>) -> Result<()> {
    for n in numerics {
        if !n.passed() {
            return Err(crate::CheckFailed(format!(
                "{}: fresh and warmed outputs differ (first at step {:?}) although placement cannot change them here",
                n.strategy, n.fresh_vs_warmed.first_differing_step
            ))
            .into());
        }
    }
    Ok(())
}
