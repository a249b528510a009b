//! Expert weight formats and their exact byte sizes.
//!
//! Every byte count in `ft` (host banks, cache slots, PCIe transfers, CPU read bandwidth)
//! derives from [`ExpertFormat::matrix_bytes`], so the three views agree on what an expert
//! weighs. Encoding and decoding live in `ft-kernels`; this module only knows the layout's
//! size and the blocking constraints a matrix's inner dimension must satisfy.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::{ModelError, Result};

/// How one expert's three matrices are stored.
///
/// Every format blocks along the input (column) dimension of a matrix: a row of `cols`
/// weights is `cols / block_len()` blocks, each with its own scale where the format has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertFormat {
    /// bfloat16 weights, 2 bytes each, no scales.
    Bf16,
    /// int8 weights with one f32 scale per row.
    Int8,
    /// llama.cpp `Q4_0`: blocks of 32 weights, an f16 scale and 16 bytes of nibbles (18 bytes).
    #[serde(rename = "q4_0")]
    Q4_0,
    /// NVFP4: e2m1 values, an e4m3 scale per 16 weights, and an f16 scale per row.
    Nvfp4,
    /// OCP MXFP4: e2m1 values and an e8m0 (power of two) scale per 32 weights.
    Mxfp4,
}

impl ExpertFormat {
    /// Every format, in a fixed order (for tables and sweeps).
    pub const ALL: [ExpertFormat; 5] = [
        ExpertFormat::Bf16,
        ExpertFormat::Int8,
        ExpertFormat::Q4_0,
        ExpertFormat::Nvfp4,
        ExpertFormat::Mxfp4,
    ];

    /// The name used on the command line, in TOML and in JSON.
    pub fn name(self) -> &'static str {
        match self {
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
        !matches!(self, ExpertFormat::Bf16)
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
        ExpertFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ModelError::UnknownName {
                kind: "expert format",
                name: s.to_string(),
                known: ExpertFormat::ALL.map(|f| f.name()).join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for f in ExpertFormat::ALL {
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
            }
        };
        let big = (usize::MAX / 4) & !63;
        for f in ExpertFormat::ALL {
            for (r, c) in [
                (4, 64),
                (640, 2560),
                (1 << 17, 1 << 17),
                (big, 64),
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
