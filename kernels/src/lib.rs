//! `ft-kernels`: expert weight formats and the CPU expert kernels hybrid decode runs.

pub mod simd;
