//! The CPU expert step's weight bytes per second, beside the STREAM-style read bandwidth of
//! the same threads, measured in the same run (`ft bench cpu`).
//!
//! At one token per expert the step is memory-bound, so the ratio of the two says how close
//! the kernels come to what the host can read. Every call reads cold bytes: each (model,
//! format) bank holds enough distinct experts to be several times the last-level cache, and
//! calls rotate through it. The grid is models x formats x activation paths x threads x
//! tokens per expert x experts per call ([`CpuBenchPlan`]).

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::error::{KernelError, Result};
use crate::stream::{alloc_touched, quantile, stream_read, StreamRead};
use crate::{
    fill_expert_from_seed, ActivationPath, CpuExperts, ExpertWork, LayerTiming, SimdLevel, WaitMode,
};
use ft_model::{ExpertFormat, ModelSpec};

/// The share of STREAM read the issue asks of nvfp4 int8 at one token, 10 experts, all threads.
pub const TARGET_RATIO: f64 = 0.75;

/// Timed passes over the STREAM buffer per thread count.
const STREAM_REPEATS: usize = 10;

/// Seed of the synthetic experts (any fixed value: the bytes only need to be valid).
const BANK_SEED: u64 = 0x00F7_BE7C;

/// Largest tokens per expert of a configuration.
pub const MAX_TOKENS_PER_EXPERT: usize = 64;

/// The grid to measure and how long to measure each configuration.
#[derive(Debug, Clone)]
pub struct CpuBenchPlan {
    /// Models whose geometry is measured.
    pub models: Vec<ModelSpec>,
    /// Expert formats.
    pub formats: Vec<ExpertFormat>,
    /// Activation paths (a path a format lacks is skipped).
    pub paths: Vec<ActivationPath>,
    /// Tokens per expert (1 to [`MAX_TOKENS_PER_EXPERT`]).
    pub tokens: Vec<usize>,
    /// Experts per call (at least 1).
    pub experts: Vec<usize>,
    /// Thread counts (each at least 1).
    pub threads: Vec<usize>,
    /// SIMD level the kernels run at.
    pub simd: SimdLevel,
    /// Bytes of distinct experts per (model, format).
    pub working_set: u64,
    /// STREAM buffer bytes.
    pub stream_bytes: u64,
    /// Least timed calls per configuration.
    pub min_repeats: usize,
    /// Most timed calls per configuration.
    pub max_repeats: usize,
    /// Least time per configuration, s (repeats continue until both minimums are met).
    pub min_time_s: f64,
    /// How the calling thread waits for a layer call.
    pub wait: WaitMode,
}

impl CpuBenchPlan {
    /// Every size in range and every format valid for every model's geometry, with the flag
    /// that sets it in each error.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, reason: String| KernelError::Invalid {
            field: field.to_string(),
            reason,
        };
        for m in &self.models {
            for f in &self.formats {
                m.geometry.validate(*f).map_err(|e| {
                    invalid(
                        &format!("--model {} in --format {f}", m.name),
                        e.to_string(),
                    )
                })?;
            }
        }
        if let Some(t) = self
            .tokens
            .iter()
            .find(|&&t| t == 0 || t > MAX_TOKENS_PER_EXPERT)
        {
            return Err(invalid(
                &format!("--tokens {t}"),
                format!("tokens per expert must be 1 to {MAX_TOKENS_PER_EXPERT}"),
            ));
        }
        if self.experts.contains(&0) {
            return Err(invalid(
                "--experts 0",
                "a call needs at least one expert".into(),
            ));
        }
        if self.threads.contains(&0) {
            return Err(invalid("--threads", "0 after resolution".into()));
        }
        if self.working_set == 0 || self.stream_bytes == 0 {
            return Err(invalid(
                "--working-set-mib and --stream-mib",
                "must be greater than zero".into(),
            ));
        }
        if !self.simd.available() {
            return Err(invalid(
                "--simd",
                format!(
                    "{}: this CPU supports at most {}",
                    self.simd,
                    SimdLevel::detect()
                ),
            ));
        }
        Ok(())
    }

    /// Configurations measured (including those of paths a format lacks, skipped).
    pub fn configurations(&self) -> usize {
        self.models.len()
            * self.formats.len()
            * self.paths.len()
            * self.threads.len()
            * self.tokens.len()
            * self.experts.len()
    }
}

/// What a running bench reports, for a progress display.
#[derive(Debug, Clone, PartialEq)]
pub enum BenchProgress {
    /// What it is doing now.
    Doing(String),
    /// This many more configurations are done (or skipped).
    Done(u64),
}

/// Host facts recorded with the results.
#[derive(Debug, Serialize)]
pub struct Machine {
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Logical CPUs available to this process.
    pub logical_cpus: usize,
    /// Last-level cache, bytes (0 if unknown).
    pub llc_bytes: u64,
    /// SIMD level the kernels ran at.
    pub simd: SimdLevel,
    /// Widest SIMD level detected.
    pub simd_detected: SimdLevel,
    /// How the caller waited for each call.
    pub wait: WaitMode,
}

/// STREAM read of one thread count.
#[derive(Debug, Serialize)]
pub struct StreamRow {
    pub threads: usize,
    /// Buffer bytes.
    pub bytes: u64,
    /// Median read bandwidth, GB/s (1e9 B/s).
    pub median_gbs: f64,
    /// Slowest and fastest repeats, GB/s.
    pub min_gbs: f64,
    pub max_gbs: f64,
}

/// One configuration's result.
#[derive(Debug, Serialize, Clone)]
pub struct Row {
    pub model: String,
    pub format: ExpertFormat,
    pub path: ActivationPath,
    pub threads: usize,
    pub tokens_per_expert: usize,
    pub experts_per_call: usize,
    /// Bytes of one expert.
    pub expert_bytes: u64,
    /// Timed calls.
    pub calls: usize,
    /// Time per call, microseconds: median, 10th and 90th percentiles.
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    /// Weight bytes per second at the median call time, GB/s (1e9 B/s).
    pub weight_gbs: f64,
    /// At the 90th and 10th percentile times (slow and fast end), GB/s.
    pub weight_gbs_p10: f64,
    pub weight_gbs_p90: f64,
    /// STREAM read of the same threads, GB/s.
    pub stream_gbs: f64,
    /// weight_gbs / stream_gbs.
    pub ratio: f64,
    /// Median phase times inside the pool, us: activation quantization, gate/up, down.
    pub prep_us: f64,
    pub gate_up_us: f64,
    pub down_us: f64,
}

/// The whole report (`ft bench cpu --json`).
#[derive(Debug, Serialize)]
pub struct Report {
    pub version: &'static str,
    pub machine: Machine,
    /// Target ratio for the headline configuration.
    pub target_ratio: f64,
    pub working_set_bytes: u64,
    pub stream: Vec<StreamRow>,
    pub results: Vec<Row>,
}

impl Report {
    /// One CSV row per configuration, with a header.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "model,format,path,threads,tokens_per_expert,experts_per_call,expert_bytes,calls,median_us,p10_us,p90_us,weight_gbs,weight_gbs_p10,weight_gbs_p90,stream_gbs,ratio,prep_us,gate_up_us,down_us\n",
        );
        for x in &self.results {
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
}

/// `model name` of `/proc/cpuinfo` (`unknown` elsewhere).
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
    p: &CpuBenchPlan,
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

/// Measure the grid of `p`, reporting progress to `progress`.
pub fn run_cpu_bench(p: &CpuBenchPlan, progress: &mut dyn FnMut(BenchProgress)) -> Result<Report> {
    p.validate()?;
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
        .ok_or_else(|| KernelError::Invalid {
            field: "--threads".into(),
            reason: "no thread count".into(),
        })?;

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

    let need = *p.experts.iter().max().unwrap_or(&1);
    let mut rows = Vec::new();
    for m in &p.models {
        for &f in &p.formats {
            progress(BenchProgress::Doing(format!("filling {} {f}", m.name)));
            let bank = fill_bank(&widest, m, f, p.working_set, need)?;
            let mut cursor = 0;
            for &path in &p.paths {
                if !path.supports(f) {
                    progress(BenchProgress::Done(
                        (p.threads.len() * p.tokens.len() * p.experts.len()) as u64,
                    ));
                    continue;
                }
                for (ki, k) in kernels.iter_mut().enumerate() {
                    for &tok in &p.tokens {
                        for &ne in &p.experts {
                            progress(BenchProgress::Doing(format!(
                                "{} {f} {path} t{} x{tok} e{ne}",
                                m.name,
                                k.threads()
                            )));
                            let (times, phases) =
                                measure(k, p, m, f, path, &bank, &mut cursor, tok, ne)?;
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
                            progress(BenchProgress::Done(1));
                        }
                    }
                }
            }
        }
    }
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        machine: Machine {
            cpu_model: cpu_model(),
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            llc_bytes: crate::stream::llc_bytes(),
            simd: p.simd,
            simd_detected: SimdLevel::detect(),
            wait: p.wait,
        },
        target_ratio: TARGET_RATIO,
        working_set_bytes: p.working_set,
        stream,
        results: rows,
    };
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_plan() -> CpuBenchPlan {
        CpuBenchPlan {
            models: vec![ModelSpec::preset("qwen3.8-flash-next").unwrap()],
            formats: vec![ExpertFormat::Nvfp4],
            paths: vec![ActivationPath::F32],
            tokens: vec![1],
            experts: vec![1, 2],
            threads: vec![1],
            simd: SimdLevel::detect(),
            working_set: 1 << 20,
            stream_bytes: 1 << 20,
            min_repeats: 1,
            max_repeats: 2,
            min_time_s: 0.0,
            wait: WaitMode::Spin,
        }
    }

    /// A two-configuration grid: every row's rates follow from its times and bytes, the
    /// progress counts every configuration, the CSV has a row each.
    #[test]
    fn a_tiny_grid_reports_consistent_rows() {
        let p = tiny_plan();
        let mut done = 0;
        let r = run_cpu_bench(&p, &mut |e| {
            if let BenchProgress::Done(n) = e {
                done += n;
            }
        })
        .unwrap();
        assert_eq!(done as usize, p.configurations());
        assert_eq!(r.results.len(), 2);
        assert_eq!(r.stream.len(), 1);
        for x in &r.results {
            let bytes = (x.expert_bytes * x.experts_per_call as u64) as f64;
            assert!(
                (x.weight_gbs - bytes / (x.median_us * 1e-6) / 1e9).abs()
                    < 1e-9 * x.weight_gbs.max(1.0)
            );
            assert!((x.ratio - x.weight_gbs / x.stream_gbs).abs() < 1e-12);
            assert!((1..=2).contains(&x.calls));
            assert!(x.p10_us <= x.median_us && x.median_us <= x.p90_us);
        }
        let csv = r.csv();
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.starts_with("model,format,path,threads,"));
    }

    #[test]
    fn a_bad_grid_is_refused_naming_its_flag() {
        for (edit, want) in [
            (
                (|p: &mut CpuBenchPlan| p.tokens = vec![65]) as fn(&mut CpuBenchPlan),
                "--tokens",
            ),
            (|p: &mut CpuBenchPlan| p.experts = vec![0], "--experts"),
            (
                |p: &mut CpuBenchPlan| p.working_set = 0,
                "--working-set-mib",
            ),
        ] {
            let mut p = tiny_plan();
            edit(&mut p);
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert!(run_cpu_bench(&p, &mut |_| {}).is_err());
        }
    }
}
