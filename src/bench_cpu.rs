//! `ft bench cpu`: the CPU expert step's weight bytes per second, beside the STREAM-style
//! read bandwidth of the same threads, measured in the same run.
//!
//! At one token per expert the step is memory-bound, so the ratio of the two says how close
//! the kernels come to what the host can read. Every call reads cold bytes: each (model,
//! format) bank holds enough distinct experts to be several times the last-level cache, and
//! calls rotate through it. The grid is models x formats x activation paths x threads x
//! tokens per expert x experts per call; flags restrict it (`--quick` for CI).

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use serde::Serialize;

use ft_kernels::stream::{alloc_touched, quantile, stream_read, StreamRead};
use ft_kernels::{
    fill_expert_from_seed, ActivationPath, CpuExperts, ExpertWork, LayerTiming, SimdLevel, WaitMode,
};
use ft_model::{ExpertFormat, ModelSpec};

/// The share of STREAM read the issue asks of nvfp4 int8 at one token, 10 experts, all threads.
const TARGET_RATIO: f64 = 0.75;

/// Timed passes over the STREAM buffer per thread count.
const STREAM_REPEATS: usize = 10;

/// Seed of the synthetic experts (any fixed value: the bytes only need to be valid).
const BANK_SEED: u64 = 0x00F7_BE7C;

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

/// Host facts recorded with the results.
#[derive(Debug, Serialize)]
struct Machine {
    /// `model name` of /proc/cpuinfo.
    cpu_model: String,
    /// Logical CPUs available to this process.
    logical_cpus: usize,
    /// Last-level cache, bytes (0 if unknown).
    llc_bytes: u64,
    /// SIMD level the kernels ran at.
    simd: SimdLevel,
    /// Widest SIMD level detected.
    simd_detected: SimdLevel,
    /// How the caller waited for each call.
    wait: WaitMode,
}

/// STREAM read of one thread count.
#[derive(Debug, Serialize)]
struct StreamRow {
    threads: usize,
    /// Buffer bytes.
    bytes: u64,
    /// Median read bandwidth, GB/s (1e9 B/s).
    median_gbs: f64,
    /// Slowest and fastest repeats, GB/s.
    min_gbs: f64,
    max_gbs: f64,
}

/// One configuration's result.
#[derive(Debug, Serialize, Clone)]
struct Row {
    model: String,
    format: ExpertFormat,
    path: ActivationPath,
    threads: usize,
    tokens_per_expert: usize,
    experts_per_call: usize,
    /// Bytes of one expert.
    expert_bytes: u64,
    /// Timed calls.
    calls: usize,
    /// Time per call, microseconds: median, 10th and 90th percentiles.
    median_us: f64,
    p10_us: f64,
    p90_us: f64,
    /// Weight bytes per second at the median call time, GB/s (1e9 B/s).
    weight_gbs: f64,
    /// At the 90th and 10th percentile times (slow and fast end), GB/s.
    weight_gbs_p10: f64,
    weight_gbs_p90: f64,
    /// STREAM read of the same threads, GB/s.
    stream_gbs: f64,
    /// weight_gbs / stream_gbs.
    ratio: f64,
    /// Median phase times inside the pool, us: activation quantization, gate/up, down.
    prep_us: f64,
    gate_up_us: f64,
    down_us: f64,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report {
    version: &'static str,
    machine: Machine,
    /// Target ratio for the headline configuration.
    target_ratio: f64,
    working_set_bytes: u64,
    stream: Vec<StreamRow>,
    results: Vec<Row>,
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// The validated grid.
struct Plan {
    models: Vec<ModelSpec>,
    formats: Vec<ExpertFormat>,
    paths: Vec<ActivationPath>,
    tokens: Vec<usize>,
    experts: Vec<usize>,
    threads: Vec<usize>,
    simd: SimdLevel,
    working_set: u64,
    stream_bytes: u64,
    min_repeats: usize,
    max_repeats: usize,
    min_time_s: f64,
    wait: WaitMode,
}

fn plan(a: &Args) -> Result<Plan> {
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
    for m in &models {
        for f in &formats {
            m.geometry
                .validate(*f)
                .with_context(|| format!("--model {} in --format {f}", m.name))?;
        }
    }
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
    if let Some(t) = tokens.iter().find(|&&t| t == 0 || t > 64) {
        bail!("--tokens {t}: tokens per expert must be 1 to 64");
    }
    if experts.contains(&0) {
        bail!("--experts 0: a call needs at least one expert");
    }
    let simd = match &a.simd {
        None => SimdLevel::detect(),
        Some(s) => {
            let l: SimdLevel = s.parse().map_err(anyhow::Error::msg).context("--simd")?;
            if !l.available() {
                bail!(
                    "--simd {l}: this CPU supports at most {}",
                    SimdLevel::detect()
                );
            }
            l
        }
    };
    let mib = 1u64 << 20;
    let default_bytes = if q {
        64 * mib
    } else {
        ft_kernels::stream::cold_read_bytes(1024 * mib)
    };
    let working_set = a.working_set_mib.map_or(default_bytes, |m| m * mib);
    let stream_bytes = a.stream_mib.map_or(default_bytes, |m| m * mib);
    if working_set == 0 || stream_bytes == 0 {
        bail!("--working-set-mib and --stream-mib must be greater than zero");
    }
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
    Ok(Plan {
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
    })
}

/// Distinct experts of one (model, format), filled in parallel.
struct Bank {
    bytes: Vec<u8>,
    expert_bytes: usize,
    count: usize,
}

impl Bank {
    fn expert(&self, i: usize) -> &[u8] {
        let i = i % self.count;
        &self.bytes[i * self.expert_bytes..(i + 1) * self.expert_bytes]
    }
}

fn fill_bank(
    pool: &rayon::ThreadPool,
    m: &ModelSpec,
    f: ExpertFormat,
    working_set: u64,
    need: usize,
) -> Result<Bank> {
    let eb = m.geometry.expert_bytes(f) as usize;
    let count = ((working_set as usize).div_ceil(eb)).max(2 * need);
    let mut bytes = vec![0u8; count * eb];
    pool.install(|| {
        bytes
            .par_chunks_mut(eb)
            .enumerate()
            .try_for_each(|(i, chunk)| {
                fill_expert_from_seed(f, &m.geometry, BANK_SEED, 0, i, chunk)
            })
    })?;
    Ok(Bank {
        bytes,
        expert_bytes: eb,
        count,
    })
}

/// Time calls of `experts` experts x `tokens` tokens until the plan's minimums are met.
#[allow(clippy::too_many_arguments)]
fn measure(
    k: &mut CpuExperts,
    p: &Plan,
    m: &ModelSpec,
    f: ExpertFormat,
    path: ActivationPath,
    bank: &Bank,
    cursor: &mut usize,
    tokens: usize,
    experts: usize,
) -> Result<(Vec<f64>, Vec<LayerTiming>)> {
    let h = m.geometry.hidden;
    let x: Vec<f32> = (0..tokens * h)
        .map(|i| ((i * 2654435761usize) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut y = vec![0f32; tokens * h];
    let route: Vec<(u32, f32)> = (0..tokens)
        .map(|t| (t as u32, 1.0 / experts as f32))
        .collect();
    let mut times = Vec::new();
    let mut phases = Vec::new();
    let start = Instant::now();
    // One untimed call warms the pool, the scratch and the code.
    for i in 0.. {
        let work: Vec<ExpertWork<'_>> = (0..experts)
            .map(|e| ExpertWork {
                weights: bank.expert(*cursor + e),
                tokens: &route,
            })
            .collect();
        *cursor = (*cursor + experts) % bank.count;
        let t0 = Instant::now();
        let phase = k.run_layer(f, &m.geometry, path, &work, &x, &mut y)?;
        let dt = t0.elapsed().as_secs_f64();
        if i > 0 {
            times.push(dt);
            phases.push(phase);
        }
        let n = times.len();
        if n >= p.max_repeats
            || (n >= p.min_repeats && start.elapsed().as_secs_f64() >= p.min_time_s)
        {
            break;
        }
    }
    std::hint::black_box(&y);
    Ok((times, phases))
}

/// Run `ft bench cpu`.
pub fn run(a: Args) -> Result<()> {
    let p = plan(&a)?;
    let mut kernels = Vec::new();
    for &t in &p.threads {
        let mut k = CpuExperts::new(t)?;
        k.set_simd(p.simd)?;
        k.set_wait_mode(p.wait);
        kernels.push(k);
    }
    let widest = kernels
        .iter()
        .max_by_key(|k| k.threads())
        .map(|k| k.pool().clone())
        .context("no thread count")?;

    tracing::info!(bytes = p.stream_bytes, "allocating the STREAM buffer");
    let buf = alloc_touched(&widest, p.stream_bytes as usize);
    let mut stream = Vec::new();
    for k in &kernels {
        let r: StreamRead = stream_read(k.pool(), &buf, STREAM_REPEATS);
        let s = &r.samples_gbs;
        stream.push(StreamRow {
            threads: r.threads,
            bytes: r.bytes,
            median_gbs: r.median_gbs(),
            min_gbs: quantile(s, 0.0),
            max_gbs: quantile(s, 1.0),
        });
    }
    drop(buf);

    let combos: usize = p.paths.len() * p.threads.len() * p.tokens.len() * p.experts.len();
    let total = (p.models.len() * p.formats.len() * combos) as u64;
    let bar = crate::progress::bar(total, "runs");
    let need = *p.experts.iter().max().unwrap_or(&1);
    let mut rows = Vec::new();
    for m in &p.models {
        for &f in &p.formats {
            bar.set_message(format!("filling {} {f}", m.name));
            let bank = fill_bank(&widest, m, f, p.working_set, need)?;
            let mut cursor = 0;
            for &path in &p.paths {
                if !path.supports(f) {
                    bar.inc((p.threads.len() * p.tokens.len() * p.experts.len()) as u64);
                    continue;
                }
                for (ki, k) in kernels.iter_mut().enumerate() {
                    for &tok in &p.tokens {
                        for &ne in &p.experts {
                            bar.set_message(format!(
                                "{} {f} {path} t{} x{tok} e{ne}",
                                m.name,
                                k.threads()
                            ));
                            let (times, phases) =
                                measure(k, &p, m, f, path, &bank, &mut cursor, tok, ne)?;
                            let phase = |get: fn(&LayerTiming) -> f64| {
                                quantile(&phases.iter().map(get).collect::<Vec<_>>(), 0.5)
                            };
                            let bytes = (ne * bank.expert_bytes) as f64;
                            let med = quantile(&times, 0.5);
                            let (p10, p90) = (quantile(&times, 0.1), quantile(&times, 0.9));
                            let sg = stream[ki].median_gbs;
                            let gbs = bytes / med / 1e9;
                            rows.push(Row {
                                model: m.name.clone(),
                                format: f,
                                path,
                                threads: k.threads(),
                                tokens_per_expert: tok,
                                experts_per_call: ne,
                                expert_bytes: bank.expert_bytes as u64,
                                calls: times.len(),
                                median_us: med * 1e6,
                                p10_us: p10 * 1e6,
                                p90_us: p90 * 1e6,
                                weight_gbs: gbs,
                                weight_gbs_p10: bytes / p90 / 1e9,
                                weight_gbs_p90: bytes / p10 / 1e9,
                                stream_gbs: sg,
                                ratio: gbs / sg,
                                prep_us: phase(|t| t.prep_us),
                                gate_up_us: phase(|t| t.gate_up_us),
                                down_us: phase(|t| t.down_us),
                            });
                            bar.inc(1);
                        }
                    }
                }
            }
        }
    }
    bar.finish_and_clear();

    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        machine: Machine {
            cpu_model: cpu_model(),
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            llc_bytes: ft_kernels::stream::llc_bytes(),
            simd: p.simd,
            simd_detected: SimdLevel::detect(),
            wait: p.wait,
        },
        target_ratio: TARGET_RATIO,
        working_set_bytes: p.working_set,
        stream,
        results: rows,
    };
    if let Some(path) = &a.save_json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.save_csv {
        std::fs::write(path, csv(&report))
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

fn csv(r: &Report) -> String {
    let mut s = String::from(
        "model,format,path,threads,tokens_per_expert,experts_per_call,expert_bytes,calls,median_us,p10_us,p90_us,weight_gbs,weight_gbs_p10,weight_gbs_p90,stream_gbs,ratio,prep_us,gate_up_us,down_us\n",
    );
    for x in &r.results {
        s += &format!(
            "{},{},{},{},{},{},{},{},{:.1},{:.1},{:.1},{:.3},{:.3},{:.3},{:.3},{:.4},{:.1},{:.1},{:.1}\n",
            x.model,
            x.format,
            x.path,
            x.threads,
            x.tokens_per_expert,
            x.experts_per_call,
            x.expert_bytes,
            x.calls,
            x.median_us,
            x.p10_us,
            x.p90_us,
            x.weight_gbs,
            x.weight_gbs_p10,
            x.weight_gbs_p90,
            x.stream_gbs,
            x.ratio,
            x.prep_us,
            x.gate_up_us,
            x.down_us
        );
    }
    s
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
