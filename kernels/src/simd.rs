//! Which SIMD instruction sets the CPU kernels can use, chosen at run time.
//!
//! The build never uses `target-cpu=native`: one binary runs on every x86-64 host, and each
//! kernel picks its widest path from [`SimdLevel::detect`].

use std::fmt;
use std::str::FromStr;

/// SIMD level of a CPU kernel path, widest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimdLevel {
    /// Portable scalar code.
    Scalar,
    /// AVX2 + FMA (256-bit).
    Avx2,
    /// AVX-512 F/BW/VL (512-bit), no VNNI.
    Avx512,
    /// AVX-512 with VNNI (`vpdpbusd` integer dot products).
    Avx512Vnni,
}

impl SimdLevel {
    /// The level the compiler may assume everywhere in this binary (from `target_feature`).
    pub fn compiled() -> SimdLevel {
        if cfg!(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        )) {
            SimdLevel::Avx512Vnni
        } else if cfg!(all(target_feature = "avx512f", target_feature = "avx512bw")) {
            SimdLevel::Avx512
        } else if cfg!(all(target_feature = "avx2", target_feature = "fma")) {
            SimdLevel::Avx2
        } else {
            SimdLevel::Scalar
        }
    }

    /// The widest level this CPU supports, detected at run time.
    pub fn detect() -> SimdLevel {
        Self::ALL
            .into_iter()
            .rev()
            .find(|l| l.available())
            .unwrap_or(SimdLevel::Scalar)
    }

    /// Every level, narrowest first.
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Avx512Vnni,
    ];

    /// Whether this CPU can run the kernels of this level (the instruction sets they use:
    /// AVX2 + FMA + F16C; AVX-512 F/BW/VL (+ F16C); plus VNNI).
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl");
            match self {
                SimdLevel::Scalar => true,
                SimdLevel::Avx2 => avx2,
                SimdLevel::Avx512 => avx512,
                SimdLevel::Avx512Vnni => avx512 && std::is_x86_feature_detected!("avx512vnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == SimdLevel::Scalar
        }
    }

    /// Every level this CPU can run, narrowest first (what tests iterate over).
    pub fn available_levels() -> Vec<SimdLevel> {
        Self::ALL.into_iter().filter(|l| l.available()).collect()
    }

    /// Name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Vnni => "avx512-vnni",
        }
    }
}

impl FromStr for SimdLevel {
    type Err = String;

    /// Parse a level by its [`SimdLevel::name`].
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown SIMD level '{s}'; known: {}",
                    Self::ALL.map(|l| l.name()).join(", ")
                )
            })
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detected_is_at_least_compiled() {
        assert!(SimdLevel::detect() >= SimdLevel::compiled());
        assert!(SimdLevel::detect().available());
        assert_eq!(SimdLevel::available_levels()[0], SimdLevel::Scalar);
        for l in SimdLevel::ALL {
            assert_eq!(l.name().parse::<SimdLevel>().unwrap(), l);
        }
        assert!("sse9".parse::<SimdLevel>().is_err());
    }
}
