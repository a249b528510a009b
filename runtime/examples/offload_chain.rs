//! The critical path of an offload layer at one stream, piece by piece
//! (experiments/runtime-grid, "The floor of a one-stream layer").
//!
//! At one stream a layer's link waits while the dense part up to the router runs, while the
//! copy engine starts after the router's event, while the last fetched chunk's kernels run
//! after its copies, and while the combine runs; every chunk of copies also costs the link
//! its start and drain. The engine's timeline (`ft run`'s `link_idle_per_layer`) gives
//! these idle times in a decode step; this bench times each piece alone on the same device,
//! so that what the engine loses beyond them (stream crossings, the host) shows, and so that
//! the floor of a layer on this machine is a measured number:
//!
//! - `dense`: one launch of the dense kernel over one layer's bytes before the router
//!   (`qwen3.8-flash-next`, one stream at `--context` tokens), rotating through disjoint
//!   layers so that L2 does not hold them, queued behind a hold (the device's time per
//!   launch); beside it the dense kernel's rate over 256 MiB and the device copy's
//!   read + write rate, the ceilings;
//! - `router_to_copy`: the dense launch, an event, and on the copy stream a wait for it and
//!   a 64 KiB pinned copy: event to event, against the same copy queued alone;
//! - `chunk`: a layer's 6 fetched experts gathered as 1, 2 ([5, 1]) or 3 ([3, 2, 1]) batches
//!   with an event after each, as the engine submits them: the cost of a batch beyond bytes;
//! - `last_chunk`: one expert gathered, an event, and on the compute stream a wait for it
//!   and the expert kernels for that expert at one token: from the copy's end to the kernel's,
//!   against the same launch queued alone;
//! - `combine`: the fixed-order combine of a one-stream layer (10 row blocks and 3 chunks).
//!
//! Usage: `offload_chain [--device cuda|host] [--out DIR] [--reps N] [--context N]`. Writes
//! `offload_chain.json` under DIR (default `.`) and prints a table.

use std::io::Write;

use ft_kernels::stream::warm_median;
use ft_kernels::ActivationPath;
use ft_model::cache::SlotId;
use ft_model::{ExpertFormat, ExpertId};
use ft_runtime::bank::HostBank;
use ft_runtime::dense::{DenseRead, DENSE_OUT_BYTES};
use ft_runtime::device::{Event, Stream};
use ft_runtime::gather::{self, GatherMethod};
use ft_runtime::gpu_experts::{ExpertStep, ExpertTask, TokenWeight};
use ft_runtime::slots::SlotPool;
use serde::Serialize;

mod common;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Disjoint layers of dense bytes rotated through (about 6 x 33 MB: beyond the L2 of an
/// H100 or H200).
const ROTATE: usize = 6;
/// Launches of a queued batch and the hold before it.
const QUEUE_BATCH: usize = 12;
const QUEUE_HOLD_US: f64 = 1500.0;
/// The large read that sets the dense kernel's own ceiling.
const LARGE_READ: usize = 256 << 20;
/// Fetched experts of the chunk case, and its chunkings (the engine's rule gives [3, 2, 1]
/// for 6; `--fetch-chunks 2` [5, 1]).
const CHUNK_EXPERTS: usize = 6;
const CHUNKINGS: [&[usize]; 3] = [&[6], &[5, 1], &[3, 2, 1]];

#[derive(Debug, Serialize)]
struct Chunking {
    sizes: Vec<usize>,
    /// First copy's start to the last batch's event, us (median).
    us: f64,
    /// Beyond the one-batch time, per extra batch, us.
    per_extra_batch_us: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    device: ft_runtime::device::DeviceInfo,
    model: String,
    context: usize,
    reps: usize,
    /// Device copy, (read + write) / time, GB/s; the dense kernel over 256 MiB (32 on the
    /// host device), GB/s.
    copy_rw_gbs: f64,
    dense_large_gbs: f64,
    /// Bytes the dense part reads before the router (one stream), and its time queued, us.
    dense_bytes: u64,
    dense_us: f64,
    /// The dense part's rate at a layer's bytes over its large-read rate.
    dense_over_large: f64,
    /// The dense part at the large-read rate (its bytes alone), us.
    dense_at_large_rate_us: f64,
    /// Router event to the end of a 64 KiB copy on the copy stream, and the copy alone, us.
    router_to_copy_us: f64,
    small_copy_us: f64,
    chunkings: Vec<Chunking>,
    /// Last chunk: one expert's copy end to its kernels' end across streams, and the same
    /// launch queued alone, us.
    last_chunk_us: f64,
    one_expert_queued_us: f64,
    combine_us: f64,
    /// Time of one expert's bytes at this run's linear pinned copy rate, us.
    expert_copy_us: f64,
}

/// [`warm_median`] with this bench's error type.
fn timed(reps: usize, f: impl FnMut(usize) -> Res<f64>) -> Res<f64> {
    warm_median(reps, f)
}

/// Event `a` to event `b`, once `b` has completed, us (for timings across streams).
fn elapsed(a: &Event, b: &Event) -> Res<f64> {
    b.synchronize()?;
    Ok(a.elapsed_us(b)?)
}

/// Per launch of `QUEUE_BATCH` launches queued behind a hold on `s` (the device's time).
fn queued(
    s: &Stream,
    reps: usize,
    a: &Event,
    b: &Event,
    mut launch: impl FnMut(usize) -> ft_runtime::error::Result<()>,
) -> Res<f64> {
    let us = timed(reps, |r| {
        s.hold_us(QUEUE_HOLD_US)?;
        Ok(s.time_us(a, b, || {
            (0..QUEUE_BATCH).try_for_each(|j| launch(r * QUEUE_BATCH + j))
        })?)
    })?;
    Ok(us / QUEUE_BATCH as f64)
}

/// The pieces of a one-stream offload layer's critical path (module docs).
#[derive(clap::Parser)]
struct Args {
    #[command(flatten)]
    bench: common::BenchArgs,
    /// Context of the one stream, tokens (its KV bytes are part of the dense part).
    #[arg(long, default_value_t = 1024)]
    context: usize,
}

fn main() -> std::process::ExitCode {
    common::exit(run())
}

fn run() -> Res<()> {
    let Args { bench, context } = clap::Parser::parse();
    let common::Bench {
        device: d,
        small,
        out,
        reps,
        spec,
        compute: s,
        copy: c,
        events: (a, b),
    } = bench.open()?;
    let g = spec.geometry;
    let eb = spec.expert_bytes() as usize;
    d.warm_up_kernels(&[&ExpertStep::new(
        ExpertFormat::Nvfp4,
        &g,
        ActivationPath::Int8,
        0,
    )])?;

    // Ceilings: the device copy and the dense kernel over a large read.
    let large = if small { 32 << 20 } else { LARGE_READ };
    let (x0, x1) = (d.alloc(large, "copy a")?, d.alloc(large, "copy b")?);
    let copy_us = timed(reps.min(10), |_| {
        Ok(s.time_us(&a, &b, || s.copy_d2d(&x0, 0, &x1, 0, large))?)
    })?;
    let copy_rw_gbs = 2.0 * large as f64 / (copy_us * 1e3);
    let dense_out = d.alloc(DENSE_OUT_BYTES, "dense out")?;
    let whole = [DenseRead {
        buffer: &x0,
        offset: 0,
        bytes: large,
    }];
    let large_us = timed(reps.min(10), |_| {
        Ok(s.time_us(&a, &b, || s.launch_dense(&whole, &dense_out))?)
    })?;
    let dense_large_gbs = large as f64 / (large_us * 1e3);
    drop((x0, x1));

    // The dense part before the router: the layer's dense weights but the shared experts
    // (read after the router, as the engine does), and one stream's KV bytes.
    let dense = spec.dense();
    let shared = 2 * g.shared_experts as u64 * g.expert_params();
    let dense_bytes = (dense.weight_bytes_per_layer - shared.min(dense.weight_bytes_per_layer)
        + context as u64 * dense.kv_bytes_per_token) as usize;
    let dense_bytes = if small { dense_bytes / 16 } else { dense_bytes };
    let layer_stride = dense_bytes.next_multiple_of(4096);
    let layers = d.alloc(ROTATE * layer_stride, "dense layers")?;
    let read = |i: usize| {
        [DenseRead {
            buffer: &layers,
            offset: (i % ROTATE) * layer_stride,
            bytes: dense_bytes,
        }]
    };
    let dense_us = queued(&s, reps.min(10), &a, &b, |i| {
        s.launch_dense(&read(i), &dense_out)
    })?;

    // Router event to the copy stream's first copy.
    const SMALL_COPY: usize = 64 << 10;
    let host = d.alloc_host(SMALL_COPY, "small copy source")?;
    let dst = d.alloc(SMALL_COPY, "small copy destination")?;
    let router = d.new_event(true)?;
    let router_to_copy_us = timed(reps, |r| {
        s.hold_us(200.0)?;
        s.launch_dense(&read(r), &dense_out)?;
        s.record(&router)?;
        c.wait(&router)?;
        c.copy_h2d(&host, 0, &dst, 0, SMALL_COPY)?;
        c.record(&b)?;
        elapsed(&router, &b)
    })?;
    let small_copy_us = timed(reps, |_| {
        c.hold_us(200.0)?;
        Ok(c.time_us(&a, &b, || c.copy_h2d(&host, 0, &dst, 0, SMALL_COPY))?)
    })?;

    // Chunks of a layer's gather: batches with an event after each.
    let bank_experts = 64;
    let bg = ft_model::MoeGeometry {
        experts: bank_experts,
        moe_layers: 1,
        ..g
    };
    let bank = HostBank::from_seed(&d, spec.format, &bg, 11)?;
    let pool = SlotPool::new(&d, eb as u64, 2 * CHUNK_EXPERTS, 0)?;
    let mut first = 0usize;
    let mut next_moves = |n: usize, slot0: usize| -> Vec<(ExpertId, SlotId)> {
        let m = (0..n)
            .map(|i| {
                (
                    ExpertId::new(0, (first + 2 * i) % bank_experts),
                    SlotId((slot0 + i) as u32),
                )
            })
            .collect();
        first = (first + 2 * n + 1) % bank_experts;
        m
    };
    let mut chunkings = Vec::new();
    for sizes in CHUNKINGS {
        let us = timed(reps, |_| {
            c.hold_us(200.0)?;
            Ok(c.time_us(&a, &b, || {
                let mut slot0 = 0;
                for (k, &n) in sizes.iter().enumerate() {
                    let moves = next_moves(n, slot0);
                    slot0 += n;
                    gather::gather(&c, &bank, &pool, &moves, GatherMethod::CopyEngine)?;
                    // An event after each batch, as the engine records (the last is `b`).
                    if k + 1 < sizes.len() {
                        c.record(&router)?;
                    }
                }
                Ok(())
            })?)
        })?;
        chunkings.push(Chunking {
            sizes: sizes.to_vec(),
            us,
            per_extra_batch_us: 0.0,
        });
    }
    let one_batch = chunkings[0].us;
    for ch in &mut chunkings {
        if ch.sizes.len() > 1 {
            ch.per_extra_batch_us = (ch.us - one_batch) / (ch.sizes.len() - 1) as f64;
        }
    }
    let expert_copy_us = {
        let lin_dst = d.alloc(CHUNK_EXPERTS * eb, "linear destination")?;
        let us = timed(reps, |_| {
            c.hold_us(200.0)?;
            Ok(c.time_us(&a, &b, || {
                c.copy_h2d(bank.buffer(), 0, &lin_dst, 0, CHUNK_EXPERTS * eb)
            })?)
        })?;
        us / CHUNK_EXPERTS as f64
    };

    // The last chunk: one expert's copy, then its kernels at one token on the compute stream.
    let x = d.alloc(g.hidden * 4, "x")?;
    let y = d.alloc(g.hidden * 4, "y")?;
    s.upload_f32(&vec![0.25f32; g.hidden], &x, 0)?;
    let step_of = |slot: usize| {
        let mut st = ExpertStep::new(ExpertFormat::Nvfp4, &g, ActivationPath::Int8, 1);
        st.experts = vec![ExpertTask {
            weights_offset: slot * pool.stride(),
            tokens: vec![TokenWeight {
                token: 0,
                weight: 0.5,
            }],
        }];
        st
    };
    let landed = d.new_event(true)?;
    let last_chunk_us = timed(reps, |r| {
        let slot = r % (2 * CHUNK_EXPERTS);
        let moves = next_moves(1, slot);
        c.hold_us(100.0)?;
        gather::gather(&c, &bank, &pool, &moves, GatherMethod::CopyEngine)?;
        c.record(&landed)?;
        s.wait(&landed)?;
        s.launch_experts(&step_of(slot), pool.buffer(), &x, &y)?;
        s.record(&b)?;
        elapsed(&landed, &b)
    })?;
    let one_expert_queued_us = queued(&s, reps.min(10), &a, &b, |i| {
        s.launch_experts(&step_of(i % (2 * CHUNK_EXPERTS)), pool.buffer(), &x, &y)
    })?;

    // The combine of a one-stream layer: top-k row blocks and three fetched chunks.
    let block = g.hidden;
    let act = d.alloc(g.top_k * block * 4, "act")?;
    let parts = d.alloc(g.top_k * block * 4, "parts")?;
    let more: Vec<_> = (0..3)
        .map(|_| d.alloc(g.top_k * block * 4, "chunk rows"))
        .collect::<Result<_, _>>()?;
    let more_refs: Vec<_> = more.iter().collect();
    let combine_us = queued(&s, reps.min(10), &a, &b, |_| {
        s.combine_fixed(&act, &parts, &more_refs, block, g.top_k)
    })?;

    let dense_at_large_rate_us = dense_bytes as f64 / (dense_large_gbs * 1e3);
    let report = Report {
        device: d.info(),
        model: spec.name.clone(),
        context,
        reps,
        copy_rw_gbs,
        dense_large_gbs,
        dense_bytes: dense_bytes as u64,
        dense_us,
        dense_over_large: dense_at_large_rate_us / dense_us,
        dense_at_large_rate_us,
        router_to_copy_us,
        small_copy_us,
        chunkings,
        last_chunk_us,
        one_expert_queued_us,
        combine_us,
        expert_copy_us,
    };
    common::write_json(&out, "offload_chain.json", &report)?;
    let mut o = std::io::stdout().lock();
    writeln!(o, "device: {} ({} reps)", report.device.name, reps)?;
    writeln!(
        o,
        "ceilings: device copy {:.0} GB/s read+write; dense kernel over {} MiB {:.0} GB/s",
        copy_rw_gbs,
        large >> 20,
        dense_large_gbs
    )?;
    writeln!(
        o,
        "dense before the router: {:.1} MB in {:.2} us queued ({:.2} us at the large read's rate, {:.0}%)",
        dense_bytes as f64 / 1e6,
        dense_us,
        dense_at_large_rate_us,
        100.0 * report.dense_over_large
    )?;
    writeln!(
        o,
        "router event to a 64 KiB copy's end: {router_to_copy_us:.2} us (the copy alone {small_copy_us:.2} us)"
    )?;
    for ch in &report.chunkings {
        writeln!(
            o,
            "gather of {CHUNK_EXPERTS} experts as {:?}: {:.1} us ({:+.2} us per extra batch); one expert at the linear rate {:.1} us",
            ch.sizes, ch.us, ch.per_extra_batch_us, expert_copy_us
        )?;
    }
    writeln!(
        o,
        "last chunk (one expert, one token): copy end to kernel end {last_chunk_us:.2} us; the launch queued alone {one_expert_queued_us:.2} us"
    )?;
    writeln!(
        o,
        "combine (one stream, {} row blocks, 3 chunks): {combine_us:.2} us",
        g.top_k
    )?;
    Ok(())
}
