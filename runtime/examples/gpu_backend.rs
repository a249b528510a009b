//! The GPU backend's micro-bench (experiments/gpu-backend/): how close the gather and the
//! expert kernel come to the same run's ceilings.
//!
//! - device copy bandwidth: one device-to-device copy of `COPY_BYTES`;
//! - linear pinned H2D of `n` experts' bytes, and the gather of `n` scattered experts of the
//!   served model (copy engine and zero-copy), `n` in 8..64; target: gather >= 90% of linear;
//! - the expert kernel for a layer of 10 resident experts at 1 token (f32 and int8 paths),
//!   rotating through disjoint expert sets so that the weights are not L2-resident; target:
//!   expert bytes / time >= 50% of the device copy bandwidth, launch included: the time is
//!   the device's per launch of a batch queued behind a hold (`queued us`: the gaps between
//!   launches count, the host's enqueue cost does not, as in a decode step the host runs
//!   ahead of); `event us` is one launch on an idle stream, the host's latency included;
//! - the dense kernel's read bandwidth.
//!
//! Usage: `gpu_backend [--device cuda|host] [--out DIR] [--reps N]`. Writes `gpu_backend.json`
//! and `gpu_backend.csv` under DIR (default `.`) and prints a table; GB/s = 1e9 B/s.

use std::io::Write;
use std::time::Instant;

use ft_kernels::stream::median;
use ft_kernels::ActivationPath;
use ft_model::cache::SlotId;
use ft_model::{ExpertFormat, ExpertId};
use ft_runtime::bank::HostBank;
use ft_runtime::block_stamps::{self, batch_timeline, BatchTimeline, BlockStamp};
use ft_runtime::dense::{DenseRead, DENSE_OUT_BYTES};
use ft_runtime::device::tuning::CUDA_EXPERT_PATH;
use ft_runtime::device::{CopySubmit, CudaTuning};
use ft_runtime::gather::{self, GatherMethod};
use ft_runtime::gpu_experts::{ExpertStep, ExpertTask, TokenWeight};
use ft_runtime::slots::SlotPool;
use serde::Serialize;

mod common;

/// Most tokens per expert of a kernel case (the x and y buffers hold this many).
const MAX_TOKENS: usize = 8;
/// Bytes of the device copy that sets the ceiling (1 GiB: far beyond L2).
const COPY_BYTES: usize = 1 << 30;
/// Bytes the dense kernel reads per launch (256 MiB).
const DENSE_BYTES: usize = 256 << 20;
/// Bytes of the dense read at a layer's size: a decode layer's dense part before the router
/// reads 33 to 36 MB at one and two streams of qwen3.8-flash-next (attention, router, KV at
/// context 1024).
const DENSE_LAYER_BYTES: usize = 32 << 20;
/// Experts of the kernel's layer (the target's "layer of 10 resident experts").
const LAYER_EXPERTS: usize = 10;
/// The gather target: the best gather's rate over the same run's linear pinned copy.
const GATHER_TARGET: f64 = 0.9;
/// The kernel target: the layer's weight bytes per second over the same run's device copy
/// read+write rate.
const KERNEL_TARGET: f64 = 0.5;
/// Disjoint layers of experts rotated through (6 x 27.7 MB, about 3 x the H200's L2).
const ROTATE_LAYERS: usize = 6;
/// Launches of a queued batch, and the hold queued before it (long enough for the host to
/// queue the batch at about 20 us a launch).
const QUEUE_BATCH: usize = 12;
const QUEUE_HOLD_US: f64 = 1500.0;

/// The device's time per launch of a batch of [`QUEUE_BATCH`] launches (`launch(j)`, j the
/// launch's index) queued behind a hold: launch gaps included, the host's cost of queueing
/// them not. What a decode step sees, since the host runs ahead of the GPU.
fn queued_batch_us(
    s: &ft_runtime::device::Stream,
    start: &ft_runtime::device::Event,
    end: &ft_runtime::device::Event,
    launch: impl Fn(usize) -> ft_runtime::Result<()>,
) -> ft_runtime::Result<f64> {
    s.hold_us(QUEUE_HOLD_US)?;
    let us = s.time_us(start, end, || (0..QUEUE_BATCH).try_for_each(&launch))?;
    Ok(us / QUEUE_BATCH as f64)
}
/// Gather sizes, experts.
const GATHER_SIZES: [usize; 4] = [8, 16, 32, 64];

#[derive(Debug, Serialize)]
struct GatherRow {
    experts: usize,
    bytes: u64,
    linear_h2d_gbs: f64,
    copy_engine_gbs: f64,
    zero_copy_gbs: f64,
    /// The copy engines with the gather's copies in one batched call (`CopySubmit::Batch`;
    /// equal to one copy each where the driver lacks it): the runtime's submission, so a
    /// candidate for `best`.
    copy_batch_gbs: f64,
    best: String,
    best_over_linear: f64,
    target: f64,
    pass: bool,
}

#[derive(Debug, Serialize)]
struct KernelRow {
    act: String,
    experts: usize,
    tokens: usize,
    /// Tokens per pass of the kernel instantiation: "auto" (chosen by the launch) or forced.
    variant: String,
    /// The kernels' path (`CudaTuning::expert_path`): the one path, `+stamps` where the
    /// block timelines were compiled in.
    path: String,
    bytes: u64,
    /// Device time per launch with the queue kept full: a batch of launches queued behind a
    /// hold, timed between events around the batch (launch gaps included, the host's
    /// enqueue cost not); what the GB/s and the target use.
    queued_us: f64,
    /// Events around one launch on an idle stream: the host's enqueue latency included.
    event_us: f64,
    wall_us: f64,
    /// Host time of the launch call itself (tables, argument packing, two launches).
    enqueue_us: f64,
    /// The last queued batch's block timelines (`--stamps`).
    #[serde(skip_serializing_if = "Option::is_none")]
    stamps: Option<BatchTimeline>,
    event_gbs: f64,
    over_copy_rw: f64,
    over_copy_bytes: f64,
    target: f64,
    pass: bool,
}

/// Host time to queue one call, us (median-free: the mean of 200 back-to-back calls).
#[derive(Debug, Serialize)]
struct Enqueue {
    add_kernel_us: f64,
    event_record_us: f64,
    expert_launch_us: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    device: ft_runtime::device::DeviceInfo,
    model: String,
    expert_bytes: u64,
    /// Device copy: (bytes read + bytes written) / time, GB/s.
    copy_rw_gbs: f64,
    /// Device copy: bytes copied / time, GB/s.
    copy_gbs: f64,
    dense_read_gbs: f64,
    /// The dense read at a layer's size (`DENSE_LAYER_BYTES`), queued as the engine runs it,
    /// GB/s: where the memory pipeline's fill and drain weigh more than in a 256 MiB read.
    dense_read_layer_gbs: f64,
    gather: Vec<GatherRow>,
    kernel: Vec<KernelRow>,
    /// What the default path's one-token layer could reach at best (`KernelFloor`); absent
    /// when a run lacks its rows (`--only`).
    floor: Option<KernelFloor>,
    enqueue: Enqueue,
}

/// The kernel target against this run's own floors, for the default path's one-token layer of
/// the target's experts: the same layer with no work (its launches and fixed work) plus its
/// weights read at the run's dense-read rate is the least time any arrangement of this
/// layer's launches can take, so its share of the copy's read+write rate is the most the
/// target can get without removing launches.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct KernelFloor {
    path: String,
    /// Queued time of the layer with no tokens, us.
    fixed_us: f64,
    /// The layer's weight bytes at the dense-read rate, us.
    memory_us: f64,
    /// fixed_us + memory_us.
    floor_us: f64,
    /// The layer's bytes over floor_us, as a share of the copy's read+write rate.
    floor_over_copy_rw: f64,
    /// The layer's time at the target ([`KERNEL_TARGET`] of the copy's read+write rate), us.
    target_us: f64,
    /// The measured one-token layer, us.
    measured_us: f64,
}

/// The floor of `path`'s one-token layer of `experts` experts from a run's kernel rows (int8,
/// auto variant, 1 and 0 tokens), or None without both rows.
fn kernel_floor(
    rows: &[KernelRow],
    path: &str,
    experts: usize,
    dense_read_gbs: f64,
    copy_rw_gbs: f64,
) -> Option<KernelFloor> {
    let row = |tokens: usize| {
        rows.iter().find(|r| {
            r.act == "int8"
                && r.variant == "auto"
                && r.path == path
                && r.experts == experts
                && r.tokens == tokens
        })
    };
    let (one, none) = (row(1)?, row(0)?);
    let gb = one.bytes as f64 / 1e3; // bytes / (GB/s) in us: bytes / 1e3 / GB/s
    let memory_us = gb / dense_read_gbs;
    let floor_us = none.queued_us + memory_us;
    Some(KernelFloor {
        path: path.to_string(),
        fixed_us: none.queued_us,
        memory_us,
        floor_us,
        floor_over_copy_rw: gb / floor_us / copy_rw_gbs,
        target_us: gb / (KERNEL_TARGET * copy_rw_gbs),
        measured_us: one.queued_us,
    })
}

/// The GPU backend against its ceilings (module docs).
#[derive(clap::Parser)]
struct Args {
    #[command(flatten)]
    bench: common::BenchArgs,
    /// Run only the expert-kernel case of this key, act/tokens/variant/path/experts as the
    /// kernel table prints them (e.g. int8/1/auto/staged+pdl+split+cvt+wide/10), so that a
    /// profiler sees that case's launches first (scripts/ncu-experts.sh). The ceilings and
    /// gathers still run; a key that names no case is an error. Several keys: comma-separated.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Build the expert kernels with block timelines (`FT_CUDA_STAMPS`) and record the last
    /// queued batch of each case: its phases in the table below the kernel table and in the
    /// JSON (`stamps`), every block's record in `stamps-<case>.csv`. The stamps cost each
    /// block a few hundred nanoseconds, so compare times with a run without them.
    #[arg(long)]
    stamps: bool,
    /// Print the block timelines of `stamps-*.csv` files an earlier `--stamps` run wrote,
    /// and nothing else (no device is opened).
    #[arg(long, num_args = 1.., value_name = "CSV")]
    analyze_stamps: Vec<std::path::PathBuf>,
}

/// An expert-kernel case: (act, tokens per expert, forced variant, path, experts of the
/// layer).
type KernelCase = (ActivationPath, usize, Option<usize>, &'static str, usize);

/// The expert-kernel cases of the table, in order.
fn kernel_cases() -> Vec<KernelCase> {
    // (act, tokens per expert, forced variant, path, experts of the layer; ALL: the
    // target's 10): 0 tokens runs both kernels with no work (the fixed cost: two launches,
    // the ticket); the forced rows compare the instantiations on the same launch (A/B in one
    // run). The kernel paths measured against this one have their rows in the results that
    // experiments/gpu-backend/README.md, "Removed switches", lists.
    const F32: ActivationPath = ActivationPath::F32;
    const INT8: ActivationPath = ActivationPath::Int8;
    const ALL: usize = LAYER_EXPERTS;
    const P: &str = CUDA_EXPERT_PATH;
    #[rustfmt::skip]
    let cases = vec![
        (F32, 1, None, P, ALL),
        (INT8, 1, None, P, ALL),
        (INT8, 1, Some(8), P, ALL),
        (INT8, 0, None, P, ALL),
        (INT8, 4, None, P, ALL),
        (INT8, 4, Some(8), P, ALL),
        (INT8, 8, None, P, ALL),
        (F32, 8, None, P, ALL),
        // Small grids (fewer gate/up blocks than multiprocessors): one and two experts, as
        // the last fetched chunk of a layer launches them.
        (INT8, 1, None, P, 1),
        (INT8, 1, None, P, 2),
    ];
    cases
}

/// The tuning of a case: `forced` as its variant, the rest as `opened`; its path must be
/// the kernels' one path ([`CUDA_EXPERT_PATH`]).
fn case_tuning(
    path: &str,
    forced: Option<usize>,
    opened: CudaTuning,
) -> ft_runtime::Result<CudaTuning> {
    if path != CUDA_EXPERT_PATH {
        return Err(ft_runtime::RuntimeError::invalid(
            format!("expert path '{path}'"),
            format!("the expert kernels have one path, {CUDA_EXPERT_PATH}"),
        ));
    }
    Ok(CudaTuning {
        expert_variant: forced,
        ..opened
    })
}

/// Every block's record of a case's last queued batch, ns from its first start, in
/// `stamps-<act>-t<tokens>-v<variant>-<path>-e<experts>.csv`.
fn write_stamps(
    out: &std::path::Path,
    &(act, tokens, forced, path, n): &KernelCase,
    records: &[BlockStamp],
) -> ft_runtime::Result<()> {
    let variant = variant_name(forced);
    let name = format!("stamps-{}-t{tokens}-v{variant}-{path}-e{n}.csv", act.name());
    block_stamps::write_csv(&out.join(name), records)
}

/// The block timelines of the cases that have them (`--stamps`), us.
fn print_timelines(rows: &[KernelRow]) {
    let timed: Vec<(String, &BatchTimeline)> = rows
        .iter()
        .filter_map(|r| {
            r.stamps.as_ref().map(|t| {
                let key = row_key(&r.act, r.tokens, &r.variant, &r.path, r.experts);
                (key, t)
            })
        })
        .collect();
    print_timeline_table(&timed);
}

/// A table of block timelines, one row per labelled batch, us.
fn print_timeline_table(timed: &[(String, &BatchTimeline)]) {
    if timed.is_empty() {
        return;
    }
    println!(
        "block timelines, us from a launch's first block start (medians over a queued batch's launches after its first; gate/up: entry spread, tiles landed, compute, last end; down: first start, waiting for h, tiles, compute, ticket and combine, last end)"
    );
    println!(
        "{:>48} {:>7} {:>6} {:>6} | {:>5} {:>6} {:>6} {:>6} {:>6} | {:>5} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} | {:>5} {:>5}",
        "case", "period", "span", "gap",
        "gu n", "spread", "tiles", "work", "end",
        "dn n", "first", "h wait", "tiles", "work", "tail", "end",
        "step", "GHz"
    );
    let us = |ns: f64| ns / 1e3;
    for (r, t) in timed {
        let (gn, gs, gt, gw, ge) =
            t.gate_up
                .map_or((0, f64::NAN, f64::NAN, f64::NAN, f64::NAN), |p| {
                    (
                        p.blocks,
                        us(p.last_entry_ns - p.first_entry_ns),
                        us(p.median_ready_ns),
                        us(p.median_work_ns),
                        us(p.last_exit_ns),
                    )
                });
        let (dn, df, dc, dt, dw, dl, de) = t.down.map_or(
            (
                0,
                f64::NAN,
                f64::NAN,
                f64::NAN,
                f64::NAN,
                f64::NAN,
                f64::NAN,
            ),
            |p| {
                (
                    p.blocks,
                    us(p.first_entry_ns),
                    us(p.median_condition_ns),
                    us(p.median_ready_ns),
                    us(p.median_work_ns),
                    us(p.median_tail_ns),
                    us(p.last_exit_ns),
                )
            },
        );
        println!(
            "{:>48} {:>7.2} {:>6.2} {:>6.2} | {:>5} {:>6.2} {:>6.2} {:>6.2} {:>6.2} | {:>5} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2} | {:>5} {:>5.2}",
            r,
            us(t.median_period_ns), us(t.median_span_ns), us(t.median_gap_ns),
            gn, gs, gt, gw, ge, dn, df, dc, dt, dw, dl, de,
            t.timer_step_ns.map_or("?".into(), |s| s.to_string()),
            t.sm_clock_ghz.unwrap_or(f64::NAN)
        );
    }
}

/// A case's key for `--only`: act/tokens/variant/path/experts.
fn case_key(&(act, tokens, forced, path, n): &KernelCase) -> String {
    row_key(act.name(), tokens, &variant_name(forced), path, n)
}

/// A kernel row's key, as the table prints it: act/tokens/variant/path/experts.
fn row_key(act: &str, tokens: usize, variant: &str, path: &str, experts: usize) -> String {
    format!("{act}/{tokens}/{variant}/{path}/{experts}")
}

/// A forced instantiation's name in keys and rows ("auto": chosen by each launch).
fn variant_name(forced: Option<usize>) -> String {
    forced.map_or("auto".to_string(), |v| v.to_string())
}

fn main() -> std::process::ExitCode {
    common::exit(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let Args {
        bench,
        only,
        stamps,
        analyze_stamps,
    } = clap::Parser::parse();
    if !analyze_stamps.is_empty() {
        let mut timed = Vec::new();
        for p in &analyze_stamps {
            let label = p.file_name().map_or(p.display().to_string(), |n| {
                n.to_string_lossy().into_owned()
            });
            timed.push((label, batch_timeline(&block_stamps::read_csv(p)?)));
        }
        let rows: Vec<(String, &BatchTimeline)> =
            timed.iter().map(|(l, t)| (l.clone(), t)).collect();
        print_timeline_table(&rows);
        return Ok(());
    }
    let keys: Vec<String> = kernel_cases().iter().map(case_key).collect();
    for k in &only {
        if !keys.contains(k) {
            return Err(format!(
                "--only {k}: no such case; the cases are {}",
                keys.join(", ")
            )
            .into());
        }
    }
    let common::Bench {
        device: d,
        small,
        out,
        reps,
        spec,
        compute: s,
        copy: c,
        events: (e0, e1),
    } = bench.open()?;
    // The rows' paths, set on a CUDA device (the host device has one path).
    let opened = d.cuda_tuning().unwrap_or_default();
    let tune = |t: CudaTuning| -> Result<(), Box<dyn std::error::Error>> {
        if d.cuda_tuning().is_some() {
            d.set_cuda_tuning(t)?;
        }
        Ok(())
    };
    let eb = spec.expert_bytes();
    d.warm_up_kernels(&[
        &ExpertStep::new(ExpertFormat::Nvfp4, &spec.geometry, ActivationPath::F32, 0),
        &ExpertStep::new(ExpertFormat::Nvfp4, &spec.geometry, ActivationPath::Int8, 0),
    ])?;

    // Device copy ceiling.
    let copy_bytes = if small { 64 << 20 } else { COPY_BYTES };
    let a = d.alloc(copy_bytes, "copy a")?;
    let b = d.alloc(copy_bytes, "copy b")?;
    let mut t = Vec::new();
    for r in 0..=reps.min(10) {
        let us = s.time_us(&e0, &e1, || s.copy_d2d(&a, 0, &b, 0, copy_bytes))?;
        if r > 0 {
            t.push(us);
        }
    }
    let copy_us = median(&t);
    let copy_gbs = copy_bytes as f64 / (copy_us * 1e3);
    let copy_rw_gbs = 2.0 * copy_gbs;

    // Dense read.
    let dense_bytes = if small { 32 << 20 } else { DENSE_BYTES };
    let out_buf = d.alloc(DENSE_OUT_BYTES, "dense out")?;
    let reads = [DenseRead {
        buffer: &a,
        offset: 0,
        bytes: dense_bytes,
    }];
    let mut t = Vec::new();
    for r in 0..=reps.min(10) {
        let us = s.time_us(&e0, &e1, || s.launch_dense(&reads, &out_buf))?;
        if r > 0 {
            t.push(us);
        }
    }
    let dense_read_gbs = dense_bytes as f64 / (median(&t) * 1e3);
    // The same kernel at a layer's size, a batch queued behind a hold, each launch reading its
    // own window of the copy buffer (no launch finds its bytes in L2).
    let layer_bytes = if small { 4 << 20 } else { DENSE_LAYER_BYTES };
    assert!(
        QUEUE_BATCH * layer_bytes <= copy_bytes,
        "the windows fit the copy buffer"
    );
    let mut t = Vec::new();
    for r in 0..=reps.min(10) {
        let us = queued_batch_us(&s, &e0, &e1, |j| {
            let window = [DenseRead {
                buffer: &a,
                offset: j * layer_bytes,
                bytes: layer_bytes,
            }];
            s.launch_dense(&window, &out_buf)
        })?;
        if r > 0 {
            t.push(us);
        }
    }
    let dense_read_layer_gbs = layer_bytes as f64 / (median(&t) * 1e3);
    drop((a, b));

    // Gather vs linear H2D.
    let max_n = *GATHER_SIZES.iter().max().unwrap_or(&64);
    let bank_experts = if small { 2 * max_n } else { 8 * max_n };
    let g = ft_model::MoeGeometry {
        experts: bank_experts,
        moe_layers: 1,
        ..spec.geometry
    };
    let bank = HostBank::from_seed(&d, spec.format, &g, 11)?;
    let pool = SlotPool::new(&d, eb, max_n.max(LAYER_EXPERTS * ROTATE_LAYERS), 0)?;
    let lin_dst = d.alloc(max_n * eb as usize, "linear destination")?;
    let mut grows = Vec::new();
    let mut first = 0usize;
    for &n in &GATHER_SIZES {
        let bytes = n as u64 * eb;
        let mut lin = Vec::new();
        for r in 0..=reps {
            let src = ((first * eb as usize) % (bank.buffer().len() - bytes as usize)) & !4095;
            first = (first + n) % bank_experts;
            c.record(&e0)?;
            c.copy_h2d(bank.buffer(), src, &lin_dst, 0, bytes as usize)?;
            c.record(&e1)?;
            e1.synchronize()?;
            if r > 0 {
                lin.push(bytes as f64 / (e0.elapsed_us(&e1)? * 1e3));
            }
        }
        let mut per = Vec::new();
        // The two methods, then the copy engines again with batched submission.
        let ways = GatherMethod::ALL
            .into_iter()
            .map(|m| (m, CopySubmit::Each))
            .chain([(GatherMethod::CopyEngine, CopySubmit::Batch)]);
        for (m, copies) in ways {
            tune(CudaTuning { copies, ..opened })?;
            let mut v = Vec::new();
            for r in 0..=reps {
                // Scattered sources (every other expert), scattered slots (reversed).
                let moves: Vec<_> = (0..n)
                    .map(|i| {
                        (
                            ExpertId::new(0, (first + 2 * i) % bank_experts),
                            SlotId((n - 1 - i) as u32),
                        )
                    })
                    .collect();
                first = (first + 2 * n) % bank_experts;
                let us = gather::time_gather(&d, &c, &bank, &pool, &moves, m, 1)?[0];
                if r > 0 {
                    v.push(bytes as f64 / (us * 1e3));
                }
            }
            per.push(median(&v));
        }
        let linear = median(&lin);
        // The fastest of what the runtime can run without a switch set against its default.
        let (best, best_gbs) = [
            ("copy-engine", per[0]),
            ("zero-copy", per[1]),
            ("copy-batch", per[2]),
        ]
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("three candidates");
        grows.push(GatherRow {
            experts: n,
            bytes,
            linear_h2d_gbs: linear,
            copy_engine_gbs: per[0],
            zero_copy_gbs: per[1],
            copy_batch_gbs: per[2],
            best: best.into(),
            best_over_linear: best_gbs / linear,
            target: GATHER_TARGET,
            pass: best_gbs / linear >= GATHER_TARGET,
        });
    }
    tune(opened)?;
    drop(lin_dst);

    // Expert kernel: layers of 10 resident experts, 1 token, rotating through disjoint sets.
    let x = d.alloc(MAX_TOKENS * spec.geometry.hidden * 4, "x")?;
    let y = d.alloc(MAX_TOKENS * spec.geometry.hidden * 4, "y")?;
    s.upload_f32(&vec![0.25f32; MAX_TOKENS * spec.geometry.hidden], &x, 0)?;
    let moves: Vec<_> = (0..LAYER_EXPERTS * ROTATE_LAYERS)
        .map(|i| (ExpertId::new(0, i % bank_experts), SlotId(i as u32)))
        .collect();
    gather::gather(&c, &bank, &pool, &moves, GatherMethod::CopyEngine)?;
    c.synchronize()?;
    let mut krows = Vec::new();
    let cases = kernel_cases();
    for case in cases {
        if !only.is_empty() && !only.contains(&case_key(&case)) {
            continue;
        }
        let (act, tokens, forced, path, layer_experts) = case;
        let tuning = CudaTuning {
            block_stamps: stamps,
            ..case_tuning(path, forced, opened)?
        };
        tune(tuning)?;
        let steps: Vec<ExpertStep> = (0..ROTATE_LAYERS)
            .map(|l| {
                let mut st =
                    ExpertStep::new(ExpertFormat::Nvfp4, &spec.geometry, act, tokens.max(1));
                st.experts = (0..layer_experts)
                    .map(|e| ExpertTask {
                        weights_offset: (l * LAYER_EXPERTS + e) * pool.stride(),
                        tokens: (0..tokens)
                            .map(|t| TokenWeight {
                                token: t as u32,
                                weight: 0.1,
                            })
                            .collect(),
                    })
                    .collect();
                st
            })
            .collect();
        let (mut ev, mut wall, mut enqueue) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..=reps * 2 {
            let st = &steps[r % ROTATE_LAYERS];
            let t0 = Instant::now();
            s.record(&e0)?;
            s.launch_experts(st, pool.buffer(), &x, &y)?;
            let enq = t0.elapsed().as_secs_f64() * 1e6;
            s.record(&e1)?;
            e1.synchronize()?;
            let w = t0.elapsed().as_secs_f64() * 1e6;
            if r > 0 {
                ev.push(e0.elapsed_us(&e1)?);
                wall.push(w);
                enqueue.push(enq);
            }
        }
        let (ev, wall, enqueue) = (median(&ev), median(&wall), median(&enqueue));
        // The same launches queued back to back behind a hold long enough for the host to
        // queue the whole batch: the device's time per launch.
        let mut queued = Vec::new();
        let mut timeline = None;
        let last = reps.min(10);
        for r in 0..=last {
            if stamps && r == last {
                // Only the last batch's records (the earlier launches' are dropped).
                d.take_block_stamps()?;
            }
            let us = queued_batch_us(&s, &e0, &e1, |j| {
                s.launch_experts(&steps[(r + j) % ROTATE_LAYERS], pool.buffer(), &x, &y)
            })?;
            if r > 0 {
                queued.push(us);
            }
            if stamps && r == last {
                let got = d.take_block_stamps()?;
                if got.dropped > 0 {
                    tracing::warn!(
                        dropped = got.dropped,
                        "block stamps past the kernels' capacity"
                    );
                }
                write_stamps(&out, &case, &got.records)?;
                timeline = Some(batch_timeline(&got.records));
            }
        }
        let queued_us = median(&queued);
        let bytes = layer_experts as u64 * eb;
        let gbs = bytes as f64 / (queued_us * 1e3);
        krows.push(KernelRow {
            act: act.name().into(),
            experts: layer_experts,
            tokens,
            variant: variant_name(forced),
            path: tuning.expert_path(),
            bytes,
            queued_us,
            event_us: ev,
            wall_us: wall,
            enqueue_us: enqueue,
            stamps: timeline,
            event_gbs: gbs,
            over_copy_rw: gbs / copy_rw_gbs,
            over_copy_bytes: gbs / copy_gbs,
            target: KERNEL_TARGET,
            pass: gbs / copy_rw_gbs >= KERNEL_TARGET,
        });
    }
    tune(opened)?;

    // Host cost of queueing work, us per call (the GPU kept busy behind them is not
    // waited for): a one-element add kernel, an event record, and a 1-token expert launch.
    let enqueue = {
        let per_call = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| {
            let n = 200;
            let t0 = Instant::now();
            for _ in 0..n {
                f()?;
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
            s.synchronize()?;
            Ok::<f64, Box<dyn std::error::Error>>(us)
        };
        let add_us = per_call(&mut || Ok(s.add_f32(&y, 0, &x, 0, 1)?))?;
        let record_us = per_call(&mut || Ok(s.record(&e0)?))?;
        let mut st = ExpertStep::new(ExpertFormat::Nvfp4, &spec.geometry, ActivationPath::Int8, 1);
        st.experts = (0..LAYER_EXPERTS)
            .map(|e| ExpertTask {
                weights_offset: e * pool.stride(),
                tokens: vec![TokenWeight {
                    token: 0,
                    weight: 0.1,
                }],
            })
            .collect();
        let experts_us = per_call(&mut || Ok(s.launch_experts(&st, pool.buffer(), &x, &y)?))?;
        Enqueue {
            add_kernel_us: add_us,
            event_record_us: record_us,
            expert_launch_us: experts_us,
        }
    };

    let report = Report {
        device: d.info(),
        model: spec.name.clone(),
        expert_bytes: eb,
        copy_rw_gbs,
        copy_gbs,
        dense_read_gbs,
        dense_read_layer_gbs,
        floor: kernel_floor(
            &krows,
            &CudaTuning::default().expert_path(),
            LAYER_EXPERTS,
            dense_read_gbs,
            copy_rw_gbs,
        ),
        gather: grows,
        kernel: krows,
        enqueue,
    };
    common::write_json(&out, "gpu_backend.json", &report)?;
    let mut csv = std::fs::File::create(out.join("gpu_backend.csv"))?;
    writeln!(csv, "kind,size,a_gbs,b_gbs,c_gbs,ratio,target,pass")?;
    for r in &report.gather {
        writeln!(
            csv,
            "gather,{},{:.3},{:.3},{:.3},{:.4},{},{}",
            r.experts,
            r.linear_h2d_gbs,
            r.copy_engine_gbs,
            r.zero_copy_gbs,
            r.best_over_linear,
            r.target,
            r.pass
        )?;
        // The copy engines with batched submission, against the same linear copy.
        let gbs = r.copy_batch_gbs;
        writeln!(
            csv,
            "gather-batch,{},{:.3},{:.3},{:.3},{:.4},{},{}",
            r.experts,
            r.linear_h2d_gbs,
            gbs,
            r.copy_engine_gbs,
            gbs / r.linear_h2d_gbs,
            r.target,
            gbs / r.linear_h2d_gbs >= r.target
        )?;
    }
    for r in &report.kernel {
        writeln!(
            csv,
            "kernel-{}-t{}-v{}-{},{},{:.3},{:.3},{:.3},{:.4},{},{}",
            r.act,
            r.tokens,
            r.variant,
            r.path,
            r.experts,
            r.event_gbs,
            copy_rw_gbs,
            copy_gbs,
            r.over_copy_rw,
            r.target,
            r.pass
        )?;
    }
    println!(
        "device: {} ({:?})",
        report.device.name, report.device.compute_capability
    );
    println!(
        "device copy: {:.1} GB/s read+write ({:.1} GB/s copied); dense read {:.1} GB/s, {:.1} GB/s at a layer's {} MiB (queued)",
        copy_rw_gbs,
        copy_gbs,
        dense_read_gbs,
        dense_read_layer_gbs,
        layer_bytes >> 20
    );
    println!(
        "{:>8} {:>11} {:>12} {:>10} {:>11} {:>12} {:>9} {:>5}",
        "experts",
        "linear H2D",
        "copy-engine",
        "zero-copy",
        "copy-batch",
        "best/linear",
        "target",
        "pass"
    );
    for r in &report.gather {
        println!(
            "{:>8} {:>11.2} {:>12.2} {:>10.2} {:>11.2} {:>12.3} {:>9.2} {:>5}",
            r.experts,
            r.linear_h2d_gbs,
            r.copy_engine_gbs,
            r.zero_copy_gbs,
            r.copy_batch_gbs,
            r.best_over_linear,
            r.target,
            r.pass
        );
    }
    println!(
        "{:>6} {:>7} {:>9} {:>22} {:>8} {:>10} {:>10} {:>10} {:>11} {:>10} {:>12} {:>12} {:>9} {:>5}",
        "act",
        "tokens",
        "variant",
        "path",
        "experts",
        "queued us",
        "event us",
        "wall us",
        "enqueue us",
        "GB/s",
        "/copy (rw)",
        "/copy (B)",
        "target",
        "pass"
    );
    for r in &report.kernel {
        println!(
            "{:>6} {:>7} {:>9} {:>22} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>11.2} {:>10.1} {:>12.3} {:>12.3} {:>9.2} {:>5}",
            r.act,
            r.tokens,
            r.variant,
            r.path,
            r.experts,
            r.queued_us,
            r.event_us,
            r.wall_us,
            r.enqueue_us,
            r.event_gbs,
            r.over_copy_rw,
            r.over_copy_bytes,
            r.target,
            r.pass
        );
    }
    if let Some(f) = &report.floor {
        println!(
            "floor of {} at 1 token: {:.2} us with no work + {:.2} us of weights at the dense-read rate = {:.2} us, {:.3} of the copy's read+write rate at best; the target ({:.2}) needs {:.2} us; measured {:.2} us",
            f.path, f.fixed_us, f.memory_us, f.floor_us, f.floor_over_copy_rw, KERNEL_TARGET, f.target_us, f.measured_us
        );
    }
    print_timelines(&report.kernel);
    println!(
        "host enqueue per call: add kernel {:.2} us, event record {:.2} us, expert launch (1 token, 10 experts: two kernels) {:.2} us",
        report.enqueue.add_kernel_us, report.enqueue.event_record_us, report.enqueue.expert_launch_us
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tokens: usize, path: &str, queued_us: f64) -> KernelRow {
        KernelRow {
            act: "int8".into(),
            experts: LAYER_EXPERTS,
            tokens,
            variant: "auto".into(),
            path: path.into(),
            bytes: 27_700_000,
            queued_us,
            event_us: 0.0,
            wall_us: 0.0,
            enqueue_us: 0.0,
            stamps: None,
            event_gbs: 0.0,
            over_copy_rw: 0.0,
            over_copy_bytes: 0.0,
            target: KERNEL_TARGET,
            pass: false,
        }
    }

    #[test]
    fn every_case_runs_the_one_path_with_its_variant() {
        for (_, _, forced, path, _) in kernel_cases() {
            let t = case_tuning(path, forced, CudaTuning::default()).unwrap();
            assert_eq!(t.expert_path(), path);
            assert_eq!(t.expert_variant, forced);
        }
        let e = case_tuning(
            "staged+pdl+split+cvt+wide+fused",
            None,
            CudaTuning::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("+fused") && e.contains(CUDA_EXPERT_PATH), "{e}");
    }

    /// An H100 run's numbers: 7.07 us with no work, 27.7 MB at 2850 GB/s, a
    /// 3000 GB/s read+write copy.
    #[test]
    fn the_floor_adds_the_no_work_layer_and_the_bytes_at_the_dense_rate() {
        let rows = vec![row(1, "p", 25.76), row(0, "p", 7.07), row(0, "other", 1.0)];
        let f = kernel_floor(&rows, "p", LAYER_EXPERTS, 2850.0, 3000.0).unwrap();
        assert!((f.memory_us - 27.7e6 / 2850e3).abs() < 1e-9);
        assert!((f.floor_us - (7.07 + f.memory_us)).abs() < 1e-9);
        assert!((f.target_us - 27.7e6 / 1500e3).abs() < 1e-9);
        assert!((f.floor_over_copy_rw - 27.7e6 / (f.floor_us * 1e3) / 3000.0).abs() < 1e-12);
        assert_eq!(f.measured_us, 25.76);
        // No floor without both rows of the path.
        assert!(kernel_floor(&rows, "other", LAYER_EXPERTS, 2850.0, 3000.0).is_none());
    }
}
