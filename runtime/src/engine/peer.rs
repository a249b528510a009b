//! The peer combine of several GPUs and what each GPU did in a step.
//!
//! Why it exists: on G > 1 GPUs each GPU computes a partial output of a layer (the experts it
//! holds under sharding, a slice of every expert under tensor parallelism); the schedule's
//! `PeerCombine` sums them and gives every GPU the sum before each finishes the layer (the
//! fixed-order tree, the residual add) on identical rows, so every GPU's residual stream
//! stays the same. The sum covers the expert-output rows *before* the tree (in fixed order one
//! row per (stream, top-k position)), so under sharding each row has exactly one non-zero
//! contribution and the sum is exact: sharded outputs are bit-identical to one GPU's wherever
//! the expert kernels are. It runs through NCCL (`ncclAllReduce`, loaded at run time through
//! cudarc) on CUDA when the library loads, else through the host: each GPU's rows down, a sum
//! in GPU order, the sum up to every GPU ([`CombineMethod`] says which ran).

use ft_model::GpuLayout;
use serde::{Deserialize, Serialize};

use crate::device::{Device, DeviceBuffer, DeviceKind, Event, Stream};
use crate::error::Result;
use crate::instrument::LayerCounts;

/// How the partial outputs of the GPUs were summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CombineMethod {
    /// One GPU: nothing to combine.
    None,
    /// Through the host: device-to-host copies, a sum in GPU order on the host,
    /// host-to-device copies (the host-emulated device, and CUDA without NCCL).
    Host,
    /// `ncclAllReduce` (sum, f32) on every GPU's compute stream.
    Nccl,
}

impl CombineMethod {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            CombineMethod::None => "none",
            CombineMethod::Host => "host (D2H + sum + H2D)",
            CombineMethod::Nccl => "nccl all-reduce",
        }
    }
}

/// Counts of one GPU summed over layers (and steps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuCounts {
    /// Distinct experts found in this GPU's cache (or its resident layers), summed over
    /// layers.
    pub hits: u64,
    /// Distinct experts this GPU computes that were not in its cache (`fetched + cpu`).
    pub misses: u64,
    /// Misses gathered over this GPU's link.
    pub fetched: u64,
    /// Misses computed on this GPU's CPU workers.
    pub cpu: u64,
    /// (token, expert) pairs on this GPU (hits and fetched).
    pub gpu_tokens: u64,
    /// (token, expert) pairs on this GPU's CPU workers.
    pub cpu_tokens: u64,
    /// Bytes gathered over this GPU's link (a slice per expert under tensor parallelism).
    pub gathered_bytes: u64,
    /// Bytes this GPU sent in the combines (the ring all-reduce's share,
    /// [`GpuLayout::combine_bytes_per_gpu`]); 0 on one GPU.
    pub combine_bytes: u64,
}

impl GpuCounts {
    pub(crate) fn add_layer(&mut self, c: &LayerCounts) {
        self.hits += c.hits as u64;
        self.misses += c.misses as u64;
        self.fetched += c.fetched as u64;
        self.cpu += c.cpu as u64;
        self.gpu_tokens += c.gpu_tokens as u64;
        self.cpu_tokens += c.cpu_tokens as u64;
        self.gathered_bytes += c.gathered_bytes;
    }

    /// Add another count.
    pub fn add(&mut self, o: &GpuCounts) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.fetched += o.fetched;
        self.cpu += o.cpu;
        self.gpu_tokens += o.gpu_tokens;
        self.cpu_tokens += o.cpu_tokens;
        self.gathered_bytes += o.gathered_bytes;
        self.combine_bytes += o.combine_bytes;
    }

    /// Misses over distinct experts looked up (0 when nothing was looked up).
    pub fn miss_rate(&self) -> f64 {
        let all = self.hits + self.misses;
        if all == 0 {
            0.0
        } else {
            self.misses as f64 / all as f64
        }
    }
}

/// What one GPU did in one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuStep {
    /// Its plan counts, summed over the layers.
    pub counts: GpuCounts,
    /// Host time of this GPU's CPU shares, us (its pool's layer calls, summed over layers).
    pub cpu_us: f64,
}

/// The peer combine's implementation.
pub(crate) enum Combiner {
    None,
    Host,
    #[cfg(feature = "cuda")]
    Nccl(crate::device::cuda::NcclComms),
}

impl Combiner {
    /// The combine for `devices` of `layout`: none on one GPU; NCCL on CUDA when the library
    /// loads (its absence is logged and the host combine used), the host combine otherwise.
    pub fn open(devices: &[Device], layout: GpuLayout) -> Combiner {
        if !layout.is_multi() {
            return Combiner::None;
        }
        #[cfg(feature = "cuda")]
        if devices[0].kind() == DeviceKind::Cuda {
            let ordinals: Vec<usize> = devices.iter().map(|d| d.info().ordinal).collect();
            match crate::device::cuda::NcclComms::new(&ordinals) {
                Ok(c) => {
                    tracing::info!(gpus = ordinals.len(), "combine: NCCL all-reduce");
                    return Combiner::Nccl(c);
                }
                Err(reason) => {
                    tracing::warn!(
                        "combine through the host (D2H + sum + H2D): NCCL unavailable: {reason}"
                    );
                }
            }
        }
        let _ = (devices, DeviceKind::Host);
        Combiner::Host
    }

    /// Which method it is.
    pub fn method(&self) -> CombineMethod {
        match self {
            Combiner::None => CombineMethod::None,
            Combiner::Host => CombineMethod::Host,
            #[cfg(feature = "cuda")]
            Combiner::Nccl(_) => CombineMethod::Nccl,
        }
    }

    /// Sum the first `n` f32 of every GPU's `(stream, rows)` and give every GPU the sum,
    /// with `sum` as the host's scratch; `timed` the events around an all-reduce on GPU 0's
    /// stream (NCCL, timeline on). Returns the host-measured time of a host combine, us (0
    /// for NCCL, timed by the events).
    pub fn combine(
        &self,
        parts: &[(&Stream, &DeviceBuffer)],
        n: usize,
        sum: &mut Vec<f32>,
        timed: Option<&(Event, Event)>,
        clock: crate::device::Clock,
    ) -> Result<f64> {
        match self {
            Combiner::None => {
                let _ = (parts, n, sum, timed, clock);
                Ok(0.0)
            }
            Combiner::Host => {
                let t = clock.now_us();
                sum.clear();
                sum.resize(n, 0.0);
                // In GPU order, so the rounding is fixed: ((y0 + y1) + y2) + ...
                for (i, (stream, rows)) in parts.iter().enumerate() {
                    let part = stream.download_f32(rows, 0, n)?;
                    if i == 0 {
                        sum.copy_from_slice(&part);
                    } else {
                        sum.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
                    }
                }
                for (stream, rows) in parts {
                    stream.upload_f32(sum, rows, 0)?;
                }
                Ok(clock.now_us() - t)
            }
            #[cfg(feature = "cuda")]
            Combiner::Nccl(comms) => {
                if let Some((a, _)) = timed {
                    parts[0].0.record(a)?;
                }
                comms.all_reduce_sum_f32(parts, n)?;
                if let Some((_, z)) = timed {
                    parts[0].0.record(z)?;
                }
                Ok(0.0)
            }
        }
    }
}
