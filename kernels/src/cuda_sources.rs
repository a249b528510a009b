//! The CUDA kernels of `ft`, as sources.
//!
//! Kernels live as `.cu` files under `kernels/cuda/`, embedded here with `include_str!` and
//! named by [`KernelId`]. `ft-runtime` compiles each at first use with NVRTC for the device's
//! compute capability and caches the module per device; this crate only holds the text, so
//! it builds without CUDA.

/// Definitions shared by every kernel (types, the `Region` table entry); prepended to each
/// source before compilation.
pub const COMMON: &str = include_str!("../cuda/common.cuh");

/// One compilation unit of CUDA source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelId {
    /// The layer's routed experts, all formats, f32 and int8 activation paths.
    Experts,
    /// The zero-copy gather reading mapped pinned host memory.
    Gather,
    /// The memory-bound dense-part kernel.
    Dense,
    /// Small element-wise kernels (the hybrid partial-output add).
    Elementwise,
}

impl KernelId {
    /// Every kernel source, in a fixed order.
    pub const ALL: [KernelId; 4] = [
        KernelId::Experts,
        KernelId::Gather,
        KernelId::Dense,
        KernelId::Elementwise,
    ];

    /// Name used in logs and compile errors (the `.cu` file's stem).
    pub fn name(self) -> &'static str {
        match self {
            KernelId::Experts => "experts",
            KernelId::Gather => "gather",
            KernelId::Dense => "dense",
            KernelId::Elementwise => "elementwise",
        }
    }

    /// The kernel's own source (without [`COMMON`]).
    pub fn source(self) -> &'static str {
        match self {
            KernelId::Experts => include_str!("../cuda/experts.cu"),
            KernelId::Gather => include_str!("../cuda/gather.cu"),
            KernelId::Dense => include_str!("../cuda/dense.cu"),
            KernelId::Elementwise => include_str!("../cuda/elementwise.cu"),
        }
    }

    /// The complete compilation unit: [`COMMON`] followed by the kernel's source.
    pub fn full_source(self) -> String {
        format!(
            "{COMMON}\n// ---- {}.cu ----\n{}",
            self.name(),
            self.source()
        )
    }

    /// The `extern "C"` entry points this unit defines.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            KernelId::Experts => &[
                "ft_experts_gate_up",
                "ft_experts_down",
                "ft_experts_down_direct",
                "ft_experts_gate_up_1",
                "ft_experts_down_1",
                "ft_experts_down_1_direct",
                "ft_experts_gate_up_2",
                "ft_experts_down_2",
                "ft_experts_down_2_direct",
                "ft_experts_gate_up_4",
                "ft_experts_down_4",
                "ft_experts_down_4_direct",
                "ft_experts_gate_up_1w",
                "ft_experts_down_1s",
                "ft_experts_down_1s_direct",
            ],
            KernelId::Gather => &["ft_gather_zero_copy"],
            KernelId::Dense => &["ft_dense_read"],
            KernelId::Elementwise => &["ft_add_f32", "ft_combine_fixed", "ft_hold_ns"],
        }
    }
}

/// Compile-time constants one module of a unit is built with; a unit is compiled once per
/// distinct specialization in use. The expert kernels are specialized per weight format and
/// activation path (`-DFT_FMT`, `-DFT_ACT`, see `cuda/experts.cu`) so that their format
/// switches fold away and each format's kernels hold only its registers; other units take
/// [`Specialization::NONE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Specialization {
    /// Weight format code (the kernels' `FT_BF16` .. `FT_MXFP4`).
    pub format: Option<i32>,
    /// Activation path code (`ACT_F32` 0, `ACT_INT8` 1).
    pub act: Option<i32>,
    /// The one-token variants' split-sign dot of e2m1 codes (`-DFT_E2M1_SPLIT=1`; nvfp4 and
    /// mxfp4 on the int8 path, where the runtime always builds it; see `cuda/experts.cu`).
    pub e2m1_split: bool,
    /// The nvfp4 block scales decoded by the hardware's e4m3 conversion
    /// (`-DFT_E4M3_CVT=1`; nvfp4, where the runtime always builds it; see
    /// `cuda/experts.cu`).
    pub e4m3_cvt: bool,
    /// Every block of the expert kernels records its timeline (`-DFT_STAMPS=1`; see
    /// `cuda/experts.cu`, "Block timelines"): development only, the same results.
    pub block_stamps: bool,
}

impl Specialization {
    /// No compile-time constants: every argument stays a run-time value.
    pub const NONE: Specialization = Specialization {
        format: None,
        act: None,
        e2m1_split: false,
        e4m3_cvt: false,
        block_stamps: false,
    };

    /// The expert kernels for one format and activation path.
    pub fn experts(format: i32, act: i32) -> Self {
        Specialization {
            format: Some(format),
            act: Some(act),
            e2m1_split: false,
            e4m3_cvt: false,
            block_stamps: false,
        }
    }

    /// The same with the split-sign e2m1 dot on or off.
    pub fn with_e2m1_split(self, on: bool) -> Self {
        Specialization {
            e2m1_split: on,
            ..self
        }
    }

    /// The same with the hardware e4m3 scale decode on or off.
    pub fn with_e4m3_cvt(self, on: bool) -> Self {
        Specialization {
            e4m3_cvt: on,
            ..self
        }
    }

    /// The same with the blocks' timelines recorded or not.
    pub fn with_block_stamps(self, on: bool) -> Self {
        Specialization {
            block_stamps: on,
            ..self
        }
    }

    /// The preprocessor definitions that build it (`-DFT_FMT=3`, ...).
    pub fn defines(&self) -> Vec<String> {
        let mut d = Vec::new();
        if let Some(f) = self.format {
            d.push(format!("-DFT_FMT={f}"));
        }
        if let Some(a) = self.act {
            d.push(format!("-DFT_ACT={a}"));
        }
        if self.e2m1_split {
            d.push("-DFT_E2M1_SPLIT=1".to_string());
        }
        if self.e4m3_cvt {
            d.push("-DFT_E4M3_CVT=1".to_string());
        }
        if self.block_stamps {
            d.push("-DFT_STAMPS=1".to_string());
        }
        d
    }
}

impl std::fmt::Display for KernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specializations_define_their_constants() {
        assert!(Specialization::NONE.defines().is_empty());
        assert_eq!(
            Specialization::experts(3, 1).defines(),
            ["-DFT_FMT=3", "-DFT_ACT=1"]
        );
        assert_eq!(
            Specialization::experts(3, 1)
                .with_e2m1_split(true)
                .defines(),
            ["-DFT_FMT=3", "-DFT_ACT=1", "-DFT_E2M1_SPLIT=1"]
        );
        assert_ne!(
            Specialization::experts(3, 1),
            Specialization::experts(3, 1).with_e2m1_split(true),
            "a module per choice"
        );
        let src = KernelId::Experts.source();
        assert!(src.contains("#ifdef FT_FMT") && src.contains("#ifdef FT_ACT"));
        assert!(src.contains("#ifndef FT_E2M1_SPLIT"));
        assert_eq!(
            Specialization::experts(3, 1).with_e4m3_cvt(true).defines(),
            ["-DFT_FMT=3", "-DFT_ACT=1", "-DFT_E4M3_CVT=1"]
        );
        assert!(src.contains("#ifndef FT_E4M3_CVT"));
        assert_eq!(
            Specialization::experts(3, 1)
                .with_block_stamps(true)
                .defines(),
            ["-DFT_FMT=3", "-DFT_ACT=1", "-DFT_STAMPS=1"]
        );
        assert!(src.contains("#ifndef FT_STAMPS"));
        // The removed paths' definitions are gone from the sources, not left as dead code.
        for gone in [
            "FT_PIPE_STAGES",
            "FT_PREFETCH_DOWN",
            "FT_BULK_STAGE",
            "ft_experts_layer_1",
            "ft_experts_down_1x",
        ] {
            assert!(!src.contains(gone), "experts.cu still holds {gone}");
        }
        assert!(!COMMON.contains("#ifndef FT_PARAM_TABLE_BYTES"));
    }

    /// Both ways: every listed entry point is defined, and every `extern "C"` kernel of a
    /// unit is listed (a kernel left off the list cannot be looked up at run time).
    #[test]
    fn every_entry_point_is_defined_in_its_source() {
        for k in KernelId::ALL {
            let src = k.full_source();
            for e in k.entry_points() {
                assert!(
                    src.contains(&format!(" {e}(")) && src.contains("__global__"),
                    "{k}: entry point {e} not found"
                );
            }
            let defined: Vec<&str> = src
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix("extern \"C\" __global__ "))
                .filter_map(|rest| {
                    // The word before the first '(' that does not open __launch_bounds__.
                    rest.split('(')
                        .filter_map(|piece| piece.split_whitespace().last())
                        .find(|w| *w != "__launch_bounds__")
                })
                .collect();
            assert!(!defined.is_empty(), "{k}: no kernels found");
            for d in defined {
                assert!(
                    k.entry_points().contains(&d),
                    "{k}: kernel {d} is not listed"
                );
            }
        }
    }
}
