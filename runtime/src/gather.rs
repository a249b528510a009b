//! Miss gather: bringing a layer's missed experts from the host bank into cache slots.
//!
//! Two mechanisms exist, and the faster one depends on the size of the gather:
//! - **copy engine**: one `cuMemcpyHtoDAsync` per expert on a copy stream, which overlaps
//!   the compute stream's work on the layer's hits (the engine orders the layer's expert
//!   launch after the gather with an event);
//! - **zero-copy**: one kernel whose blocks read the mapped, page-locked bank directly over
//!   the link and write the slots (no copy-engine setup per expert, but it occupies SMs).
//!
//! [`measure`] times both on the real bank and slots for several gather sizes and keeps the
//! faster per size in a [`GatherChoice`], which records the measurements that chose it;
//! [`GatherChoice::method_for`] then picks by the nearest measured size. The record is a
//! serde struct so that it can be persisted beside the other probes.

use ft_model::cache::SlotId;
use ft_model::ExpertId;
use serde::{Deserialize, Serialize};

use crate::bank::HostBank;
use crate::device::{Device, Stream};
use crate::error::{Result, RuntimeError};
use crate::slots::SlotPool;

/// One contiguous copy: `bytes` from `src_offset` of the source to `dst_offset` of the
/// destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CopyRegion {
    /// Byte offset in the source buffer.
    pub src_offset: u64,
    /// Byte offset in the destination buffer.
    pub dst_offset: u64,
    /// Length, bytes.
    pub bytes: u64,
}

/// How a gather moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GatherMethod {
    /// Copy engines, one async copy per expert.
    CopyEngine,
    /// One kernel reading mapped host memory.
    ZeroCopy,
}

impl GatherMethod {
    /// Both methods.
    pub const ALL: [GatherMethod; 2] = [GatherMethod::CopyEngine, GatherMethod::ZeroCopy];

    /// Name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            GatherMethod::CopyEngine => "copy-engine",
            GatherMethod::ZeroCopy => "zero-copy",
        }
    }
}

impl std::fmt::Display for GatherMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The copies bringing `moves` (expert into slot) from `bank` into `pool`.
pub fn regions(
    bank: &HostBank,
    pool: &SlotPool,
    moves: &[(ExpertId, SlotId)],
) -> Result<Vec<CopyRegion>> {
    if bank.layout().expert_bytes != pool.expert_bytes() {
        return Err(RuntimeError::invalid(
            "gather",
            format!(
                "bank experts of {} bytes, slots of {} bytes",
                bank.layout().expert_bytes,
                pool.expert_bytes()
            ),
        ));
    }
    moves
        .iter()
        .map(|&(id, slot)| pool.copy_into(bank.offset(id)?, slot))
        .collect()
}

/// Queue the gather of `moves` on `stream` with `method`.
pub fn gather(
    stream: &Stream,
    bank: &HostBank,
    pool: &SlotPool,
    moves: &[(ExpertId, SlotId)],
    method: GatherMethod,
) -> Result<()> {
    let r = regions(bank, pool, moves)?;
    match method {
        GatherMethod::CopyEngine => stream.copy_h2d_regions(bank.buffer(), pool.buffer(), &r),
        GatherMethod::ZeroCopy => stream.gather_zero_copy(bank.buffer(), pool.buffer(), &r),
    }
}

/// Both methods timed at one gather size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatherPoint {
    /// Experts gathered at once.
    pub experts: usize,
    /// Bytes of one expert.
    pub expert_bytes: u64,
    /// Median time of the copy-engine gather, us (event to event).
    pub copy_engine_us: f64,
    /// Median time of the zero-copy gather, us.
    pub zero_copy_us: f64,
    /// Repetitions behind each median.
    pub reps: usize,
    /// The faster one.
    pub chosen: GatherMethod,
}

impl GatherPoint {
    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        self.experts as u64 * self.expert_bytes
    }

    /// GB/s (1e9 B/s) of a method at this point.
    pub fn gbps(&self, m: GatherMethod) -> f64 {
        let us = match m {
            GatherMethod::CopyEngine => self.copy_engine_us,
            GatherMethod::ZeroCopy => self.zero_copy_us,
        };
        self.bytes() as f64 / (us * 1e3)
    }

    /// GB/s of the chosen method.
    pub fn chosen_gbps(&self) -> f64 {
        self.gbps(self.chosen)
    }
}

/// The gather method per size, with the measurements that chose it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatherChoice {
    /// Device name the measurement ran on.
    pub device: String,
    /// How the bank's host memory was allocated.
    pub host_memory: String,
    /// Measured points, by increasing size.
    pub points: Vec<GatherPoint>,
}

impl GatherChoice {
    /// The method for a gather of `experts` experts of `expert_bytes`: the choice of the
    /// measured point nearest in total bytes (on a log scale); the copy engine when nothing
    /// was measured.
    pub fn method_for(&self, experts: usize, expert_bytes: u64) -> GatherMethod {
        let want = ((experts as u64 * expert_bytes).max(1) as f64).ln();
        self.points
            .iter()
            .min_by(|a, b| {
                let da = ((a.bytes().max(1) as f64).ln() - want).abs();
                let db = ((b.bytes().max(1) as f64).ln() - want).abs();
                da.total_cmp(&db)
            })
            .map(|p| p.chosen)
            .unwrap_or(GatherMethod::CopyEngine)
    }
}

/// Time one gather of `moves` by `method` on `stream`, `reps` times after one warm-up;
/// returns each repetition's time, us (event to event).
pub fn time_gather(
    device: &Device,
    stream: &Stream,
    bank: &HostBank,
    pool: &SlotPool,
    moves: &[(ExpertId, SlotId)],
    method: GatherMethod,
    reps: usize,
) -> Result<Vec<f64>> {
    let (e0, e1) = (device.new_event(true)?, device.new_event(true)?);
    gather(stream, bank, pool, moves, method)?;
    stream.synchronize()?;
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        out.push(stream.time_us(&e0, &e1, || gather(stream, bank, pool, moves, method))?);
    }
    Ok(out)
}

/// The moves of a gather of `n` experts: experts `0..n` of layer `layer % layers` (cycling
/// through the layers' experts if `n` exceeds one layer) into slots `0..n`.
pub fn probe_moves(bank: &HostBank, n: usize) -> Vec<(ExpertId, SlotId)> {
    let g = bank.layout().geometry;
    (0..n)
        .map(|i| {
            let flat = i % (g.experts * g.moe_layers);
            (
                ExpertId::new(flat / g.experts, flat % g.experts),
                SlotId(i as u32),
            )
        })
        .collect()
}

/// Measure both methods for each gather size in `sizes` (experts), `reps` times each, and
/// keep the faster per size.
pub fn measure(
    device: &Device,
    stream: &Stream,
    bank: &HostBank,
    pool: &SlotPool,
    sizes: &[usize],
    reps: usize,
) -> Result<GatherChoice> {
    if reps == 0 {
        return Err(RuntimeError::invalid("gather measure reps", "must be > 0"));
    }
    let mut points = Vec::new();
    for &n in sizes {
        if n == 0 || n > pool.count() {
            return Err(RuntimeError::invalid(
                "gather measure sizes",
                format!("{n} experts, the pool has {} slots", pool.count()),
            ));
        }
        let moves = probe_moves(bank, n);
        let ce = ft_kernels::stream::median(&time_gather(
            device,
            stream,
            bank,
            pool,
            &moves,
            GatherMethod::CopyEngine,
            reps,
        )?);
        let zc = ft_kernels::stream::median(&time_gather(
            device,
            stream,
            bank,
            pool,
            &moves,
            GatherMethod::ZeroCopy,
            reps,
        )?);
        let chosen = if zc < ce {
            GatherMethod::ZeroCopy
        } else {
            GatherMethod::CopyEngine
        };
        tracing::info!(experts = n, copy_engine_us = ce, zero_copy_us = zc, %chosen, "gather measured");
        points.push(GatherPoint {
            experts: n,
            expert_bytes: pool.expert_bytes() as u64,
            copy_engine_us: ce,
            zero_copy_us: zc,
            reps,
            chosen,
        });
    }
    points.sort_by_key(|p| p.bytes());
    Ok(GatherChoice {
        device: device.info().name.clone(),
        host_memory: device.info().host_memory.clone(),
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDeviceConfig;
    use ft_model::{ExpertFormat, MoeGeometry};

    fn setup() -> (Device, HostBank, SlotPool) {
        let d = Device::host(HostDeviceConfig {
            memory_bytes: 64 << 20,
            ..Default::default()
        })
        .unwrap();
        let g = MoeGeometry {
            hidden: 64,
            intermediate: 64,
            experts: 8,
            top_k: 2,
            moe_layers: 2,
            shared_experts: 0,
        };
        let bank = HostBank::from_seed(&d, ExpertFormat::Mxfp4, &g, 1).unwrap();
        let pool = SlotPool::new(&d, bank.layout().expert_bytes as u64, 6, 0).unwrap();
        (d, bank, pool)
    }

    #[test]
    fn both_methods_put_the_experts_bytes_in_their_slots() {
        let (d, bank, pool) = setup();
        let s = d.new_stream("copy").unwrap();
        let moves = [
            (ExpertId::new(1, 3), SlotId(4)),
            (ExpertId::new(0, 7), SlotId(0)),
        ];
        for m in GatherMethod::ALL {
            s.memset_zero(pool.buffer(), 0, pool.buffer().len())
                .unwrap();
            gather(&s, &bank, &pool, &moves, m).unwrap();
            for (id, slot) in moves {
                let mut got = vec![0u8; pool.expert_bytes()];
                s.download(pool.buffer(), pool.offset(slot).unwrap(), &mut got)
                    .unwrap();
                assert_eq!(got, bank.expert(id).unwrap(), "{m} {id}");
            }
        }
        let e = gather(
            &s,
            &bank,
            &pool,
            &[(ExpertId::new(0, 0), SlotId(6))],
            GatherMethod::CopyEngine,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("S6"), "{e}");
    }

    #[test]
    fn measurement_chooses_the_faster_and_picks_by_nearest_size() {
        let (d, bank, pool) = setup();
        let s = d.new_stream("copy").unwrap();
        let c = measure(&d, &s, &bank, &pool, &[1, 4], 3).unwrap();
        assert_eq!(c.points.len(), 2);
        for p in &c.points {
            assert!(p.copy_engine_us > 0.0 && p.zero_copy_us > 0.0);
            let faster = if p.zero_copy_us < p.copy_engine_us {
                GatherMethod::ZeroCopy
            } else {
                GatherMethod::CopyEngine
            };
            assert_eq!(p.chosen, faster);
        }
        let mut hand = c.clone();
        hand.points[0].chosen = GatherMethod::ZeroCopy;
        hand.points[1].chosen = GatherMethod::CopyEngine;
        let eb = pool.expert_bytes() as u64;
        assert_eq!(hand.method_for(1, eb), GatherMethod::ZeroCopy);
        assert_eq!(hand.method_for(5, eb), GatherMethod::CopyEngine);
        let json = serde_json::to_string(&hand).unwrap();
        assert_eq!(serde_json::from_str::<GatherChoice>(&json).unwrap(), hand);
        assert!(measure(&d, &s, &bank, &pool, &[7], 1).is_err());
    }
}
