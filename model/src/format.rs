//! Expert weight formats and their exact byte sizes.
//!
//! Every byte count in `ft` (host banks, cache slots, PCIe transfers, CPU read bandwidth)
//! derives from [`ExpertFormat::matrix_bytes`], so the three views agree on what an expert
//! weighs. Encoding and decoding live in `ft-kernels`; this module only knows the layout's
//! size and the blocking constraints a matrix's inner dimension must satisfy.
//!
//! Besides the five formats `ft` has kernels for, the block-quantised types of ggml (the
//! tensor types of GGUF files: `q8_0`, the k-quants `q2_k` to `q6_k`, the i-quants
//! `iq1_s` to `iq4_xs`, ...) are formats too ([`GgmlQuant`], as [`ExpertFormat::Ggml`]):
//! the analytic model and the simulator predict for them from their exact byte sizes, and
//! the runtime refuses them ([`ExpertFormat::has_kernel`]). Their CPU rate is never guessed
//! from this project's kernels: it comes from the host's CPU-MoE bench or is reported unknown
//! (see `docs/model-file.md`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

use crate::error::{ModelError, Result};

/// How one expert's three matrices are stored.
///
/// Every format blocks along the input (column) dimension of a matrix: a row of `cols`
/// weights is `cols / block_len()` blocks, each with its own scale where the format has one.
///
/// Serialized as its [`ExpertFormat::name`] (`"nvfp4"`, `"q4_k"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpertFormat {
    /// bfloat16 weights, 2 bytes each, no scales.
    Bf16,
    /// int8 weights with one f32 scale per row.
    Int8,
    /// llama.cpp `Q4_0`: blocks of 32 weights, an f16 scale and 16 bytes of nibbles (18 bytes).
    Q4_0,
    /// NVFP4: e2m1 values, an e4m3 scale per 16 weights, and an f16 scale per row.
    Nvfp4,
    /// OCP MXFP4: e2m1 values and an e8m0 (power of two) scale per 32 weights.
    Mxfp4,
    /// A ggml block type without a kernel in `ft`: sized, predicted and simulated, not run.
    Ggml(GgmlQuant),
}

/// The ggml block-quantised tensor types (GGUF's tensor types) that `ft` sizes but has no
/// kernel for. `Q4_0`, `BF16` and `MXFP4` are not here: they are [`ExpertFormat::Q4_0`],
/// [`ExpertFormat::Bf16`] and [`ExpertFormat::Mxfp4`], whose layouts have the same bytes per
/// block as ggml's.
///
/// Sizes are ggml's `ggml_type_traits` (`ggml/src/ggml.c`): a block of
/// [`GgmlQuant::block_len`] weights occupies [`GgmlQuant::block_bytes`] bytes.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlQuant {
    /// `F16`: IEEE half weights, 2 bytes each.
    F16,
    /// `Q8_0`: 32 int8 weights and an f16 scale (34 bytes).
    Q8_0,
    /// `Q4_1`: 32 nibbles, an f16 scale and an f16 minimum (20 bytes).
    Q4_1,
    /// `Q5_0`: 32 5-bit weights (16 bytes of nibbles, 4 of high bits) and an f16 scale (22).
    Q5_0,
    /// `Q5_1`: `Q5_0` with an f16 minimum (24 bytes).
    Q5_1,
    /// `Q2_K`: super-blocks of 256: 16 4-bit scale/min pairs, 64 bytes of 2-bit weights, an
    /// f16 scale and minimum (84 bytes).
    Q2_K,
    /// `Q3_K`: 256 weights: 32 bytes of high bits, 64 of 2-bit lows, 12 of scales, f16 (110).
    Q3_K,
    /// `Q4_K`: 256 weights: f16 scale and minimum, 12 bytes of 6-bit scales, 128 of nibbles
    /// (144 bytes).
    Q4_K,
    /// `Q5_K`: `Q4_K` plus 32 bytes of fifth bits (176 bytes).
    Q5_K,
    /// `Q6_K`: 256 weights: 128 bytes of low nibbles, 64 of high 2 bits, 16 int8 scales and
    /// an f16 scale (210 bytes).
    Q6_K,
    /// `IQ1_S`: 256 weights in 50 bytes (1.5625 bits per weight).
    IQ1_S,
    /// `IQ1_M`: 256 weights in 56 bytes (1.75 bits per weight).
    IQ1_M,
    /// `IQ2_XXS`: 256 weights in 66 bytes (2.0625 bits per weight).
    IQ2_XXS,
    /// `IQ2_XS`: 256 weights in 74 bytes (2.3125 bits per weight).
    IQ2_XS,
    /// `IQ2_S`: 256 weights in 82 bytes (2.5625 bits per weight).
    IQ2_S,
    /// `IQ3_XXS`: 256 weights in 98 bytes (3.0625 bits per weight).
    IQ3_XXS,
    /// `IQ3_S`: 256 weights in 110 bytes (3.4375 bits per weight).
    IQ3_S,
    /// `IQ4_NL`: 32 4-bit codebook indices and an f16 scale (18 bytes).
    IQ4_NL,
    /// `IQ4_XS`: 256 weights: f16 scale, 2 + 4 bytes of 6-bit sub-scales, 128 of indices
    /// (136 bytes).
    IQ4_XS,
    /// `TQ1_0`: ternary, 256 weights in 54 bytes.
    TQ1_0,
    /// `TQ2_0`: ternary, 256 weights in 66 bytes.
    TQ2_0,
}

impl GgmlQuant {
    /// Every type, in ggml's tag order.
    pub const ALL: [GgmlQuant; 21] = [
        GgmlQuant::F16,
        GgmlQuant::Q4_1,
        GgmlQuant::Q5_0,
        GgmlQuant::Q5_1,
        GgmlQuant::Q8_0,
        GgmlQuant::Q2_K,
        GgmlQuant::Q3_K,
        GgmlQuant::Q4_K,
        GgmlQuant::Q5_K,
        GgmlQuant::Q6_K,
        GgmlQuant::IQ2_XXS,
        GgmlQuant::IQ2_XS,
        GgmlQuant::IQ3_XXS,
        GgmlQuant::IQ1_S,
        GgmlQuant::IQ4_NL,
        GgmlQuant::IQ3_S,
        GgmlQuant::IQ2_S,
        GgmlQuant::IQ4_XS,
        GgmlQuant::IQ1_M,
        GgmlQuant::TQ1_0,
        GgmlQuant::TQ2_0,
    ];

    /// The lower-case name used on the command line, in TOML and in JSON (`q4_k`).
    pub fn name(self) -> &'static str {
        match self {
            GgmlQuant::F16 => "f16",
            GgmlQuant::Q8_0 => "q8_0",
            GgmlQuant::Q4_1 => "q4_1",
            GgmlQuant::Q5_0 => "q5_0",
            GgmlQuant::Q5_1 => "q5_1",
            GgmlQuant::Q2_K => "q2_k",
            GgmlQuant::Q3_K => "q3_k",
            GgmlQuant::Q4_K => "q4_k",
            GgmlQuant::Q5_K => "q5_k",
            GgmlQuant::Q6_K => "q6_k",
            GgmlQuant::IQ1_S => "iq1_s",
            GgmlQuant::IQ1_M => "iq1_m",
            GgmlQuant::IQ2_XXS => "iq2_xxs",
            GgmlQuant::IQ2_XS => "iq2_xs",
            GgmlQuant::IQ2_S => "iq2_s",
            GgmlQuant::IQ3_XXS => "iq3_xxs",
            GgmlQuant::IQ3_S => "iq3_s",
            GgmlQuant::IQ4_NL => "iq4_nl",
            GgmlQuant::IQ4_XS => "iq4_xs",
            GgmlQuant::TQ1_0 => "tq1_0",
            GgmlQuant::TQ2_0 => "tq2_0",
        }
    }

    /// ggml's tag of the type (`enum ggml_type` in `ggml.h`), as GGUF tensor infos carry it.
    pub fn ggml_tag(self) -> u32 {
        match self {
            GgmlQuant::F16 => 1,
            GgmlQuant::Q4_1 => 3,
            GgmlQuant::Q5_0 => 6,
            GgmlQuant::Q5_1 => 7,
            GgmlQuant::Q8_0 => 8,
            GgmlQuant::Q2_K => 10,
            GgmlQuant::Q3_K => 11,
            GgmlQuant::Q4_K => 12,
            GgmlQuant::Q5_K => 13,
            GgmlQuant::Q6_K => 14,
            GgmlQuant::IQ2_XXS => 16,
            GgmlQuant::IQ2_XS => 17,
            GgmlQuant::IQ3_XXS => 18,
            GgmlQuant::IQ1_S => 19,
            GgmlQuant::IQ4_NL => 20,
            GgmlQuant::IQ3_S => 21,
            GgmlQuant::IQ2_S => 22,
            GgmlQuant::IQ4_XS => 23,
            GgmlQuant::IQ1_M => 29,
            GgmlQuant::TQ1_0 => 34,
            GgmlQuant::TQ2_0 => 35,
        }
    }

    /// Weights per block (ggml's `blck_size`).
    pub fn block_len(self) -> usize {
        match self {
            GgmlQuant::F16 => 1,
            GgmlQuant::Q8_0
            | GgmlQuant::Q4_1
            | GgmlQuant::Q5_0
            | GgmlQuant::Q5_1
            | GgmlQuant::IQ4_NL => 32,
            _ => 256,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub fn block_bytes(self) -> u64 {
        match self {
            GgmlQuant::F16 => 2,
            GgmlQuant::Q8_0 => 34,
            GgmlQuant::Q4_1 => 20,
            GgmlQuant::Q5_0 => 22,
            GgmlQuant::Q5_1 => 24,
            GgmlQuant::Q2_K => 84,
            GgmlQuant::Q3_K => 110,
            GgmlQuant::Q4_K => 144,
            GgmlQuant::Q5_K => 176,
            GgmlQuant::Q6_K => 210,
            GgmlQuant::IQ1_S => 50,
            GgmlQuant::IQ1_M => 56,
            GgmlQuant::IQ2_XXS => 66,
            GgmlQuant::IQ2_XS => 74,
            GgmlQuant::IQ2_S => 82,
            GgmlQuant::IQ3_XXS => 98,
            GgmlQuant::IQ3_S => 110,
            GgmlQuant::IQ4_NL => 18,
            GgmlQuant::IQ4_XS => 136,
            GgmlQuant::TQ1_0 => 54,
            GgmlQuant::TQ2_0 => 66,
        }
    }
}

impl ExpertFormat {
    /// Every format `ft` has kernels for, in a fixed order (for tables, sweeps and kernel
    /// tests); [`ExpertFormat::every`] adds the ggml types.
    pub const ALL: [ExpertFormat; 5] = [
        ExpertFormat::Bf16,
        ExpertFormat::Int8,
        ExpertFormat::Q4_0,
        ExpertFormat::Nvfp4,
        ExpertFormat::Mxfp4,
    ];

    /// Every format, the kernel formats first, then the ggml types in tag order.
    pub fn every() -> impl Iterator<Item = ExpertFormat> {
        Self::ALL
            .into_iter()
            .chain(GgmlQuant::ALL.into_iter().map(ExpertFormat::Ggml))
    }

    /// True where `ft` has CPU and GPU kernels for the format (encode, decode, expert FFN);
    /// the runtime refuses the others, the model and the simulator size them.
    pub fn has_kernel(self) -> bool {
        !matches!(self, ExpertFormat::Ggml(_))
    }

    /// The name used on the command line, in TOML and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            ExpertFormat::Ggml(q) => q.name(),
            ExpertFormat::Bf16 => "bf16",
            ExpertFormat::Int8 => "int8",
            ExpertFormat::Q4_0 => "q4_0",
            ExpertFormat::Nvfp4 => "nvfp4",
            ExpertFormat::Mxfp4 => "mxfp4",
        }
    }

    /// Weights per scale block along a row (the quantization group size).
    ///
    /// `bf16` has no blocks (1); `int8` has one scale per row, reported as 0 here because the
    /// block is the whole row (see [`ExpertFormat::row_blocked`]).
    pub fn block_len(self) -> usize {
        match self {
            ExpertFormat::Ggml(q) => q.block_len(),
            ExpertFormat::Bf16 => 1,
            ExpertFormat::Int8 => 0,
            ExpertFormat::Q4_0 => 32,
            ExpertFormat::Nvfp4 => 16,
            ExpertFormat::Mxfp4 => 32,
        }
    }

    /// True where the scale covers a whole row rather than fixed-size blocks.
    pub fn row_blocked(self) -> bool {
        matches!(self, ExpertFormat::Int8)
    }

    /// True for the 4-bit formats (two weights per byte).
    pub fn is_4bit(self) -> bool {
        matches!(
            self,
            ExpertFormat::Q4_0 | ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4
        )
    }

    /// True where a W4A8/W8A8 path (int8 activations, integer dot products) exists.
    pub fn has_int8_activation_path(self) -> bool {
        !matches!(self, ExpertFormat::Bf16 | ExpertFormat::Ggml(_))
    }

    /// Check that a row of `cols` weights can be blocked by this format.
    pub fn check_cols(self, field: &str, cols: usize) -> Result<()> {
        if cols == 0 {
            return Err(ModelError::invalid(field, "must be greater than zero"));
        }
        let block = self.block_len();
        if block > 1 && !cols.is_multiple_of(block) {
            return Err(ModelError::invalid(
                field,
                format!(
                    "{cols} is not a multiple of {block}, the block length of {}",
                    self.name()
                ),
            ));
        }
        if self.is_4bit() && !cols.is_multiple_of(2) {
            return Err(ModelError::invalid(
                field,
                format!("{cols} is odd; {} packs two weights per byte", self.name()),
            ));
        }
        Ok(())
    }

    /// Exact bytes of one `rows x cols` matrix in this format (values plus scales).
    ///
    /// Panics in debug builds if `cols` fails [`ExpertFormat::check_cols`]; validate geometry
    /// first (as [`crate::MoeGeometry::validate`] does, which also refuses a geometry whose
    /// bytes overflow). Saturates at `u64::MAX` rather than wrapping to a small number.
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> u64 {
        debug_assert!(self.check_cols("cols", cols).is_ok());
        self.checked_matrix_bytes(rows, cols).unwrap_or(u64::MAX)
    }

    /// [`ExpertFormat::matrix_bytes`] with every multiply and add checked: `None` where the
    /// element count `rows x cols` or the byte count does not fit in a `u64`.
    pub fn checked_matrix_bytes(self, rows: usize, cols: usize) -> Option<u64> {
        let (r, c) = (rows as u64, cols as u64);
        let rc = r.checked_mul(c)?;
        match self {
            ExpertFormat::Bf16 => rc.checked_mul(2),
            ExpertFormat::Int8 => rc.checked_add(r.checked_mul(4)?),
            ExpertFormat::Q4_0 => r.checked_mul(c / 32)?.checked_mul(18),
            ExpertFormat::Nvfp4 => (rc / 2)
                .checked_add(rc / 16)?
                .checked_add(r.checked_mul(2)?),
            ExpertFormat::Mxfp4 => (rc / 2).checked_add(rc / 32),
            ExpertFormat::Ggml(q) => r
                .checked_mul(c / q.block_len() as u64)?
                .checked_mul(q.block_bytes()),
        }
    }
}

impl fmt::Display for ExpertFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ExpertFormat {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        ExpertFormat::every()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ModelError::UnknownName {
                kind: "expert format",
                name: s.to_string(),
                known: ExpertFormat::every()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

impl Serialize for ExpertFormat {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for ExpertFormat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for f in ExpertFormat::every() {
            assert_eq!(f.name().parse::<ExpertFormat>().unwrap(), f);
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{}\"", f.name()));
        }
        assert!("fp8".parse::<ExpertFormat>().is_err());
    }

    #[test]
    fn blocking_errors_name_the_field() {
        let e = ExpertFormat::Q4_0
            .check_cols("geometry.hidden", 40)
            .unwrap_err();
        assert!(e.to_string().contains("geometry.hidden"), "{e}");
        assert!(ExpertFormat::Nvfp4.check_cols("x", 0).is_err());
        assert!(ExpertFormat::Int8.check_cols("x", 7).is_ok());
        assert!(ExpertFormat::Bf16.check_cols("x", 7).is_ok());
    }

    #[test]
    fn matrix_bytes_per_format() {
        // 4 rows of 64 weights.
        assert_eq!(ExpertFormat::Bf16.matrix_bytes(4, 64), 512);
        assert_eq!(ExpertFormat::Int8.matrix_bytes(4, 64), 256 + 16);
        assert_eq!(ExpertFormat::Q4_0.matrix_bytes(4, 64), 4 * 2 * 18);
        assert_eq!(ExpertFormat::Nvfp4.matrix_bytes(4, 64), 128 + 16 + 8);
        assert_eq!(ExpertFormat::Mxfp4.matrix_bytes(4, 64), 128 + 8);
        // 4 rows of 512 weights: two 256-weight super-blocks per row.
        let q4k = ExpertFormat::Ggml(GgmlQuant::Q4_K);
        assert_eq!(q4k.matrix_bytes(4, 512), 4 * 2 * 144);
        assert!(q4k.check_cols("x", 384).is_err());
        assert!(!q4k.has_kernel() && ExpertFormat::ALL.iter().all(|f| f.has_kernel()));
    }

    /// Slow reference: bits per weight as ggml's documentation quotes them (k-quants from
    /// the k-quant pull request, i-quants from their pull requests), times the weights,
    /// against the block arithmetic.
    #[test]
    fn ggml_sizes_match_the_published_bits_per_weight() {
        let bpw = [
            ("f16", 16.0),
            ("q8_0", 8.5),
            ("q4_1", 5.0),
            ("q5_0", 5.5),
            ("q5_1", 6.0),
            ("q2_k", 2.625),
            ("q3_k", 3.4375),
            ("q4_k", 4.5),
            ("q5_k", 5.5),
            ("q6_k", 6.5625),
            ("iq1_s", 1.5625),
            ("iq1_m", 1.75),
            ("iq2_xxs", 2.0625),
            ("iq2_xs", 2.3125),
            ("iq2_s", 2.5625),
            ("iq3_xxs", 3.0625),
            ("iq3_s", 3.4375),
            ("iq4_nl", 4.5),
            ("iq4_xs", 4.25),
            ("tq1_0", 1.6875),
            ("tq2_0", 2.0625),
        ];
        assert_eq!(bpw.len(), GgmlQuant::ALL.len());
        for (name, bits) in bpw {
            let f: ExpertFormat = name.parse().unwrap();
            let (rows, cols) = (3usize, 1024usize);
            let bytes = f.matrix_bytes(rows, cols) as f64;
            assert_eq!(bytes * 8.0, bits * (rows * cols) as f64, "{name}");
        }
        let tags: std::collections::BTreeSet<u32> =
            GgmlQuant::ALL.iter().map(|q| q.ggml_tag()).collect();
        assert_eq!(tags.len(), GgmlQuant::ALL.len());
    }

    #[test]
    fn checked_bytes_agree_with_a_u128_reference_and_never_wrap() {
        // The slow reference: the same layouts in u128, which cannot overflow here.
        let reference = |f: ExpertFormat, r: u128, c: u128| -> u128 {
            match f {
                ExpertFormat::Bf16 => 2 * r * c,
                ExpertFormat::Int8 => r * c + 4 * r,
                ExpertFormat::Q4_0 => r * (c / 32) * 18,
                ExpertFormat::Nvfp4 => r * c / 2 + r * c / 16 + 2 * r,
                ExpertFormat::Mxfp4 => r * c / 2 + r * c / 32,
                ExpertFormat::Ggml(q) => r * (c / q.block_len() as u128) * q.block_bytes() as u128,
            }
        };
        // Widths that are whole blocks of every format (ggml's k-quants take 256 weights).
        let big = (usize::MAX / 4) & !255;
        for f in ExpertFormat::every() {
            for (r, c) in [
                (4, 256),
                (640, 2560),
                (1 << 17, 1 << 17),
                (big, 256),
                (big, big),
            ] {
                let want = reference(f, r as u128, c as u128);
                let got = f.checked_matrix_bytes(r, c);
                assert_eq!(
                    got.map(u128::from),
                    (want <= u64::MAX as u128).then_some(want)
                );
                assert_eq!(f.matrix_bytes(r, c) as u128, want.min(u64::MAX as u128));
            }
        }
    }
}
