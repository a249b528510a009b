//! `ft bench cpu`: the CPU expert step's weight bytes per second, beside the STREAM-style
//! read bandwidth of the same threads, measured in the same run (`ft_kernels::bench`).
//!
//! The grid is models x formats x activation paths x threads x tokens per expert x experts
//! per call; flags restrict it (`--quick` for CI). This command turns the flags into a
//! `CpuBenchPlan`, runs it with a progress bar and prints the report.

use std::io::Write;

use anyhow::{bail, Context, Result};

use ft_kernels::bench::{run_cpu_bench, BenchProgress, CpuBenchPlan, Report};
use ft_kernels::{ActivationPath, SimdLevel, WaitMode};
use ft_model::{ExpertFormat, ModelSpec};

/// Arguments of `ft bench cpu`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model preset or TOML file (repeatable); default: qwen3.8-flash-next and bench-nvfp4.
    #[arg(long = "model")]
    models: Vec<String>,
    /// Expert formats (repeatable or comma-separated); default: all five.
    #[arg(long = "format", value_delimiter = ',')]
    formats: Vec<ExpertFormat>,
    /// Activation paths: f32, int8 (repeatable or comma-separated); default: both.
    #[arg(long = "path", value_delimiter = ',')]
    paths: Vec<String>,
    /// Tokens per expert (repeatable or comma-separated); default: 1,2,4,8.
    #[arg(long = "tokens", value_delimiter = ',')]
    tokens: Vec<usize>,
    /// Experts per call (repeatable or comma-separated); default: 1,4,10,32.
    #[arg(long = "experts", value_delimiter = ',')]
    experts: Vec<usize>,
    /// Thread counts, 0 meaning all CPUs (repeatable or comma-separated); default: 1,0.
    #[arg(long = "threads", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Force a SIMD level (scalar, avx2, avx512, avx512-vnni); default: the widest detected.
    #[arg(long)]
    simd: Option<String>,
    /// How the calling thread waits for a layer call: spin (as the hybrid runtime does) or
    /// block (rayon install; adds the pool's wake-up latency to every call).
    #[arg(long, default_value = "spin")]
    wait: String,
    /// Bytes of distinct experts per (model, format), MiB; default: max(1024, 4 x LLC).
    #[arg(long)]
    working_set_mib: Option<u64>,
    /// STREAM buffer, MiB; default: max(1024, 4 x LLC).
    #[arg(long)]
    stream_mib: Option<u64>,
    /// Least timed calls per configuration.
    #[arg(long, default_value_t = 5)]
    min_repeats: usize,
    /// Most timed calls per configuration.
    #[arg(long, default_value_t = 200)]
    max_repeats: usize,
    /// Least time per configuration, ms (repeats continue until both minimums are met).
    #[arg(long, default_value_t = 150)]
    min_time_ms: u64,
    /// A tiny grid for CI: the first model, nvfp4, int8, 1 token, 1 and 4 experts, all
    /// threads, 64 MiB buffers, 3 repeats (explicit flags still apply).
    #[arg(long)]
    quick: bool,
    /// Print JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    save_json: Option<std::path::PathBuf>,
    /// Also write one CSV row per configuration to this file.
    #[arg(long)]
    save_csv: Option<std::path::PathBuf>,
}

/// The grid the flags ask for: each empty list is its default (`--quick`: a tiny one);
/// thread count 0 is all CPUs.
fn plan(a: &Args) -> Result<CpuBenchPlan> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let q = a.quick;
    let or = |v: &[usize], quick: &[usize], full: &[usize]| -> Vec<usize> {
        if !v.is_empty() {
            v.to_vec()
        } else if q {
            quick.to_vec()
        } else {
            full.to_vec()
        }
    };
    let model_names: Vec<String> = if !a.models.is_empty() {
        a.models.clone()
    } else if q {
        vec!["qwen3.8-flash-next".into()]
    } else {
        vec!["qwen3.8-flash-next".into(), "bench-nvfp4".into()]
    };
    let models = model_names
        .iter()
        .map(|m| ModelSpec::resolve(m).with_context(|| format!("--model {m}")))
        .collect::<Result<Vec<_>>>()?;
    let formats = if !a.formats.is_empty() {
        a.formats.clone()
    } else if q {
        vec![ExpertFormat::Nvfp4]
    } else {
        ExpertFormat::ALL.to_vec()
    };
    let paths = if !a.paths.is_empty() {
        a.paths
            .iter()
            .map(|p| {
                p.parse::<ActivationPath>()
                    .with_context(|| format!("--path {p}"))
            })
            .collect::<Result<Vec<_>>>()?
    } else if q {
        vec![ActivationPath::Int8]
    } else {
        ActivationPath::ALL.to_vec()
    };
    let tokens = or(&a.tokens, &[1], &[1, 2, 4, 8]);
    let experts = or(&a.experts, &[1, 4], &[1, 4, 10, 32]);
    let mut threads: Vec<usize> = or(&a.threads, &[0], &[1, 0])
        .into_iter()
        .map(|t| if t == 0 { all } else { t })
        .collect();
    threads.dedup();
    let simd = match &a.simd {
        None => SimdLevel::detect(),
        Some(s) => s
            .parse::<SimdLevel>()
            .map_err(anyhow::Error::msg)
            .context("--simd")?,
    };
    let mib = 1u64 << 20;
    let default_bytes = if q {
        64 * mib
    } else {
        ft_kernels::stream::cold_read_bytes(1024 * mib)
    };
    let working_set = a.working_set_mib.map_or(default_bytes, |m| m * mib);
    let stream_bytes = a.stream_mib.map_or(default_bytes, |m| m * mib);
    let (min_repeats, min_time_s) = if q && a.min_repeats == 5 {
        (3, 0.0)
    } else {
        (a.min_repeats.max(1), a.min_time_ms as f64 / 1e3)
    };
    let wait = match a.wait.as_str() {
        "block" => WaitMode::Block,
        "spin" => WaitMode::Spin,
        w => bail!("--wait {w}: expected block or spin"),
    };
    let plan = CpuBenchPlan {
        wait,
        models,
        formats,
        paths,
        tokens,
        experts,
        threads,
        simd,
        working_set,
        stream_bytes,
        min_repeats,
        max_repeats: a.max_repeats.max(min_repeats),
        min_time_s,
    };
    plan.validate()?;
    Ok(plan)
}

/// Run `ft bench cpu`.
pub fn run(a: Args) -> Result<()> {
    let p = plan(&a)?;
    let bar = crate::progress::bar(p.configurations() as u64, "runs");
    let report = run_cpu_bench(&p, &mut |e| match e {
        BenchProgress::Doing(m) => bar.set_message(m),
        BenchProgress::Done(n) => bar.inc(n),
    })?;
    bar.finish_and_clear();
    if let Some(path) = &a.save_json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.save_csv {
        std::fs::write(path, report.csv())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        write!(out, "{}", table(&report))?;
    }
    Ok(())
}

fn table(r: &Report) -> String {
    let mut s = format!(
        "CPU: {} ({} logical CPUs, LLC {} MiB), SIMD {}\n",
        r.machine.cpu_model,
        r.machine.logical_cpus,
        r.machine.llc_bytes >> 20,
        r.machine.simd
    );
    for st in &r.stream {
        s += &format!(
            "STREAM read, {:>2} threads: {:7.2} GB/s (min {:.2}, max {:.2}; {} MiB)\n",
            st.threads,
            st.median_gbs,
            st.min_gbs,
            st.max_gbs,
            st.bytes >> 20
        );
    }
    s += &format!(
        "\n{:<20} {:<6} {:<5} {:>3} {:>4} {:>4} {:>8} {:>10} {:>8} {:>17} {:>8} {:>7} {:>22}\n",
        "model",
        "format",
        "path",
        "thr",
        "tok",
        "exp",
        "MB/call",
        "us/call",
        "GB/s",
        "GB/s p10..p90",
        "STREAM",
        "ratio",
        "us prep/gate-up/down"
    );
    for x in &r.results {
        s += &format!(
            "{:<20} {:<6} {:<5} {:>3} {:>4} {:>4} {:>8.2} {:>10.1} {:>8.2} {:>8.2}..{:<7.2} {:>8.2} {:>6.1}% {:>6.0}/{:>6.0}/{:>6.0}\n",
            x.model,
            x.format.name(),
            x.path.name(),
            x.threads,
            x.tokens_per_expert,
            x.experts_per_call,
            (x.expert_bytes * x.experts_per_call as u64) as f64 / 1e6,
            x.median_us,
            x.weight_gbs,
            x.weight_gbs_p10,
            x.weight_gbs_p90,
            x.stream_gbs,
            100.0 * x.ratio,
            x.prep_us,
            x.gate_up_us,
            x.down_us
        );
    }
    s
}
