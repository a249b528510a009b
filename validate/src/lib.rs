//! `ft-validate`: the acceptance of the performance model against measured runs, as a
//! library the binary's `ft validate` (and any program) calls.
//!
//! - [`grid`]: the grid of configurations (expert geometry x cache residency x streams x CPU
//!   threads x context) and the order to run them in.
//! - [`rows`]: the measured runs and the predictions of a grid as one row per strategy run
//!   ([`rows::collect`]), and the CSV they are kept in.
//! - [`simulate`]: the discrete-event simulator given the same fitted profile as the model,
//!   for every row (the simulator against the runtime).
//! - [`stats`]: from the rows alone, the prediction errors, the model's choice against the
//!   measured best, and the same for the ratio rule and for ferrox-core as a peer.
//! - [`peer`]: ferrox-core's verdict and fetch fraction fed the same bench bandwidths.
//! - [`json`]: one value of a JSON document by a JSON pointer (the experiment scripts' `jq`).
//!
//! Why ferrox-core is a dependency: the analysis is part of the acceptance, the GPU machine
//! has no Rust toolchain, and the one prebuilt `ft` carried there must do the measuring and
//! the analysis; ferrox-core's default features pull no GPU code and it is pure Rust. Using
//! the crate itself (not ft's mirror of its rule in `ft_model::perf::legacy`) is what makes
//! it a peer: an independent implementation fed the same bandwidths.

pub mod error;
pub mod grid;
pub mod json;
pub mod peer;
pub mod rows;
pub mod simulate;
pub mod stats;

pub use error::{Result, ValidateError};

use ft_model::profile::Profile;

/// A profile refitted from its own samples (`ft_model::perf::fit`), the fit starting from
/// its parameters: what `ft probe` of this build would have fitted to the same measurements.
/// The key, the samples and the bench bandwidths are kept.
pub fn refit(p: &Profile) -> Result<Profile> {
    use ft_model::perf::fit::{fit, FitConfig};
    let report = fit(&p.samples, &p.params, &FitConfig::default())?;
    // Parameters the samples do not determine keep the uncertainty the profile gave them.
    let model = report.model(&p.covariance, "ft validate refit");
    let mut q = p.clone();
    q.params = model.params;
    q.covariance = model.covariance;
    q.dof = model.dof;
    q.fit = Some(report);
    Ok(q)
}
