//! The host's resources as the simulator sees them: they compute durations and
//! availability, and never touch the event queue.
//!
//! - [`link::Link`]: one direction of PCIe (or NVLink-C2C): per-transfer latency plus
//!   bandwidth, transfers served in order with a bounded number in flight, as the runtime's
//!   copy stream serves them.
//! - [`dram::Dram`]: host DRAM read by both the CPU kernels and the DMA engine; while both are
//!   active each gets its contended bandwidth.
//! - [`cpu::CpuPool`]: the CPU expert pool: wake-up after idle or spin-wait within a step.
//! - [`gpu::GpuStream`]: an in-order GPU stream with launch overhead.
//! - [`fluid::PhasedJob`]: work made of fixed-time and byte phases whose byte rate may
//!   change while it runs (the mechanism behind contention).
//!
//! The decode process ([`crate::decode`]) owns one of each, asks them when work finishes,
//! and schedules the corresponding events.

pub mod cpu;
pub mod dram;
pub mod fluid;
pub mod gpu;
pub mod link;

pub use cpu::{CpuPool, CpuPoolParams};
pub use dram::{Dram, DramParams, DramUser};
pub use fluid::{Phase, PhasedJob};
pub use gpu::GpuStream;
pub use link::{Link, LinkParams, TransferJob};
