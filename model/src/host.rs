//! Host specifications: what a machine offers (GPU, PCIe link, CPU and DRAM) and what the
//! engine running on it costs (fixed costs per copy, per expert, per layer; contention).
//!
//! A [`HostSpec`] is the input of the analytic model when no fitted profile exists, and the
//! input of the simulator's what-if hosts. Both turn it into cost parameters through one
//! mapping, [`crate::perf::PerfParams::from_host`], so the two views cannot disagree about
//! what a host means. The `[engine]` section is separate from the hardware sections on
//! purpose: the same hardware runs different engines (this project's runtime, the reference
//! engine of the field report), and the fixed costs that decide small-expert decode
//! (design mechanism 2) belong to the engine, not to the silicon.
//!
//! Several GPUs (issue #9): `[gpu] count` GPUs of one kind decode together, laid out by
//! `[gpu] placement` (`sharded`, the default, or `tensor-parallel`; see
//! [`crate::placement`]), and combine their partial outputs at the end of every layer over
//! the peer link of the optional `[interconnect]` section (through host memory over PCIe
//! when absent: [`HostSpec::interconnect`]). [`HostSpec::gpu_layout`] is what the model,
//! the simulator and the runtime read.
//!
//! Units: bandwidths in GB/s (1e9 bytes per second), times in microseconds (us), memory in
//! GiB (2^30 bytes), expert sizes in bytes.

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::placement::{GpuLayout, GpuPlacement};
use crate::preset::ModelSpec;

/// A machine and the engine that decodes on it.
///
/// Read and written through [`HostSpecToml`], the TOML form, which adds `[gpu] placement`
/// and `[interconnect]` to these fields (stored in [`EngineSpec::multi_gpu`]; read them with
/// [`HostSpec::gpu_layout`] and [`HostSpec::interconnect`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "HostSpecToml", into = "HostSpecToml")]
pub struct HostSpec {
    /// Short name shown in tables (a preset's name, or a file's stem when left empty).
    #[serde(default)]
    pub name: String,
    /// Free text: where the numbers come from.
    #[serde(default)]
    pub description: String,
    /// The GPU(s).
    pub gpu: GpuSpec,
    /// The host-to-GPU link.
    pub pcie: PcieSpec,
    /// The CPU and its memory.
    pub cpu: CpuSpec,
    /// Implementation costs of the engine; this project's runtime on the H200 machine when
    /// absent.
    #[serde(default)]
    pub engine: EngineSpec,
}

/// `[gpu]`: the accelerator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Device name as the driver reports it (part of the profile fingerprint).
    pub name: String,
    /// Number of GPUs of this kind decoding together (at least 1), laid out by `placement`
    /// (see [`HostSpec::gpu_layout`]); 1 is the single-GPU case.
    pub count: u32,
    /// Memory of one GPU, in GiB.
    pub memory_gib: f64,
    /// Peak memory (HBM/GDDR) bandwidth of one GPU, in GB/s.
    pub hbm_gbs: f64,
}

/// `[pcie]`: the link experts are gathered over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieSpec {
    /// Linear host-to-device bandwidth from pinned memory (one large copy), in GB/s.
    pub h2d_gbs: f64,
    /// Linear device-to-host bandwidth into pinned memory, in GB/s.
    pub d2h_gbs: f64,
    /// Latency of one transfer (submit to first byte plus completion), in us.
    pub latency_us: f64,
    /// Expert-gather bandwidth as a bench measured it at the engine's tuning geometry
    /// (`engine.tuning_model`), in GB/s; it includes the engine's per-expert copy costs.
    /// When absent the gather streams at `h2d_gbs * engine.gather_efficiency`.
    #[serde(default)]
    pub gather_gbs: Option<f64>,
}

/// `[cpu]`: the host processor and its DRAM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSpec {
    /// CPU model name (part of the profile fingerprint).
    pub name: String,
    /// Physical cores over all sockets.
    pub cores: u32,
    /// Hardware threads over all sockets.
    pub threads: u32,
    /// NUMA nodes.
    pub numa_nodes: u32,
    /// STREAM-like read bandwidth of the CPU cores alone with all threads, in GB/s.
    pub stream_read_gbs: f64,
    /// CPU-MoE bandwidth (expert bytes over expert-step time) as a bench measured it at the
    /// engine's tuning geometry (`engine.tuning_model`, one token per expert), in GB/s. It
    /// includes the engine's per-expert and per-layer fixed costs, which is why it does not
    /// transfer to smaller experts; the model removes them (see `PerfParams::from_host`).
    #[serde(default)]
    pub moe_gbs: Option<f64>,
}

/// `[interconnect]`: the GPUs' peer link, over which every layer's partial outputs are
/// combined (an all-reduce) when `gpu.count > 1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterconnectSpec {
    /// Free text naming the link (`NVLink 3 bridge`, `PCIe through host`).
    #[serde(default)]
    pub name: String,
    /// Bandwidth one GPU sends its share of an all-reduce at (the bus bandwidth
    /// `all_reduce_perf` of nccl-tests reports), in GB/s.
    pub peer_gbs: f64,
    /// Fixed cost of one combine (launch, protocol, the peers' synchronisation), in us.
    pub latency_us: f64,
}

/// Share of the slower PCIe direction a combine staged through host memory reaches, when
/// `[interconnect]` is absent. Estimate: without peer-to-peer (GeForce cards such as the
/// RTX 3090 have none over PCIe) NCCL's shared-memory transport copies each chunk GPU to
/// host and host to GPU; the two copies pipeline, but each GPU's link carries its sends and
/// its receives and every byte crosses host DRAM twice, so about half the link rate is what
/// such a ring sustains. Replace it with a measured `all_reduce_perf -g G` bus bandwidth.
pub const HOST_STAGED_PEER_SHARE: f64 = 0.5;

/// Fixed cost of one combine staged through host memory, beyond the two PCIe latencies
/// (GPU to host, host to GPU), in us, when `[interconnect]` is absent. Estimate: a
/// small-message NCCL all-reduce without peer-to-peer takes tens of us (kernel launch,
/// host-memory flags polled by both GPUs); 15 us plus the two latencies.
pub const HOST_STAGED_COMBINE_US: f64 = 15.0;

/// Bandwidth of an RTX 3090 NVLink 3 bridge, one direction, in GB/s: 4 links x 14.0625 GB/s
/// (NVIDIA's 112.5 GB/s total for both directions). For a `[interconnect]` of NVLinked
/// 3090 pairs.
pub const RTX3090_NVLINK_GBS: f64 = 56.25;

/// What several GPUs add to a host spec; read from `[gpu] placement` and `[interconnect]`
/// and kept in [`EngineSpec::multi_gpu`] (not in [`GpuSpec`], whose struct literals
/// elsewhere predate it). Use [`HostSpec::gpu_layout`] and [`HostSpec::interconnect`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MultiGpuSpec {
    /// `[gpu] placement`: how experts are laid out over the GPUs.
    pub placement: GpuPlacement,
    /// `[interconnect]`, when given.
    pub interconnect: Option<InterconnectSpec>,
}

/// The TOML (and JSON) form of a [`HostSpec`]: its sections, with `placement` in `[gpu]`
/// and the optional `[interconnect]`. Unknown keys are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpecToml {
    /// [`HostSpec::name`].
    #[serde(default)]
    pub name: String,
    /// [`HostSpec::description`].
    #[serde(default)]
    pub description: String,
    /// `[gpu]` with its placement.
    pub gpu: GpuSection,
    /// `[pcie]` with the link's generation and width.
    pub pcie: PcieSection,
    /// `[cpu]` with its memory channels.
    pub cpu: CpuSection,
    /// [`HostSpec::engine`].
    #[serde(default)]
    pub engine: EngineSpec,
    /// `[interconnect]`: the peer link of several GPUs; through host over PCIe when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interconnect: Option<InterconnectSpec>,
}

/// `[gpu]` as written: [`GpuSpec`] and the placement. `memory_gib` and `hbm_gbs` may be
/// left out for a GPU of [`GPU_TABLE`] (derived from its name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSection {
    /// [`GpuSpec::name`].
    pub name: String,
    /// [`GpuSpec::count`]; 1 when absent.
    #[serde(default = "one")]
    pub count: u32,
    /// [`GpuSpec::memory_gib`]; from [`GPU_TABLE`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
    /// [`GpuSpec::hbm_gbs`]; from [`GPU_TABLE`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_gbs: Option<f64>,
    /// How experts are laid out over `count` GPUs: `sharded` (default) or
    /// `tensor-parallel`.
    #[serde(default, skip_serializing_if = "is_sharded")]
    pub placement: GpuPlacement,
}

/// `[pcie]` as written: [`PcieSpec`]'s rates, each optional with a derivation, and the
/// link's generation and width they are derived from (and checked against).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieSection {
    /// PCIe generation of the GPU's link (1 to 6), as `nvidia-smi -q` or `lspci -vv` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    /// Lanes of the GPU's link (1 to 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<u32>,
    /// [`PcieSpec::h2d_gbs`]; `lanes x` [`pcie_lane_gbs`]`(generation) x`
    /// [`PCIE_DMA_EFFICIENCY`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2d_gbs: Option<f64>,
    /// [`PcieSpec::d2h_gbs`]; `h2d_gbs` when absent (links are symmetric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d2h_gbs: Option<f64>,
    /// [`PcieSpec::latency_us`]; [`DEFAULT_PCIE_LATENCY_US`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    /// [`PcieSpec::gather_gbs`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gather_gbs: Option<f64>,
}

/// `[cpu]` as written: [`CpuSpec`], with `threads`, `numa_nodes` and `stream_read_gbs`
/// optional, and the memory channels `stream_read_gbs` is derived from (and checked
/// against).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSection {
    /// [`CpuSpec::name`].
    pub name: String,
    /// [`CpuSpec::cores`].
    pub cores: u32,
    /// [`CpuSpec::threads`]; `cores` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// [`CpuSpec::numa_nodes`]; 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_nodes: Option<u32>,
    /// Populated DRAM channels over all sockets (`dmidecode -t memory` lists the DIMMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_channels: Option<u32>,
    /// DRAM transfer rate, in MT/s (the `DDR5-4800` of a DIMM is 4800).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mts: Option<u32>,
    /// [`CpuSpec::stream_read_gbs`]; `memory_channels x memory_mts x 8 B x`
    /// [`STREAM_READ_SHARE_OF_PEAK`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_read_gbs: Option<f64>,
    /// [`CpuSpec::moe_gbs`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_gbs: Option<f64>,
}

fn one() -> u32 {
    1
}

/// What a host file says about its hardware beyond [`HostSpec`]'s values (the PCIe
/// generation and width, the memory channels and their rate), and which values were
/// derived rather than given. Kept in [`EngineSpec::hardware`] (not in [`HostSpec`], whose
/// struct literals elsewhere predate it); [`HostSpec::derived`] reads it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostHardware {
    /// `[pcie] generation`.
    pub pcie_generation: Option<u32>,
    /// `[pcie] lanes`.
    pub pcie_lanes: Option<u32>,
    /// `[cpu] memory_channels`.
    pub memory_channels: Option<u32>,
    /// `[cpu] memory_mts`, in MT/s.
    pub memory_mts: Option<u32>,
    /// The values derived when the file was read, in key order of the file.
    pub derived: Vec<Derived>,
}

/// One host value the file left out, and how it was derived.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Derived {
    /// Its key (`pcie.d2h_gbs`).
    pub key: &'static str,
    /// The value derived, in `unit`.
    pub value: f64,
    /// Its unit (`GB/s`, `us`, `GiB`, `count`).
    pub unit: &'static str,
    /// How, in words and numbers.
    pub how: String,
}

fn is_sharded(p: &GpuPlacement) -> bool {
    *p == GpuPlacement::Sharded
}

impl TryFrom<HostSpecToml> for HostSpec {
    type Error = ModelError;

    fn try_from(t: HostSpecToml) -> Result<Self> {
        let mut engine = t.engine;
        engine.multi_gpu = MultiGpuSpec {
            placement: t.gpu.placement,
            interconnect: t.interconnect,
        };
        let mut derived = Vec::new();
        let mut derive = |key: &'static str, unit: &'static str, value: f64, how: String| {
            derived.push(Derived {
                key,
                value,
                unit,
                how,
            });
            value
        };

        let table = gpu_table_entry(&t.gpu.name);
        let from_table = |key: &str, pick: fn(&GpuTableRow) -> f64| {
            table.map(|row| (pick(row), row)).ok_or_else(|| {
                ModelError::invalid(
                    key,
                    format!(
                        "missing, and GPU '{}' is not in ft's table of GPUs ({}); give it \
                         from the GPU's specification",
                        t.gpu.name,
                        GPU_TABLE
                            .iter()
                            .map(|r| r.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
        };
        let memory_gib = match t.gpu.memory_gib {
            Some(v) => v,
            None => {
                let (v, row) = from_table("gpu.memory_gib", |r| r.memory_gib)?;
                derive("gpu.memory_gib", "GiB", v, format!("{}'s memory", row.name))
            }
        };
        let hbm_gbs = match t.gpu.hbm_gbs {
            Some(v) => v,
            None => {
                let (v, row) = from_table("gpu.hbm_gbs", |r| r.hbm_gbs)?;
                derive(
                    "gpu.hbm_gbs",
                    "GB/s",
                    v,
                    format!("{}'s published memory bandwidth", row.name),
                )
            }
        };

        let p = &t.pcie;
        let h2d_gbs = match (p.h2d_gbs, p.generation, p.lanes) {
            (Some(v), _, _) => v,
            (None, Some(generation), Some(lanes)) => {
                let lane = pcie_lane_gbs(generation).ok_or_else(|| {
                    ModelError::invalid(
                        "pcie.generation",
                        format!("{generation} is not a PCIe generation (1 to 6)"),
                    )
                })?;
                derive(
                    "pcie.h2d_gbs",
                    "GB/s",
                    lane * lanes as f64 * PCIE_DMA_EFFICIENCY,
                    format!(
                        "PCIe {generation}.0 x{lanes}: {:.2} GB/s raw x {PCIE_DMA_EFFICIENCY} \
                         DMA efficiency",
                        lane * lanes as f64
                    ),
                )
            }
            _ => {
                return Err(ModelError::invalid(
                    "pcie.h2d_gbs",
                    "missing: give it (a pinned host-to-device copy's GB/s, as `ft probe` or \
                     nvbandwidth measure it), or pcie.generation and pcie.lanes to derive it",
                ))
            }
        };
        let d2h_gbs = match p.d2h_gbs {
            Some(v) => v,
            None => derive(
                "pcie.d2h_gbs",
                "GB/s",
                h2d_gbs,
                "equal to pcie.h2d_gbs (the link is symmetric)".to_string(),
            ),
        };
        let latency_us = match p.latency_us {
            Some(v) => v,
            None => derive(
                "pcie.latency_us",
                "us",
                DEFAULT_PCIE_LATENCY_US,
                "a small pinned copy's submit-to-completion on a discrete GPU (estimate)"
                    .to_string(),
            ),
        };

        let c = &t.cpu;
        let threads = match c.threads {
            Some(v) => v,
            None => derive(
                "cpu.threads",
                "count",
                c.cores as f64,
                "equal to cpu.cores (no SMT assumed)".to_string(),
            ) as u32,
        };
        let numa_nodes = match c.numa_nodes {
            Some(v) => v,
            None => derive(
                "cpu.numa_nodes",
                "count",
                1.0,
                "one node assumed".to_string(),
            ) as u32,
        };
        let stream_read_gbs = match (c.stream_read_gbs, c.memory_channels, c.memory_mts) {
            (Some(v), _, _) => v,
            (None, Some(ch), Some(mts)) => {
                let peak = dram_peak_gbs(ch, mts);
                derive(
                    "cpu.stream_read_gbs",
                    "GB/s",
                    peak * STREAM_READ_SHARE_OF_PEAK,
                    format!(
                        "{ch} channels x {mts} MT/s x 8 B = {peak:.1} GB/s peak x \
                         {STREAM_READ_SHARE_OF_PEAK} reached by STREAM read"
                    ),
                )
            }
            _ => {
                return Err(ModelError::invalid(
                    "cpu.stream_read_gbs",
                    "missing: give it (`ft bench bw` measures it), or cpu.memory_channels and \
                     cpu.memory_mts to derive it",
                ))
            }
        };
        engine.hardware = HostHardware {
            pcie_generation: p.generation,
            pcie_lanes: p.lanes,
            memory_channels: c.memory_channels,
            memory_mts: c.memory_mts,
            derived,
        };
        Ok(HostSpec {
            name: t.name,
            description: t.description,
            gpu: GpuSpec {
                name: t.gpu.name,
                count: t.gpu.count,
                memory_gib,
                hbm_gbs,
            },
            pcie: PcieSpec {
                h2d_gbs,
                d2h_gbs,
                latency_us,
                gather_gbs: p.gather_gbs,
            },
            cpu: CpuSpec {
                name: c.name.clone(),
                cores: c.cores,
                threads,
                numa_nodes,
                stream_read_gbs,
                moe_gbs: c.moe_gbs,
            },
            engine,
        })
    }
}

impl From<HostSpec> for HostSpecToml {
    /// Values derived when the file was read (and not changed since) are left out, so that
    /// the written file derives them again and stays marked as derived.
    fn from(h: HostSpec) -> Self {
        let mut engine = h.engine;
        let multi = std::mem::take(&mut engine.multi_gpu);
        let hw = std::mem::take(&mut engine.hardware);
        let given = |key: &str, v: f64| {
            let derived = hw.derived.iter().any(|d| d.key == key && d.value == v);
            (!derived).then_some(v)
        };
        HostSpecToml {
            name: h.name,
            description: h.description,
            gpu: GpuSection {
                name: h.gpu.name,
                count: h.gpu.count,
                memory_gib: given("gpu.memory_gib", h.gpu.memory_gib),
                hbm_gbs: given("gpu.hbm_gbs", h.gpu.hbm_gbs),
                placement: multi.placement,
            },
            pcie: PcieSection {
                generation: hw.pcie_generation,
                lanes: hw.pcie_lanes,
                h2d_gbs: given("pcie.h2d_gbs", h.pcie.h2d_gbs),
                d2h_gbs: given("pcie.d2h_gbs", h.pcie.d2h_gbs),
                latency_us: given("pcie.latency_us", h.pcie.latency_us),
                gather_gbs: h.pcie.gather_gbs,
            },
            cpu: CpuSection {
                name: h.cpu.name,
                cores: h.cpu.cores,
                threads: given("cpu.threads", h.cpu.threads as f64).map(|v| v as u32),
                numa_nodes: given("cpu.numa_nodes", h.cpu.numa_nodes as f64).map(|v| v as u32),
                memory_channels: hw.memory_channels,
                memory_mts: hw.memory_mts,
                stream_read_gbs: given("cpu.stream_read_gbs", h.cpu.stream_read_gbs),
                moe_gbs: h.cpu.moe_gbs,
            },
            engine,
            interconnect: multi.interconnect,
        }
    }
}

/// Share of a PCIe link's raw rate (after line encoding) that one large pinned DMA copy
/// reaches: measured 0.77 on the field report's RTX 4090 (24.26 of 31.5 GB/s, gen 4 x16),
/// 0.87 on this project's H200 (55 of 63.0 GB/s, gen 5 x16) and 0.90 on the RTX PRO 4000 of
/// the reference engine's issue #436 (14.21 of 15.75 GB/s, gen 3 x16); 0.85 is their mean.
pub const PCIE_DMA_EFFICIENCY: f64 = 0.85;

/// `pcie.latency_us` when absent: a small pinned copy's submit-to-completion on a discrete
/// GPU, about 2 us (the prior `ft probe` starts from; the field host's estimate is 5 us).
pub const DEFAULT_PCIE_LATENCY_US: f64 = 2.0;

/// Share of the DRAM's peak (channels x MT/s x 8 bytes) that a STREAM-like read with all
/// cores reaches: estimated 0.56 on the field host (190 of 341 GB/s, two sockets), 0.67 on a
/// desktop Zen 4 (64 of 96 GB/s), 0.80 on Grace (410 of 512 GB/s); 0.6 leans to the
/// multi-socket servers that hold MoE experts. `ft bench bw` measures the real value.
pub const STREAM_READ_SHARE_OF_PEAK: f64 = 0.6;

/// Raw rate of one PCIe lane of a generation after line encoding, in GB/s, one direction:
/// 2.5 and 5 GT/s with 8b/10b (gen 1, 2), 8, 16 and 32 GT/s with 128b/130b (gen 3 to 5),
/// 64 GT/s PAM4 with 242/256 FLIT (gen 6). `None` for another generation.
pub fn pcie_lane_gbs(generation: u32) -> Option<f64> {
    let (gts, encoding) = match generation {
        1 => (2.5, 8.0 / 10.0),
        2 => (5.0, 8.0 / 10.0),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 242.0 / 256.0),
        _ => return None,
    };
    Some(gts * encoding / 8.0)
}

/// Peak DRAM bandwidth of `channels` 64-bit channels at `mts` MT/s, in GB/s.
pub fn dram_peak_gbs(channels: u32, mts: u32) -> f64 {
    channels as f64 * mts as f64 * DRAM_CHANNEL_BYTES / 1e3
}

/// Bytes one DRAM channel moves per transfer (a 64-bit channel; DDR5's two 32-bit
/// subchannels make the same 8 bytes).
pub const DRAM_CHANNEL_BYTES: f64 = 8.0;

/// One row of [`GPU_TABLE`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuTableRow {
    /// The GPU, as its spec sheet names it.
    pub name: &'static str,
    /// Lower-case words the driver's name must all contain (`nvidia-smi --query-gpu=name`).
    pub words: &'static [&'static str],
    /// Memory as the driver reports it, in GiB.
    pub memory_gib: f64,
    /// Published memory bandwidth, in GB/s.
    pub hbm_gbs: f64,
}

/// GPUs whose memory and bandwidth `ft` knows (public spec sheets), most specific first:
/// a `[gpu]` of one of these may leave out `memory_gib` and `hbm_gbs`.
pub const GPU_TABLE: &[GpuTableRow] = &[
    GpuTableRow {
        name: "GH200",
        words: &["gh200"],
        memory_gib: 95.6,
        hbm_gbs: 4000.0,
    },
    GpuTableRow {
        name: "H200",
        words: &["h200"],
        memory_gib: 140.4,
        hbm_gbs: 4800.0,
    },
    GpuTableRow {
        name: "H100 PCIe",
        words: &["h100", "pcie"],
        memory_gib: 79.6,
        hbm_gbs: 2000.0,
    },
    GpuTableRow {
        name: "H100 NVL",
        words: &["h100", "nvl"],
        memory_gib: 93.6,
        hbm_gbs: 3900.0,
    },
    GpuTableRow {
        name: "H100 SXM",
        words: &["h100"],
        memory_gib: 79.6,
        hbm_gbs: 3350.0,
    },
    GpuTableRow {
        name: "B200",
        words: &["b200"],
        memory_gib: 179.1,
        hbm_gbs: 8000.0,
    },
    GpuTableRow {
        name: "A100 80GB",
        words: &["a100", "80gb"],
        memory_gib: 80.0,
        hbm_gbs: 2039.0,
    },
    GpuTableRow {
        name: "A100 40GB",
        words: &["a100"],
        memory_gib: 40.0,
        hbm_gbs: 1555.0,
    },
    GpuTableRow {
        name: "L40S",
        words: &["l40s"],
        memory_gib: 45.0,
        hbm_gbs: 864.0,
    },
    GpuTableRow {
        name: "RTX 6000 Ada",
        words: &["rtx", "6000", "ada"],
        memory_gib: 48.0,
        hbm_gbs: 960.0,
    },
    GpuTableRow {
        name: "RTX PRO 6000 Blackwell",
        words: &["rtx pro 6000"],
        memory_gib: 95.6,
        hbm_gbs: 1792.0,
    },
    GpuTableRow {
        name: "RTX PRO 4000 Blackwell",
        words: &["rtx pro 4000"],
        memory_gib: 24.0,
        hbm_gbs: 672.0,
    },
    GpuTableRow {
        name: "RTX A6000",
        words: &["a6000"],
        memory_gib: 48.0,
        hbm_gbs: 768.0,
    },
    GpuTableRow {
        name: "RTX 5090",
        words: &["5090"],
        memory_gib: 31.8,
        hbm_gbs: 1792.0,
    },
    GpuTableRow {
        name: "RTX 4090",
        words: &["4090"],
        memory_gib: 24.0,
        hbm_gbs: 1008.0,
    },
    GpuTableRow {
        name: "RTX 3090 Ti",
        words: &["3090 ti"],
        memory_gib: 24.0,
        hbm_gbs: 1008.0,
    },
    GpuTableRow {
        name: "RTX 3090",
        words: &["3090"],
        memory_gib: 24.0,
        hbm_gbs: 936.0,
    },
];

/// The [`GPU_TABLE`] row of a driver's GPU name, if any.
pub fn gpu_table_entry(name: &str) -> Option<&'static GpuTableRow> {
    let lower = name.to_ascii_lowercase();
    GPU_TABLE
        .iter()
        .find(|r| r.words.iter().all(|w| lower.contains(w)))
}

/// Fastest PCIe link a host file is checked against when its generation and width are not
/// given: PCIe 6.0 x16, 121 GB/s one way. Rates above it are plausible only on a coherent
/// CPU-GPU link (NVLink-C2C of Grace Hopper and Grace Blackwell), which is not checked.
pub fn pcie_ceiling_gbs() -> f64 {
    pcie_lane_gbs(6).expect("gen 6 is known") * 16.0
}

/// Fastest host DRAM a host file is checked against when its channels are not given: two
/// sockets of 12 DDR5-6400 channels, 1229 GB/s.
pub const DRAM_CEILING_GBS: f64 = 2.0 * 12.0 * 6400.0 * DRAM_CHANNEL_BYTES / 1e3;

/// `[engine]`: what the engine's implementation costs on this host.
///
/// Defaults are this project's runtime as measured on the H200 machine where a measurement
/// exists (pinned H2D copies, CPU read under DMA, the GPU-to-host event round trip), and
/// documented estimates elsewhere; every estimate is a parameter the probe fit replaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSpec {
    /// Free text naming the engine these costs describe.
    pub name: String,
    /// Model preset whose expert size the bench bandwidths (`cpu.moe_gbs`,
    /// `pcie.gather_gbs`) were measured at.
    pub tuning_model: String,
    /// Experts per layer of the bench step at the tuning geometry; the tuning model's
    /// top-k when absent.
    pub tuning_experts: Option<u32>,
    /// Share of `pcie.h2d_gbs` a gather's byte stream reaches (0 to 1], when
    /// `pcie.gather_gbs` is not given.
    pub gather_efficiency: f64,
    /// Fixed cost of one expert copy in a gather (descriptor, submit), in us.
    pub gather_copy_us: f64,
    /// Fixed cost of one gather of a layer (launch, completion event), in us; the link's
    /// `latency_us` is added to it.
    pub gather_layer_us: f64,
    /// CPU threads the engine's expert pool runs; `cpu.cores` when absent.
    pub cpu_threads: Option<u32>,
    /// Share of `cpu.stream_read_gbs` the CPU expert kernel streams weights at, when
    /// `cpu.moe_gbs` is not given (0 to 1].
    pub cpu_kernel_efficiency: f64,
    /// Fixed CPU cost of one layer's expert step (submit, barrier, merge, activation
    /// copies), in us.
    pub cpu_layer_us: f64,
    /// Wake-up latency of the CPU expert pool at the start of a layer's CPU share, in us.
    pub cpu_wake_us: f64,
    /// Fixed CPU cost per expert (dispatch, scale setup), in us.
    pub cpu_expert_us: f64,
    /// CPU multiply-accumulate rate for the tokens routed to a CPU expert, over the whole
    /// pool, in GMAC/s (1e9 per second).
    pub cpu_token_gmacs: f64,
    /// Exponent of the CPU kernel's scaling with threads: the weight-streaming rate at `t`
    /// threads is the rate at `cpu_threads` times `(t / cpu_threads)^exponent` (1 = linear,
    /// 0 = saturated), dimensionless.
    pub cpu_thread_exponent: f64,
    /// Host DRAM read bandwidth that CPU kernels and DMA share when both run, in GB/s; when
    /// absent, `cpu.stream_read_gbs * DEFAULT_DRAM_OVER_STREAM`.
    pub dram_gbs: Option<f64>,
    /// Weight of DMA against CPU reads when the two together ask for more than `dram_gbs`:
    /// each gets a share of `dram_gbs` proportional to weight times its isolated rate
    /// (1 = plain proportional sharing; below 1 DMA loses more), dimensionless.
    pub dma_dram_weight: f64,
    /// One GPU-to-host-to-GPU event round trip of a hybrid layer, in us.
    pub hybrid_round_trip_us: f64,
    /// Fixed cost of one GPU kernel launch, in us.
    pub gpu_launch_us: f64,
    /// Share of `gpu.hbm_gbs` expert and dense kernels reach at decode (0 to 1].
    pub gpu_hbm_efficiency: f64,
    /// GPU multiply-accumulate rate for tokens of an expert or dense layer, in GMAC/s.
    pub gpu_token_gmacs: f64,
    /// Fixed GPU cost of one layer's dense part (its kernel launches), in us.
    pub dense_layer_us: f64,
    /// GPU memory kept free of expert slots (context, workspace, activations), in GiB.
    pub gpu_reserve_gib: f64,
    /// Relative standard deviation of one measured throughput run (run-to-run noise of
    /// the end-to-end measurement), dimensionless.
    pub run_noise_rel: f64,
    /// `[gpu] placement` and `[interconnect]` (not `[engine]` keys: see [`MultiGpuSpec`]).
    #[serde(skip)]
    pub multi_gpu: MultiGpuSpec,
    /// The hardware keys of `[pcie]` and `[cpu]` and the derived values (not `[engine]`
    /// keys: see [`HostHardware`]).
    #[serde(skip)]
    pub hardware: HostHardware,
}

/// CPU read under DMA on the H200 machine: 105 GB/s alone with 16 threads, about 90 GB/s
/// while a 50 GB/s gather runs. Under the model's proportional sharing the shared DRAM read
/// bandwidth `D` solves `D * 105 / (105 + 50) = 90`, so `D = 132.9 GB/s = 1.266 * 105`.
pub const DEFAULT_DRAM_OVER_STREAM: f64 = 90.0 * (105.0 + 50.0) / (105.0 * 105.0);

impl Default for EngineSpec {
    fn default() -> Self {
        EngineSpec {
            name: "ft runtime (H200 machine)".to_string(),
            tuning_model: "bench-nvfp4".to_string(),
            tuning_experts: None,
            // Measured: pinned H2D about 50 GB/s of about 55 linear (0.9), about 7 us per copy.
            gather_efficiency: 0.9,
            gather_copy_us: 7.0,
            // Estimate: one event record and wait per layer.
            gather_layer_us: 3.0,
            cpu_threads: None,
            // Estimate: a W4A8 kernel that is memory-bound at one token reaches most of STREAM.
            cpu_kernel_efficiency: 0.8,
            // Estimates for a rayon pool: scope entry and barrier, merge, activation copies.
            cpu_layer_us: 10.0,
            cpu_wake_us: 5.0,
            cpu_expert_us: 1.5,
            // Estimate: 16 cores x about 50 GMAC/s of int8 dot products per core for the
            // tokens after the first (whose cost is in the weight-streaming rate).
            cpu_token_gmacs: 800.0,
            // Estimate: memory-bound kernels scale sublinearly with threads.
            cpu_thread_exponent: 0.8,
            dram_gbs: None,
            dma_dram_weight: 1.0,
            // Measured: GPU-to-host event round trip about 10 us.
            hybrid_round_trip_us: 10.0,
            // Estimates: a launch, and decode kernels reaching 70% of peak memory bandwidth.
            gpu_launch_us: 4.0,
            gpu_hbm_efficiency: 0.7,
            gpu_token_gmacs: 50_000.0,
            dense_layer_us: 8.0,
            gpu_reserve_gib: 2.0,
            run_noise_rel: 0.02,
            multi_gpu: MultiGpuSpec::default(),
            hardware: HostHardware::default(),
        }
    }
}

/// The field report's host (shared/seeds): RTX 4090 on PCIe 4.0 x16 and two Xeon Silver 4310
/// (24 cores, 2 NUMA nodes, 16 channels of DDR4-2666), running the reference engine, whose
/// gather is one batched copy kernel and whose CPU pool spins between layers.
pub const FIELD_REPORT_HOST_TOML: &str = r#"
name = "field-4090-xeon4310"
description = """The field report's host: RTX 4090 (PCIe 4.0 x16) + 2 x Xeon Silver 4310, reference \
engine. Measured: linear H2D 24.26 GB/s, gather 24.25 GB/s and CPU-MoE 46.12 GB/s at the 7.97 MB \
nvfp4 tuning geometry. Estimated: STREAM read (16 x DDR4-2666 = 341 GB/s peak, about 56% reached by \
reads of two sockets), D2H, and the engine's fixed costs. Inferred: the DRAM contention \
(dram_gbs, dma_dram_weight) is set so that the contended bench pair gives the reference engine's \
automatic fetch fraction of 27.7% (weight w solves w*24.25 / (w*24.25 + 46.12) = 0.277); \
dram_gbs = 60 GB/s is the level that makes the two sides contend at all (they ask 70.4)."""

[gpu]
name = "NVIDIA GeForce RTX 4090"
count = 1
memory_gib = 24.0
hbm_gbs = 1008.0

[pcie]
h2d_gbs = 24.26
d2h_gbs = 26.0
latency_us = 5.0
gather_gbs = 24.25

[cpu]
name = "Intel Xeon Silver 4310 x2"
cores = 24
threads = 48
numa_nodes = 2
stream_read_gbs = 190.0
moe_gbs = 46.12

[engine]
name = "reference engine (FreeToken) on the field host"
tuning_model = "bench-nvfp4"
gather_efficiency = 1.0
gather_copy_us = 0.1
gather_layer_us = 4.0
cpu_threads = 24
cpu_kernel_efficiency = 0.8
cpu_layer_us = 12.0
cpu_wake_us = 2.0
cpu_expert_us = 2.0
cpu_token_gmacs = 1000.0
cpu_thread_exponent = 0.8
dram_gbs = 60.0
dma_dram_weight = 0.7286
hybrid_round_trip_us = 15.0
gpu_launch_us = 4.0
gpu_hbm_efficiency = 0.75
gpu_token_gmacs = 40000.0
dense_layer_us = 8.0
gpu_reserve_gib = 3.0
run_noise_rel = 0.02
"#;

impl HostSpec {
    /// The field report's host (see [`FIELD_REPORT_HOST_TOML`]), the default of every
    /// subcommand that takes `--host`.
    pub fn field_report() -> Self {
        Self::from_toml_str(FIELD_REPORT_HOST_TOML, "built-in host field-4090-xeon4310")
            .expect("the built-in field-report host is valid")
    }

    /// Parse a TOML document; unknown keys are refused and invalid values are named with
    /// `origin` (a file path or a preset name) and their key.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        crate::error::parse_toml(text, origin, Self::validate)
    }

    /// Load a host from a TOML file; an empty `name` becomes the file's stem. Its derived
    /// values ([`HostSpec::derived`]) and implausible rates ([`HostSpec::warnings`]) are
    /// logged (warn level, on stderr), once per load.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = crate::error::read_text(path)?;
        let mut spec = Self::from_toml_str(&text, &path.display().to_string())?;
        if spec.name.trim().is_empty() {
            spec.name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "host".to_string());
        }
        let derived = spec.derived();
        if !derived.is_empty() {
            let list: Vec<String> = derived
                .iter()
                .map(|d| format!("{} = {:.4} {}", d.key, d.value, d.unit))
                .collect();
            tracing::warn!(
                "{}: derived, not measured: {} (`ft host show {}` says how)",
                path.display(),
                list.join(", "),
                path.display()
            );
        }
        for w in spec.warnings() {
            tracing::warn!("{}: {w}", path.display());
        }
        Ok(spec)
    }

    /// The values the host file left out and how they were derived (empty for a file that
    /// gives every value).
    pub fn derived(&self) -> &[Derived] {
        &self.engine.hardware.derived
    }

    /// Rates beyond what the hardware can physically move, one sentence each: a PCIe rate
    /// above the link's raw rate (the given generation and width, else
    /// [`pcie_ceiling_gbs`], not checked for Grace's NVLink-C2C), a DRAM rate above the
    /// channels' peak (else [`DRAM_CEILING_GBS`]), a CPU-MoE rate above STREAM read, and a
    /// GPU memory bandwidth above the [`GPU_TABLE`]'s for that GPU.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let hw = &self.engine.hardware;
        let link = match (hw.pcie_generation, hw.pcie_lanes) {
            (Some(g), Some(l)) => pcie_lane_gbs(g)
                .map(|lane| (lane * l as f64, format!("PCIe {g}.0 x{l}'s raw rate"))),
            _ => {
                let gpu = self.gpu.name.to_ascii_lowercase();
                let c2c = ["gh200", "gb200", "grace"].iter().any(|w| gpu.contains(w));
                (!c2c).then(|| (pcie_ceiling_gbs(), "PCIe 6.0 x16's raw rate".to_string()))
            }
        };
        if let Some((ceiling, what)) = link {
            for (key, v) in [
                ("pcie.h2d_gbs", Some(self.pcie.h2d_gbs)),
                ("pcie.d2h_gbs", Some(self.pcie.d2h_gbs)),
                ("pcie.gather_gbs", self.pcie.gather_gbs),
            ] {
                if let Some(v) = v.filter(|&v| v > ceiling) {
                    out.push(format!(
                        "{key} = {v} GB/s is more than {what}, {ceiling:.1} GB/s"
                    ));
                }
            }
        }
        let (dram, what) = match (hw.memory_channels, hw.memory_mts) {
            (Some(c), Some(m)) => (
                dram_peak_gbs(c, m),
                format!("the peak of {c} channels at {m} MT/s"),
            ),
            _ => (
                DRAM_CEILING_GBS,
                "two sockets of 12 DDR5-6400 channels".to_string(),
            ),
        };
        for (key, v) in [
            ("cpu.stream_read_gbs", Some(self.cpu.stream_read_gbs)),
            ("cpu.moe_gbs", self.cpu.moe_gbs),
            ("engine.dram_gbs", self.engine.dram_gbs),
        ] {
            if let Some(v) = v.filter(|&v| v > dram) {
                out.push(format!(
                    "{key} = {v} GB/s is more than {what}, {dram:.1} GB/s"
                ));
            }
        }
        if let Some(m) = self.cpu.moe_gbs.filter(|&m| m > self.cpu.stream_read_gbs) {
            out.push(format!(
                "cpu.moe_gbs = {m} GB/s is more than cpu.stream_read_gbs = {} GB/s: expert \
                 kernels stream their weights from DRAM and cannot read faster than STREAM",
                self.cpu.stream_read_gbs
            ));
        }
        if let Some(row) = gpu_table_entry(&self.gpu.name) {
            if self.gpu.hbm_gbs > row.hbm_gbs * 1.05 {
                out.push(format!(
                    "gpu.hbm_gbs = {} GB/s is more than the {}'s published {} GB/s",
                    self.gpu.hbm_gbs, row.name, row.hbm_gbs
                ));
            }
        }
        out
    }

    /// Render as TOML (the form [`HostSpec::from_toml_str`] reads).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a HostSpec always serializes")
    }

    /// The CPU threads the engine's expert pool runs.
    pub fn cpu_threads(&self) -> u32 {
        self.engine.cpu_threads.unwrap_or(self.cpu.cores)
    }

    /// The shared DRAM read bandwidth of CPU kernels and DMA, in GB/s.
    pub fn dram_gbs(&self) -> f64 {
        self.engine
            .dram_gbs
            .unwrap_or(self.cpu.stream_read_gbs * DEFAULT_DRAM_OVER_STREAM)
    }

    /// The model preset the bench bandwidths were measured at.
    pub fn tuning_model(&self) -> Result<ModelSpec> {
        ModelSpec::preset(&self.engine.tuning_model).map_err(|e| {
            ModelError::invalid("engine.tuning_model", format!("not a model preset: {e}"))
        })
    }

    /// Experts per layer of the bench step at the tuning geometry.
    pub fn tuning_experts(&self) -> Result<u32> {
        match self.engine.tuning_experts {
            Some(n) => Ok(n),
            None => Ok(self.tuning_model()?.geometry.top_k as u32),
        }
    }

    /// The GPUs decoding together and how experts are laid out over them (`[gpu] count`
    /// and `placement`). Valid after [`HostSpec::validate`] (`count >= 1`).
    pub fn gpu_layout(&self) -> GpuLayout {
        GpuLayout {
            gpus: self.gpu.count.max(1),
            placement: self.engine.multi_gpu.placement,
        }
    }

    /// The peer link the GPUs combine over: `[interconnect]` when given, else a combine
    /// staged through host memory over PCIe (no peer-to-peer): `min(h2d, d2h) x`
    /// [`HOST_STAGED_PEER_SHARE`], and two link latencies plus [`HOST_STAGED_COMBINE_US`].
    pub fn interconnect(&self) -> InterconnectSpec {
        match &self.engine.multi_gpu.interconnect {
            Some(i) => i.clone(),
            None => InterconnectSpec {
                name: "PCIe through host memory".to_string(),
                peer_gbs: self.pcie.h2d_gbs.min(self.pcie.d2h_gbs) * HOST_STAGED_PEER_SHARE,
                latency_us: 2.0 * self.pcie.latency_us + HOST_STAGED_COMBINE_US,
            },
        }
    }

    /// GPU memory one GPU offers, in bytes.
    pub fn gpu_memory_bytes(&self) -> f64 {
        self.gpu.memory_gib * GIB
    }

    /// Check every value; errors name the key (`pcie.h2d_gbs`, ...).
    pub fn validate(&self) -> Result<()> {
        nonempty("gpu.name", &self.gpu.name)?;
        nonempty("cpu.name", &self.cpu.name)?;
        at_least_one("gpu.count", self.gpu.count)?;
        at_least_one("cpu.cores", self.cpu.cores)?;
        at_least_one("cpu.threads", self.cpu.threads)?;
        at_least_one("cpu.numa_nodes", self.cpu.numa_nodes)?;
        if self.cpu.threads < self.cpu.cores {
            return Err(ModelError::invalid(
                "cpu.threads",
                format!(
                    "{} is fewer than the {} cores",
                    self.cpu.threads, self.cpu.cores
                ),
            ));
        }
        positive("gpu.memory_gib", self.gpu.memory_gib)?;
        positive("gpu.hbm_gbs", self.gpu.hbm_gbs)?;
        positive("pcie.h2d_gbs", self.pcie.h2d_gbs)?;
        positive("pcie.d2h_gbs", self.pcie.d2h_gbs)?;
        nonnegative("pcie.latency_us", self.pcie.latency_us)?;
        if let Some(g) = self.pcie.gather_gbs {
            positive("pcie.gather_gbs", g)?;
        }
        positive("cpu.stream_read_gbs", self.cpu.stream_read_gbs)?;
        if let Some(m) = self.cpu.moe_gbs {
            positive("cpu.moe_gbs", m)?;
        }
        let e = &self.engine;
        self.tuning_model()?;
        if let Some(n) = e.tuning_experts {
            at_least_one("engine.tuning_experts", n)?;
        }
        fraction("engine.gather_efficiency", e.gather_efficiency)?;
        fraction("engine.cpu_kernel_efficiency", e.cpu_kernel_efficiency)?;
        fraction("engine.gpu_hbm_efficiency", e.gpu_hbm_efficiency)?;
        if !(0.0..=1.0).contains(&e.cpu_thread_exponent) {
            return Err(ModelError::invalid(
                "engine.cpu_thread_exponent",
                format!("{} is outside [0, 1]", e.cpu_thread_exponent),
            ));
        }
        positive("engine.dma_dram_weight", e.dma_dram_weight)?;
        for (key, v) in [
            ("engine.gather_copy_us", e.gather_copy_us),
            ("engine.gather_layer_us", e.gather_layer_us),
            ("engine.cpu_layer_us", e.cpu_layer_us),
            ("engine.cpu_wake_us", e.cpu_wake_us),
            ("engine.cpu_expert_us", e.cpu_expert_us),
            ("engine.hybrid_round_trip_us", e.hybrid_round_trip_us),
            ("engine.gpu_launch_us", e.gpu_launch_us),
            ("engine.dense_layer_us", e.dense_layer_us),
            ("engine.gpu_reserve_gib", e.gpu_reserve_gib),
            ("engine.run_noise_rel", e.run_noise_rel),
        ] {
            nonnegative(key, v)?;
        }
        positive("engine.cpu_token_gmacs", e.cpu_token_gmacs)?;
        positive("engine.gpu_token_gmacs", e.gpu_token_gmacs)?;
        if let Some(t) = e.cpu_threads {
            at_least_one("engine.cpu_threads", t)?;
            if t > self.cpu.threads {
                return Err(ModelError::invalid(
                    "engine.cpu_threads",
                    format!(
                        "{t} is more than the host's {} hardware threads",
                        self.cpu.threads
                    ),
                ));
            }
        }
        if let Some(d) = e.dram_gbs {
            positive("engine.dram_gbs", d)?;
        }
        if let Some(i) = &e.multi_gpu.interconnect {
            positive("interconnect.peer_gbs", i.peer_gbs)?;
            nonnegative("interconnect.latency_us", i.latency_us)?;
        }
        if e.gpu_reserve_gib >= self.gpu.memory_gib {
            return Err(ModelError::invalid(
                "engine.gpu_reserve_gib",
                format!(
                    "{} GiB leaves nothing of the GPU's {} GiB",
                    e.gpu_reserve_gib, self.gpu.memory_gib
                ),
            ));
        }
        Ok(())
    }
}

/// Bytes of one GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn nonempty(key: &str, v: &str) -> Result<()> {
    if v.trim().is_empty() {
        return Err(ModelError::invalid(key, "must not be empty"));
    }
    Ok(())
}

fn at_least_one(key: &str, v: u32) -> Result<()> {
    if v == 0 {
        return Err(ModelError::invalid(key, "must be at least 1"));
    }
    Ok(())
}

fn positive(key: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(ModelError::invalid(
            key,
            format!("{v} is not a positive number"),
        ));
    }
    Ok(())
}

fn nonnegative(key: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(ModelError::invalid(
            key,
            format!("{v} is not a finite number >= 0"),
        ));
    }
    Ok(())
}

fn fraction(key: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0 && v <= 1.0) {
        return Err(ModelError::invalid(key, format!("{v} is outside (0, 1]")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_report_host_parses_and_round_trips() {
        let h = HostSpec::field_report();
        assert_eq!(h.gpu.name, "NVIDIA GeForce RTX 4090");
        assert_eq!(h.cpu.moe_gbs, Some(46.12));
        assert_eq!(h.pcie.gather_gbs, Some(24.25));
        assert_eq!(h.cpu_threads(), 24);
        let back = HostSpec::from_toml_str(&h.to_toml(), "round trip").unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn a_minimal_host_takes_the_runtime_engine_defaults() {
        let text = r#"
            [gpu]
            name = "NVIDIA H200"
            count = 1
            memory_gib = 141.0
            hbm_gbs = 4800.0
            [pcie]
            h2d_gbs = 55.0
            d2h_gbs = 55.0
            latency_us = 2.0
            [cpu]
            name = "test cpu"
            cores = 16
            threads = 16
            numa_nodes = 1
            stream_read_gbs = 105.0
        "#;
        let h = HostSpec::from_toml_str(text, "h200.toml").unwrap();
        assert_eq!(h.engine, EngineSpec::default());
        assert_eq!(h.cpu_threads(), 16);
        // The derivation of the shared DRAM bandwidth: the CPU's proportional share under a
        // 50 GB/s gather is the measured 90 GB/s.
        let d = h.dram_gbs();
        assert!((d * 105.0 / (105.0 + 50.0) - 90.0).abs() < 1e-9, "{d}");
        assert_eq!(h.tuning_experts().unwrap(), 8);
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let good = HostSpec::field_report().to_toml();
        let bad = good.replace("h2d_gbs = 24.26", "h2d_gbs = -1.0");
        let e = HostSpec::from_toml_str(&bad, "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.toml") && e.contains("pcie.h2d_gbs"), "{e}");

        let unknown = good.replace("h2d_gbs = 24.26", "h2d_gbs = 24.26\nh2d_gb = 3.0");
        let e = HostSpec::from_toml_str(&unknown, "unknown.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown.toml") && e.contains("h2d_gb"), "{e}");

        let eff = good.replace("gather_efficiency = 1.0", "gather_efficiency = 1.5");
        let e = HostSpec::from_toml_str(&eff, "eff.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("engine.gather_efficiency"), "{e}");

        let tm = good.replace("tuning_model = \"bench-nvfp4\"", "tuning_model = \"nope\"");
        let e = HostSpec::from_toml_str(&tm, "tm.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("engine.tuning_model"), "{e}");

        let th = good.replace("cpu_threads = 24", "cpu_threads = 96");
        let e = HostSpec::from_toml_str(&th, "th.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("engine.cpu_threads"), "{e}");
    }

    #[test]
    fn several_gpus_read_count_placement_and_interconnect() {
        let one = HostSpec::field_report();
        assert_eq!(one.gpu_layout(), GpuLayout::single());
        // A single-GPU spec writes no new keys.
        let text = one.to_toml();
        assert!(
            !text.contains("placement") && !text.contains("interconnect"),
            "{text}"
        );

        let two = text.replace("count = 1", "count = 2\nplacement = \"tensor-parallel\"");
        let h = HostSpec::from_toml_str(&two, "two.toml").unwrap();
        assert_eq!(
            h.gpu_layout(),
            GpuLayout::new(2, GpuPlacement::TensorParallel).unwrap()
        );
        // No [interconnect]: staged through host over PCIe.
        let i = h.interconnect();
        assert_eq!(i.peer_gbs, 24.26f64.min(26.0) * HOST_STAGED_PEER_SHARE);
        assert_eq!(i.latency_us, 2.0 * 5.0 + HOST_STAGED_COMBINE_US);
        assert_eq!(HostSpec::from_toml_str(&h.to_toml(), "rt").unwrap(), h);

        let nvlink = format!(
            "{two}\n[interconnect]\nname = \"NVLink bridge\"\npeer_gbs = {RTX3090_NVLINK_GBS}\nlatency_us = 8.0\n"
        );
        let h = HostSpec::from_toml_str(&nvlink, "nvlink.toml").unwrap();
        assert_eq!(h.interconnect().peer_gbs, RTX3090_NVLINK_GBS);
        assert_eq!(HostSpec::from_toml_str(&h.to_toml(), "rt").unwrap(), h);

        for (bad, key) in [
            (text.replace("count = 1", "count = 0"), "gpu.count"),
            (
                text.replace("count = 1", "count = 2\nplacement = \"striped\""),
                "striped",
            ),
            (
                format!("{two}\n[interconnect]\npeer_gbs = 0.0\nlatency_us = 1.0\n"),
                "interconnect.peer_gbs",
            ),
            (
                format!("{two}\n[interconnect]\npeer_gbs = 5.0\nlatency_us = 1.0\nspeed = 3\n"),
                "speed",
            ),
        ] {
            let e = HostSpec::from_toml_str(&bad, "bad.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("bad.toml") && e.contains(key), "{key}: {e}");
        }
    }

    /// A host of only what a user knows: GPU name, PCIe generation and width, cores and
    /// memory channels.
    const KNOWN_ONLY: &str = r#"
        [gpu]
        name = "NVIDIA GeForce RTX 4090"
        [pcie]
        generation = 4
        lanes = 16
        [cpu]
        name = "2 x Xeon Silver 4310"
        cores = 24
        threads = 48
        numa_nodes = 2
        memory_channels = 16
        memory_mts = 2666
    "#;

    #[test]
    fn left_out_values_are_derived_and_marked() {
        let h = HostSpec::from_toml_str(KNOWN_ONLY, "known.toml").unwrap();
        // Slow reference, written out: 16 GT/s x 128/130 / 8 bits x 16 lanes x efficiency.
        let link = 16.0 * 128.0 / 130.0 / 8.0 * 16.0;
        assert!((h.pcie.h2d_gbs - link * PCIE_DMA_EFFICIENCY).abs() < 1e-9);
        assert_eq!(h.pcie.d2h_gbs, h.pcie.h2d_gbs);
        assert_eq!(h.pcie.latency_us, DEFAULT_PCIE_LATENCY_US);
        assert_eq!((h.gpu.memory_gib, h.gpu.hbm_gbs), (24.0, 1008.0));
        let peak = 16.0 * 2666.0 * 8.0 / 1000.0;
        assert!((h.cpu.stream_read_gbs - peak * STREAM_READ_SHARE_OF_PEAK).abs() < 1e-9);
        let keys: Vec<&str> = h.derived().iter().map(|d| d.key).collect();
        assert_eq!(
            keys,
            [
                "gpu.memory_gib",
                "gpu.hbm_gbs",
                "pcie.h2d_gbs",
                "pcie.d2h_gbs",
                "pcie.latency_us",
                "cpu.stream_read_gbs"
            ]
        );
        assert!(
            h.derived()[2].how.contains("PCIe 4.0 x16"),
            "{:?}",
            h.derived()
        );
        assert!(h.warnings().is_empty(), "{:?}", h.warnings());
        // Written back, the derived values stay out and are derived again.
        let text = h.to_toml();
        assert!(
            !text.contains("h2d_gbs") && text.contains("generation = 4"),
            "{text}"
        );
        assert_eq!(HostSpec::from_toml_str(&text, "rt").unwrap(), h);
        // A value changed after reading is written.
        let mut changed = h.clone();
        changed.pcie.h2d_gbs = 20.0;
        let back = HostSpec::from_toml_str(&changed.to_toml(), "rt").unwrap();
        assert_eq!(back.pcie.h2d_gbs, 20.0);
        // Predictions run on it.
        crate::perf::PerfModel::from_host(&h).unwrap();
    }

    #[test]
    fn what_cannot_be_derived_is_named() {
        for (cut, key) in [
            ("generation = 4\n", "pcie.h2d_gbs"),
            ("memory_mts = 2666\n", "cpu.stream_read_gbs"),
        ] {
            let text = KNOWN_ONLY.replace(&format!("        {cut}"), "");
            let e = HostSpec::from_toml_str(&text, "cut.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("cut.toml") && e.contains(key), "{e}");
        }
        let text = KNOWN_ONLY.replace("RTX 4090", "Radeon 9000");
        let e = HostSpec::from_toml_str(&text, "amd.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpu.memory_gib") && e.contains("Radeon 9000"),
            "{e}"
        );
        let text = KNOWN_ONLY.replace("generation = 4", "generation = 9");
        let e = HostSpec::from_toml_str(&text, "g9.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pcie.generation"), "{e}");
    }

    #[test]
    fn rates_beyond_the_hardware_are_warned() {
        let fast = KNOWN_ONLY
            .replace("lanes = 16", "lanes = 16\nh2d_gbs = 40.0")
            .replace(
                "memory_mts = 2666",
                "memory_mts = 2666\nstream_read_gbs = 400.0\nmoe_gbs = 500.0",
            )
            .replace("RTX 4090\"", "RTX 4090\"\nhbm_gbs = 2000.0");
        let h = HostSpec::from_toml_str(&fast, "fast.toml").unwrap();
        let w = h.warnings().join("\n");
        for key in [
            "pcie.h2d_gbs",
            "cpu.stream_read_gbs",
            "cpu.moe_gbs = 500 GB/s is more than cpu.stream_read_gbs",
            "gpu.hbm_gbs",
        ] {
            assert!(w.contains(key), "{key} not in {w}");
        }
        assert!(w.contains("31.5 GB/s") && w.contains("341.2 GB/s"), "{w}");
        // The shipped hosts are plausible (Grace's coherent link is not checked).
        assert!(HostSpec::field_report().warnings().is_empty());
    }

    #[test]
    fn a_file_names_itself_and_a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("myhost.toml");
        let mut h = HostSpec::field_report();
        h.name.clear();
        std::fs::write(&path, h.to_toml()).unwrap();
        let back = HostSpec::from_toml_file(&path).unwrap();
        assert_eq!(back.name, "myhost");
        let e = HostSpec::from_toml_file(&dir.path().join("none.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.toml"), "{e}");
    }
}
