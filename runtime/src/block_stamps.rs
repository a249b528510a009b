//! Block timelines of the expert kernels: where a layer's launch spends its time.
//!
//! A one-token layer of 10 resident experts runs in about 25 us on an H100, of which the
//! same layer with no work takes 7 and its weights at the chip's read rate about 10
//! (`experiments/gpu-backend`). Nsight's counters average over a launch and serialize
//! launches, so they cannot say whether the rest is blocks waiting to become resident, the
//! wait for their tiles, the down kernel's wait for gate/up's h, the compute, or the gap
//! between launches. With `FT_CUDA_STAMPS=1` (`CudaTuning::block_stamps`) every block of
//! the expert kernels notes the global timer at five points (`kernels/cuda/experts.cu`,
//! "Block timelines") and [`crate::Device::take_block_stamps`] reads the records back; this
//! module parses them ([`BlockStamp::from_raw`]), cuts a queued batch into its launches
//! ([`launches`]) and summarises each launch's phases ([`LaunchTimeline`]), the medians over
//! a batch in [`BatchTimeline`].

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};

/// Which kernel a record comes from (the record's top byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StampedKernel {
    /// An `ft_experts_gate_up*` block.
    GateUp,
    /// An `ft_experts_down*` block.
    Down,
}

impl StampedKernel {
    fn from_code(code: u64) -> Option<Self> {
        match code {
            1 => Some(StampedKernel::GateUp),
            2 => Some(StampedKernel::Down),
            _ => None,
        }
    }

    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            StampedKernel::GateUp => "gate-up",
            StampedKernel::Down => "down",
        }
    }
}

/// One block's timeline (global timer, ns; a point the block did not reach is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BlockStamp {
    /// Its kernel.
    pub kernel: StampedKernel,
    /// Its multiprocessor.
    pub sm: u32,
    /// Its block index (x, y).
    pub block: (u32, u32),
    /// It started.
    pub entry_ns: u64,
    /// Its start condition was met: the launch's gate (gate/up), gate/up's h complete (down).
    pub condition_ns: Option<u64>,
    /// Its weight tile and activations were in shared memory.
    pub ready_ns: Option<u64>,
    /// Its own work was done (down: before its row tile's ticket and combine).
    pub work_ns: Option<u64>,
    /// It ended.
    pub exit_ns: u64,
    /// Multiprocessor cycles from its start to its end.
    pub cycles: u64,
}

/// The bytes of one record (8 u64).
pub const STAMP_RECORD_BYTES: usize = 64;

impl BlockStamp {
    /// A record as the kernels write it (module docs of `experts.cu`'s block timelines).
    pub fn from_raw(r: &[u64; 8]) -> Result<BlockStamp> {
        let kernel = StampedKernel::from_code(r[0] >> 56).ok_or_else(|| {
            RuntimeError::invalid(
                "block stamp",
                format!("kernel code {} names no expert kernel", r[0] >> 56),
            )
        })?;
        let opt = |v: u64| (v != 0).then_some(v);
        if r[1] == 0 || r[5] < r[1] {
            return Err(RuntimeError::invalid(
                "block stamp",
                format!("a block that ends ({}) before it starts ({})", r[5], r[1]),
            ));
        }
        Ok(BlockStamp {
            kernel,
            sm: ((r[0] >> 40) & 0xffff) as u32,
            block: ((r[0] & 0xfffff) as u32, ((r[0] >> 20) & 0xfffff) as u32),
            entry_ns: r[1],
            condition_ns: opt(r[2]),
            ready_ns: opt(r[3]),
            work_ns: opt(r[4]),
            exit_ns: r[5],
            cycles: r[7].wrapping_sub(r[6]),
        })
    }
}

/// What [`crate::Device::take_block_stamps`] read: the records kept and how many blocks
/// ended beyond the kernels' capacity (counted, not kept).
#[derive(Debug, Clone, Default)]
pub struct BlockStamps {
    /// The records, in the order blocks ended.
    pub records: Vec<BlockStamp>,
    /// Blocks that ended after the buffer was full.
    pub dropped: u64,
}

/// One phase of a launch's blocks of one kernel, ns from the launch's start (its first
/// block's entry); durations are medians over the kernel's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseStats {
    /// Blocks of this kernel in the launch.
    pub blocks: usize,
    /// The first block's start.
    pub first_entry_ns: f64,
    /// The last block's start.
    pub last_entry_ns: f64,
    /// The last block's end.
    pub last_exit_ns: f64,
    /// Start to start condition met.
    pub median_condition_ns: f64,
    /// Start condition met to tiles in shared memory.
    pub median_ready_ns: f64,
    /// Tiles in shared memory to own work done (or to the end where not noted).
    pub median_work_ns: f64,
    /// Own work done to the end (the ticket, and the combine of a row tile's last block).
    pub median_tail_ns: f64,
    /// Start to end.
    pub median_life_ns: f64,
}

/// One launch of the expert kernels (a layer): its phases and the gap before it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchTimeline {
    /// Its first block's start, ns (global timer).
    pub start_ns: u64,
    /// First block's start to last block's end.
    pub span_ns: f64,
    /// From the previous launch's last block's end to this one's first start (`None` for
    /// the first launch of a batch).
    pub gap_before_ns: Option<f64>,
    /// Its gate/up blocks.
    pub gate_up: Option<PhaseStats>,
    /// Its down blocks.
    pub down: Option<PhaseStats>,
}

/// The median of `v` (ft-kernels' own), NaN where no block reached the point (shown as such,
/// not as 0).
fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    ft_kernels::stream::median(v)
}

fn phase(blocks: &[&BlockStamp], start: u64) -> Option<PhaseStats> {
    if blocks.is_empty() {
        return None;
    }
    let rel = |t: u64| t as f64 - start as f64;
    let span = |a: u64, b: Option<u64>| b.map(|b| b as f64 - a as f64);
    let mut cond = Vec::new();
    let mut ready = Vec::new();
    let mut work = Vec::new();
    let mut tail = Vec::new();
    let mut life = Vec::new();
    for b in blocks {
        let c = b.condition_ns.unwrap_or(b.entry_ns);
        cond.push(c as f64 - b.entry_ns as f64);
        if let Some(r) = span(c, b.ready_ns) {
            ready.push(r);
        }
        let from = b.ready_ns.unwrap_or(c);
        let done = b.work_ns.unwrap_or(b.exit_ns);
        work.push(done as f64 - from as f64);
        tail.push(b.exit_ns as f64 - done as f64);
        life.push(b.exit_ns as f64 - b.entry_ns as f64);
    }
    Some(PhaseStats {
        blocks: blocks.len(),
        first_entry_ns: rel(blocks.iter().map(|b| b.entry_ns).min()?),
        last_entry_ns: rel(blocks.iter().map(|b| b.entry_ns).max()?),
        last_exit_ns: rel(blocks.iter().map(|b| b.exit_ns).max()?),
        median_condition_ns: median(&cond),
        median_ready_ns: median(&ready),
        median_work_ns: median(&work),
        median_tail_ns: median(&tail),
        median_life_ns: median(&life),
    })
}

/// Records of one kernel cut into its launches, in order: a kernel's blocks are sorted by
/// start, and a launch ends where a block index repeats (a launch's grid holds each index
/// once).
fn cut_by_grid(mut blocks: Vec<&BlockStamp>) -> Vec<Vec<&BlockStamp>> {
    blocks.sort_by_key(|b| (b.entry_ns, b.exit_ns));
    let mut out: Vec<Vec<&BlockStamp>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for b in blocks {
        if !seen.insert(b.block) || out.is_empty() {
            seen.clear();
            seen.insert(b.block);
            out.push(Vec::new());
        }
        out.last_mut().expect("pushed above").push(b);
    }
    out
}

/// The launches of a batch queued on one stream, in order. The blocks of every launch of a
/// kernel start after every block of its previous launch on the stream has started (a
/// launch, chained or dependent or not, is scheduled no earlier than that), so each
/// kernel's records sorted by start fall into its launches in order, cut where a block
/// index repeats; the n-th launch of gate/up and the n-th of
/// down make the n-th layer. Launches may overlap (a chained gate/up starts while the
/// down kernel before it ends): the gap before such a launch is negative.
pub fn launches(records: &[BlockStamp]) -> Vec<LaunchTimeline> {
    let of = |k: StampedKernel| records.iter().filter(|b| b.kernel == k).collect::<Vec<_>>();
    let firsts = cut_by_grid(of(StampedKernel::GateUp));
    let downs = cut_by_grid(of(StampedKernel::Down));
    let mut out = Vec::with_capacity(firsts.len().max(downs.len()));
    let mut prev_end: Option<u64> = None;
    for i in 0..firsts.len().max(downs.len()) {
        let (f, d) = (
            firsts.get(i).map_or(&[][..], |v| v),
            downs.get(i).map_or(&[][..], |v| v),
        );
        let all = f.iter().chain(d);
        let start = all.clone().map(|b| b.entry_ns).min().unwrap_or(0);
        let end = all.map(|b| b.exit_ns).max().unwrap_or(start);
        out.push(LaunchTimeline {
            start_ns: start,
            span_ns: (end - start) as f64,
            gap_before_ns: prev_end.map(|p| start as f64 - p as f64),
            gate_up: phase(f, start),
            down: phase(d, start),
        });
        prev_end = Some(end);
    }
    out
}

/// One record in a CSV file ([`write_csv`]): times in ns from the batch's first start.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StampRow {
    kernel: StampedKernel,
    sm: u32,
    bx: u32,
    by: u32,
    entry_ns: u64,
    condition_ns: Option<u64>,
    ready_ns: Option<u64>,
    work_ns: Option<u64>,
    exit_ns: u64,
    cycles: u64,
}

/// Write `records` to the CSV file `path`, one row per block, times in ns from the earliest
/// start (`gpu_backend --stamps` keeps each case's last batch so; [`read_csv`] reads it
/// back for [`batch_timeline`] without a device).
pub fn write_csv(path: &Path, records: &[BlockStamp]) -> Result<()> {
    let bad = |e: csv::Error| RuntimeError::invalid(path.display().to_string(), e.to_string());
    let mut w = csv::Writer::from_path(path).map_err(bad)?;
    let t0 = records.iter().map(|b| b.entry_ns).min().unwrap_or(0);
    for b in records {
        w.serialize(StampRow {
            kernel: b.kernel,
            sm: b.sm,
            bx: b.block.0,
            by: b.block.1,
            entry_ns: b.entry_ns - t0,
            condition_ns: b.condition_ns.map(|t| t - t0),
            ready_ns: b.ready_ns.map(|t| t - t0),
            work_ns: b.work_ns.map(|t| t - t0),
            exit_ns: b.exit_ns - t0,
            cycles: b.cycles,
        })
        .map_err(bad)?;
    }
    w.flush().map_err(|source| RuntimeError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// The records of a CSV file that [`write_csv`] wrote; a malformed row is an error naming
/// the file and the row.
pub fn read_csv(path: &Path) -> Result<Vec<BlockStamp>> {
    let bad = |e: csv::Error| RuntimeError::invalid(path.display().to_string(), e.to_string());
    let mut r = csv::Reader::from_path(path).map_err(bad)?;
    let mut out = Vec::new();
    for row in r.deserialize::<StampRow>() {
        let row = row.map_err(bad)?;
        if row.exit_ns < row.entry_ns {
            return Err(RuntimeError::invalid(
                path.display().to_string(),
                format!(
                    "a block that ends ({}) before it starts ({})",
                    row.exit_ns, row.entry_ns
                ),
            ));
        }
        out.push(BlockStamp {
            kernel: row.kernel,
            sm: row.sm,
            block: (row.bx, row.by),
            entry_ns: row.entry_ns,
            condition_ns: row.condition_ns,
            ready_ns: row.ready_ns,
            work_ns: row.work_ns,
            exit_ns: row.exit_ns,
            cycles: row.cycles,
        });
    }
    Ok(out)
}

/// The medians over a batch's launches (the first left out: it follows the hold, not a
/// launch), with the global timer's resolution as these records show it.
#[derive(Debug, Clone, Serialize)]
pub struct BatchTimeline {
    /// Launches found.
    pub launches: usize,
    /// Launches the medians take (all but the first).
    pub measured: usize,
    /// First start to next launch's first start.
    pub median_period_ns: f64,
    /// First start to last end of a launch.
    pub median_span_ns: f64,
    /// The previous launch's last end to this one's first start.
    pub median_gap_ns: f64,
    /// The gate/up phase, the median of each field over the measured
    /// launches.
    pub gate_up: Option<PhaseStats>,
    /// The down phase, likewise.
    pub down: Option<PhaseStats>,
    /// The smallest nonzero difference between two stamps of the records: the timer's
    /// step as seen here (on some GPUs the global timer advances in microsecond steps).
    pub timer_step_ns: Option<u64>,
    /// The multiprocessors' clock, GHz: cycles over global-timer time of the blocks that
    /// lived at least 2 us.
    pub sm_clock_ghz: Option<f64>,
}

fn median_phase(ps: &[PhaseStats]) -> Option<PhaseStats> {
    if ps.is_empty() {
        return None;
    }
    let m = |f: fn(&PhaseStats) -> f64| median(&ps.iter().map(f).collect::<Vec<_>>());
    Some(PhaseStats {
        blocks: ps[0].blocks,
        first_entry_ns: m(|p| p.first_entry_ns),
        last_entry_ns: m(|p| p.last_entry_ns),
        last_exit_ns: m(|p| p.last_exit_ns),
        median_condition_ns: m(|p| p.median_condition_ns),
        median_ready_ns: m(|p| p.median_ready_ns),
        median_work_ns: m(|p| p.median_work_ns),
        median_tail_ns: m(|p| p.median_tail_ns),
        median_life_ns: m(|p| p.median_life_ns),
    })
}

/// [`BatchTimeline`] of a queued batch's records.
pub fn batch_timeline(records: &[BlockStamp]) -> BatchTimeline {
    let ls = launches(records);
    let measured: Vec<&LaunchTimeline> = ls.iter().skip(1).collect();
    let period: Vec<f64> = ls
        .windows(2)
        .skip(1)
        .map(|w| w[1].start_ns as f64 - w[0].start_ns as f64)
        .collect();
    let span: Vec<f64> = measured.iter().map(|l| l.span_ns).collect();
    let gap: Vec<f64> = measured.iter().filter_map(|l| l.gap_before_ns).collect();
    let gu: Vec<PhaseStats> = measured.iter().filter_map(|l| l.gate_up).collect();
    let dn: Vec<PhaseStats> = measured.iter().filter_map(|l| l.down).collect();
    let mut stamps: Vec<u64> = records
        .iter()
        .flat_map(|b| {
            [
                Some(b.entry_ns),
                b.condition_ns,
                b.ready_ns,
                b.work_ns,
                Some(b.exit_ns),
            ]
        })
        .flatten()
        .collect();
    stamps.sort_unstable();
    stamps.dedup();
    let timer_step_ns = stamps.windows(2).map(|w| w[1] - w[0]).min();
    let (cyc, ns) = records
        .iter()
        .filter(|b| b.exit_ns - b.entry_ns >= 2_000)
        .fold((0f64, 0f64), |(c, n), b| {
            (c + b.cycles as f64, n + (b.exit_ns - b.entry_ns) as f64)
        });
    BatchTimeline {
        launches: ls.len(),
        measured: measured.len(),
        median_period_ns: median(&period),
        median_span_ns: median(&span),
        median_gap_ns: median(&gap),
        gate_up: median_phase(&gu),
        down: median_phase(&dn),
        timer_step_ns,
        sm_clock_ghz: (ns > 0.0).then(|| cyc / ns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw record as `experts.cu` writes it.
    fn raw(kernel: u64, sm: u64, bx: u64, by: u64, t: [u64; 5], cycles: u64) -> [u64; 8] {
        [
            kernel << 56 | sm << 40 | by << 20 | bx,
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
            1_000,
            1_000 + cycles,
        ]
    }

    #[test]
    fn records_parse_field_by_field() {
        let b = BlockStamp::from_raw(&raw(2, 131, 39, 9, [100, 150, 0, 400, 500], 800)).unwrap();
        assert_eq!(b.kernel, StampedKernel::Down);
        assert_eq!((b.sm, b.block), (131, (39, 9)));
        assert_eq!((b.entry_ns, b.exit_ns), (100, 500));
        assert_eq!(
            (b.condition_ns, b.ready_ns, b.work_ns),
            (Some(150), None, Some(400))
        );
        assert_eq!(b.cycles, 800);
        assert!(BlockStamp::from_raw(&raw(7, 0, 0, 0, [1, 0, 0, 0, 2], 1)).is_err());
        assert!(BlockStamp::from_raw(&raw(1, 0, 0, 0, [5, 0, 0, 0, 4], 1)).is_err());
    }

    /// A queued batch of `n` layers: each 4 gate/up blocks then 4 down blocks that start
    /// while gate/up runs (the dependent launch) and wait for it, 1000 ns apart.
    fn batch(n: u64) -> Vec<BlockStamp> {
        let mut v = Vec::new();
        for l in 0..n {
            let s = 10_000 + l * 11_000;
            for b in 0..4 {
                // gate/up: starts within 400 ns, tile after 3000, work 2000.
                let e = s + 100 * b;
                v.push(raw(1, b, b, 0, [e, e, e + 3_000, 0, e + 5_000], 9_000));
                // down: starts at +1000, h at gate/up's last end (+5300), tile ready, 2000
                // of work, 500 of ticket and combine.
                let d = s + 1_000 + 100 * b;
                v.push(raw(
                    2,
                    b,
                    b,
                    0,
                    [d, s + 5_300, s + 5_400, s + 7_400, s + 7_900 + b],
                    12_000,
                ));
            }
        }
        v.iter().map(|r| BlockStamp::from_raw(r).unwrap()).collect()
    }

    #[test]
    fn a_queued_batch_cuts_into_its_launches() {
        let recs = batch(5);
        let ls = launches(&recs);
        assert_eq!(ls.len(), 5);
        for (i, l) in ls.iter().enumerate() {
            assert_eq!(l.start_ns, 10_000 + i as u64 * 11_000);
            assert_eq!(l.span_ns, 7_903.0);
            assert_eq!(l.gap_before_ns, (i > 0).then_some(11_000.0 - 7_903.0));
            let g = l.gate_up.unwrap();
            assert_eq!(
                (g.blocks, g.first_entry_ns, g.last_entry_ns),
                (4, 0.0, 300.0)
            );
            assert_eq!(
                (g.median_ready_ns, g.median_work_ns, g.last_exit_ns),
                (3_000.0, 2_000.0, 5_300.0)
            );
            let d = l.down.unwrap();
            assert_eq!((d.blocks, d.first_entry_ns), (4, 1_000.0));
            // Down waits from its start (1000 + 100 b) to 5300: 4150 median.
            assert_eq!(d.median_condition_ns, 4_150.0);
            assert_eq!((d.median_ready_ns, d.median_work_ns), (100.0, 2_000.0));
            assert_eq!(d.median_tail_ns, 501.5);
        }
        // Shuffled input gives the same launches.
        let mut rev = recs.clone();
        rev.reverse();
        assert_eq!(launches(&rev), ls);
    }

    #[test]
    fn a_csv_file_reads_back_the_same_timelines() {
        let recs = batch(3);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("stamps.csv");
        write_csv(&p, &recs).unwrap();
        let back = read_csv(&p).unwrap();
        // The same records moved to start at 0.
        let t0 = recs.iter().map(|b| b.entry_ns).min().unwrap();
        assert_eq!(back.len(), recs.len());
        for (a, b) in recs.iter().zip(&back) {
            assert_eq!(b.entry_ns, a.entry_ns - t0);
            assert_eq!(b.ready_ns, a.ready_ns.map(|t| t - t0));
            assert_eq!(b.work_ns, a.work_ns.map(|t| t - t0));
            assert_eq!(
                (b.kernel, b.block, b.sm, b.cycles),
                (a.kernel, a.block, a.sm, a.cycles)
            );
        }
        let (x, y) = (batch_timeline(&recs), batch_timeline(&back));
        assert_eq!(
            (x.median_period_ns, x.median_span_ns),
            (y.median_period_ns, y.median_span_ns)
        );
        assert_eq!(x.down, y.down);
        // A malformed row names the file.
        std::fs::write(&p, "kernel,sm,bx,by,entry_ns,condition_ns,ready_ns,work_ns,exit_ns,cycles\nwarp,0,0,0,1,,,,2,3\n").unwrap();
        let e = read_csv(&p).unwrap_err().to_string();
        assert!(e.contains("stamps.csv"), "{e}");
    }

    #[test]
    fn overlapping_launches_cut_by_their_grids() {
        // Chained: each layer's gate/up starts 1000 ns before the previous down ends.
        let mut v = Vec::new();
        for l in 0..4u64 {
            let s = 10_000 + l * 6_000;
            for b in 0..3 {
                v.push(raw(1, b, b, 1, [s + b, s + b, s + 2_000, 0, s + 3_000], 10));
                v.push(raw(
                    2,
                    b,
                    b,
                    1,
                    [s + 500 + b, s + 3_100, s + 3_100, s + 6_000, s + 7_000],
                    10,
                ));
            }
        }
        let recs: Vec<BlockStamp> = v.iter().map(|r| BlockStamp::from_raw(r).unwrap()).collect();
        let ls = launches(&recs);
        assert_eq!(ls.len(), 4);
        for (i, l) in ls.iter().enumerate() {
            assert_eq!(l.start_ns, 10_000 + 6_000 * i as u64);
            assert_eq!(l.span_ns, 7_000.0);
            assert_eq!(l.gap_before_ns, (i > 0).then_some(-1_000.0));
            assert_eq!((l.gate_up.unwrap().blocks, l.down.unwrap().blocks), (3, 3));
        }
        let t = batch_timeline(&recs);
        assert_eq!((t.median_period_ns, t.median_gap_ns), (6_000.0, -1_000.0));
    }

    #[test]
    fn a_batch_summary_takes_medians_past_the_first_launch() {
        let t = batch_timeline(&batch(4));
        assert_eq!((t.launches, t.measured), (4, 3));
        assert_eq!(t.median_period_ns, 11_000.0);
        assert_eq!(t.median_span_ns, 7_903.0);
        assert_eq!(t.median_gap_ns, 11_000.0 - 7_903.0);
        assert_eq!(t.down.unwrap().median_condition_ns, 4_150.0);
        // The closest stamps: the down blocks' ends, 1 ns apart.
        assert_eq!(t.timer_step_ns, Some(1));
        // Each launch: 4 gate/up blocks of 9000 cycles in 5000 ns, 4 down blocks of 12000
        // in 6900, 6801, 6702 and 6603 ns.
        let clock = t.sm_clock_ghz.unwrap();
        assert!((clock - 84_000.0 / 47_006.0).abs() < 1e-12, "{clock}");
    }
}
