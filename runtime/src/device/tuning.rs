//! The CUDA choices a device makes that are not fixed in the kernels: the development
//! switches and how a gather's copies are submitted.
//!
//! The expert kernels and the gather copies run one path: the alternatives that were measured
//! against it and lost (or gained nothing) were taken out, and their measurements are listed
//! in `experiments/gpu-backend/README.md`, "Removed switches". What is left:
//!
//! - two **development switches**, read from the environment once, when a CUDA device opens:
//!   block timelines in the expert kernels ([`CUDA_STAMPS_ENV`]) and a forced kernel
//!   instantiation ([`CUDA_VARIANT_ENV`]). Neither changes a result; both exist to measure
//!   the kernels (`gpu_backend`, `ft run --stamps-out`).
//! - the **copy submission** ([`CopySubmit`]), which the driver decides: batched where the
//!   driver has `cuMemcpyBatchAsync`, one copy each otherwise. A micro-bench may set it to
//!   compare the two ([`crate::Device::set_cuda_tuning`]).
//!
//! The result is a [`CudaTuning`] the device keeps, so a decode step reads no environment,
//! and every report records it in its `device`. A malformed value is an error naming the
//! variable, and so is an `FT_CUDA_` variable that is no switch: a misspelt or removed switch
//! would otherwise run the default while a script believes it measured something else.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::{Result, RuntimeError};

/// `1` builds the expert kernels with block timelines (`FT_STAMPS` in
/// `kernels/cuda/experts.cu`): every block notes when it starts, when its start condition is
/// met, when its tiles have landed, when its own work is done and when it ends, read back by
/// [`crate::Device::take_block_stamps`] (`gpu_backend --stamps`, `ft run --stamps-out`).
/// Development only: the same results, a few hundred nanoseconds more per block.
pub const CUDA_STAMPS_ENV: &str = "FT_CUDA_STAMPS";

/// Forces one instantiation of the expert kernels by its tokens per pass (1, 2, 4 or 8),
/// to time the instantiations against each other; unset: chosen by each launch's largest
/// task. Development only: every instantiation runs the same arithmetic per token.
pub const CUDA_VARIANT_ENV: &str = "FT_CUDA_EXPERT_VARIANT";

/// Every variable above, for scripts and error messages.
pub const CUDA_TUNING_ENVS: [&str; 2] = [CUDA_STAMPS_ENV, CUDA_VARIANT_ENV];

/// The prefix of every CUDA tuning variable ([`CUDA_TUNING_ENVS`]).
pub const CUDA_TUNING_PREFIX: &str = "FT_CUDA_";

/// The expert kernels' instantiations by tokens per pass (`gpu_experts`' variants).
pub const CUDA_VARIANT_TOKENS: [usize; 4] = [1, 2, 4, 8];

/// The expert kernels' one path, in the words the measurements of `experiments/gpu-backend`
/// name it: staged weight tiles, the down kernel as a programmatic dependent launch, the
/// split-sign e2m1 dot, the hardware e4m3 scale decode and the small-grid one-token
/// instantiation.
pub const CUDA_EXPERT_PATH: &str = "staged+pdl+split+cvt+wide";

/// How a gather's copies are submitted to the copy engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopySubmit {
    /// One `cuMemcpyHtoDAsync` per region, in order on the copy stream: what a driver
    /// older than CUDA 13 runs.
    Each,
    /// Every region in one `cuMemcpyBatchAsync` (CUDA 13 drivers): the copies may run in
    /// any order, on several copy engines at once, which hides the few microseconds each
    /// copy costs beyond its bytes.
    #[default]
    Batch,
}

impl CopySubmit {
    /// Name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            CopySubmit::Each => "each",
            CopySubmit::Batch => "batch",
        }
    }
}

/// The CUDA choices a device runs with (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaTuning {
    /// Block timelines in the expert kernels ([`CUDA_STAMPS_ENV`]; development only).
    pub block_stamps: bool,
    /// The forced instantiation, tokens per pass; `None`: by each launch's largest task
    /// ([`CUDA_VARIANT_ENV`]; development only).
    pub expert_variant: Option<usize>,
    /// How a gather's copies are submitted (set by the driver's version at open).
    pub copies: CopySubmit,
}

/// The error of an [`CUDA_VARIANT_ENV`] value that names no instantiation.
fn not_a_variant(value: &str) -> RuntimeError {
    RuntimeError::invalid(
        CUDA_VARIANT_ENV,
        format!("'{value}' is not an instantiation of the expert kernels; tokens per pass: {CUDA_VARIANT_TOKENS:?}"),
    )
}

/// An error naming the first of `names` that carries [`CUDA_TUNING_PREFIX`] but is not one of
/// [`CUDA_TUNING_ENVS`], with the switches there are.
pub fn refuse_unknown_switches(names: impl IntoIterator<Item = String>) -> Result<()> {
    match names
        .into_iter()
        .find(|n| n.starts_with(CUDA_TUNING_PREFIX) && !CUDA_TUNING_ENVS.contains(&n.as_str()))
    {
        None => Ok(()),
        Some(name) => Err(RuntimeError::invalid(
            name,
            format!(
                "is not a CUDA switch, so it would change nothing (the kernel paths measured \
                 against the default were removed: experiments/gpu-backend/README.md, \
                 \"Removed switches\"); the switches are {}",
                CUDA_TUNING_ENVS.join(", ")
            ),
        )),
    }
}

impl CudaTuning {
    /// The tuning the process environment asks for (module docs); a malformed value, or a
    /// variable named like a switch that is none, is a [`RuntimeError::Invalid`] naming the
    /// variable.
    pub fn from_env() -> Result<Self> {
        refuse_unknown_switches(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))?;
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The tuning `lookup` (variable name to value) asks for. An empty value counts as
    /// unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let block_stamps = match get(CUDA_STAMPS_ENV) {
            None => false,
            Some(v) => match v.trim() {
                "0" => false,
                "1" => true,
                other => {
                    return Err(RuntimeError::invalid(
                        CUDA_STAMPS_ENV,
                        format!("'{other}' is not a switch; use 0 or 1, or leave it unset"),
                    ))
                }
            },
        };
        let expert_variant = match get(CUDA_VARIANT_ENV) {
            None => None,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if CUDA_VARIANT_TOKENS.contains(&n) => Some(n),
                _ => return Err(not_a_variant(v.trim())),
            },
        };
        Ok(CudaTuning {
            block_stamps,
            expert_variant,
            copies: CopySubmit::default(),
        })
    }

    /// The environment that asks for this tuning's switches (both variables, defaults
    /// included), so a script can reproduce a run from its report.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                CUDA_STAMPS_ENV,
                if self.block_stamps { "1" } else { "0" }.to_string(),
            ),
            (
                CUDA_VARIANT_ENV,
                self.expert_variant
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
            ),
        ]
    }

    /// A [`RuntimeError::Invalid`] naming the field where one is out of range: a forced
    /// variant that is no instantiation.
    pub fn check(&self) -> Result<()> {
        match self.expert_variant {
            Some(n) if !CUDA_VARIANT_TOKENS.contains(&n) => Err(not_a_variant(&n.to_string())),
            _ => Ok(()),
        }
    }

    /// The expert kernels' path as the micro-bench's `path` column names it:
    /// [`CUDA_EXPERT_PATH`], then `+stamps` where the block timelines are compiled in.
    pub fn expert_path(&self) -> String {
        let mut s = String::from(CUDA_EXPERT_PATH);
        if self.block_stamps {
            s.push_str("+stamps");
        }
        s
    }
}

impl fmt::Display for CudaTuning {
    /// The expert path ([`CudaTuning::expert_path`]), the forced variant, and the copy
    /// submission: `staged+pdl+split+cvt+wide, copies batch`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expert_path())?;
        if let Some(n) = self.expert_variant {
            write!(f, ", variant {n}")?;
        }
        write!(f, ", copies {}", self.copies.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(pairs: &[(&str, &str)]) -> Result<CudaTuning> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaTuning::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn unset_and_empty_variables_give_the_defaults() {
        assert_eq!(from(&[]).unwrap(), CudaTuning::default());
        let empty: Vec<(&str, &str)> = CUDA_TUNING_ENVS.iter().map(|k| (*k, "")).collect();
        assert_eq!(from(&empty).unwrap(), CudaTuning::default());
        assert_eq!(
            CudaTuning::default().to_string(),
            "staged+pdl+split+cvt+wide, copies batch"
        );
    }

    #[test]
    fn a_misspelt_or_removed_switch_is_refused_by_name() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(refuse_unknown_switches(names(&["PATH", "FT_THREADS"])).is_ok());
        assert!(refuse_unknown_switches(names(&CUDA_TUNING_ENVS)).is_ok());
        for removed in [
            "FT_CUDA_PIPE",
            "FT_CUDA_FUSED",
            "FT_CUDA_COPY_SPLIT",
            "FT_CUDA_STAMP",
        ] {
            let err = refuse_unknown_switches(names(&["PATH", removed, CUDA_STAMPS_ENV]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(removed), "{err}");
            assert!(err.contains(CUDA_STAMPS_ENV), "{err}");
            assert!(err.contains("Removed switches"), "{err}");
        }
    }

    #[test]
    fn each_variable_sets_its_switch_and_env_reads_back() {
        let t = from(&[(CUDA_STAMPS_ENV, "1"), (CUDA_VARIANT_ENV, "4")]).unwrap();
        assert_eq!(
            t,
            CudaTuning {
                block_stamps: true,
                expert_variant: Some(4),
                copies: CopySubmit::Batch,
            }
        );
        assert_eq!(
            t.to_string(),
            "staged+pdl+split+cvt+wide+stamps, variant 4, copies batch"
        );
        for block_stamps in [false, true] {
            for expert_variant in [None, Some(1), Some(2), Some(4), Some(8)] {
                let t = CudaTuning {
                    block_stamps,
                    expert_variant,
                    copies: CopySubmit::Batch,
                };
                let env = t.env();
                assert_eq!(env.len(), CUDA_TUNING_ENVS.len());
                let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                assert_eq!(from(&pairs).unwrap(), t);
            }
        }
    }

    #[test]
    fn malformed_values_are_errors_naming_the_variable() {
        for (name, value) in [
            (CUDA_STAMPS_ENV, "on"),
            (CUDA_STAMPS_ENV, "2"),
            (CUDA_VARIANT_ENV, "3"),
            (CUDA_VARIANT_ENV, "many"),
        ] {
            let e = from(&[(name, value)]).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(value), "{name}={value}: {e}");
        }
        let bad = CudaTuning {
            expert_variant: Some(3),
            ..CudaTuning::default()
        };
        assert!(bad.check().is_err());
        assert!(CudaTuning::default().check().is_ok());
    }

    #[test]
    fn json_round_trips_and_refuses_unknown_fields() {
        let t = CudaTuning {
            block_stamps: true,
            copies: CopySubmit::Each,
            ..CudaTuning::default()
        };
        let s = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<CudaTuning>(&s).unwrap(), t);
        assert_eq!(
            serde_json::from_str::<CudaTuning>("{}").unwrap(),
            CudaTuning::default()
        );
        // A removed path's field is refused, not ignored.
        assert!(serde_json::from_str::<CudaTuning>(r#"{"staged_tiles": true}"#).is_err());
    }
}
