//! `ft-kernels`: expert weight formats and the CPU expert kernels hybrid decode runs.
//!
//! - [`codec`]: the byte layout of a matrix per format, encode and decode.
//! - [`expert`]: an expert's three matrices ([`ExpertLayout`]) and a fast seeded filler.
//! - [`reference`](mod@reference): the f64 scalar reference of a layer's CPU share.
//! - [`w4a8`]: the exact specification of the int8-activation path (bit-identical on CPU
//!   and GPU) and its scalar implementation.
//! - [`step`]: the layer call ([`CpuExperts`]) on a persistent rayon pool, SIMD chosen at run time.
//! - [`stream`]: a STREAM-style read bandwidth measurement with the same threads.
//! - [`bench`]: the CPU step's weight GB/s against that read, over a grid (`ft bench cpu`).
//! - `team`: a phase whose tiles the calling thread shares with the pool ([`WaitMode::Help`]).

pub mod bench;
pub mod codec;
pub mod cuda_sources;
pub mod error;
pub mod expert;
pub mod reference;
mod rows;
pub mod simd;
pub mod step;
pub mod stream;
mod team;
pub mod w4a8;
mod x86;

pub use error::{KernelError, Result};
pub use expert::{fill_expert_from_seed, ExpertLayout, Matrix};
pub use simd::SimdLevel;
pub use step::{build_pool, ActivationPath, CpuExperts, ExpertWork, LayerTiming, WaitMode};
