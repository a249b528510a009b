//! ft's pictures, as SVG (plotters' SVG backend, no system fonts or libraries needed).
//!
//! Why a crate: drawing is its own job, with its own dependency (plotters) and its own
//! tests (every figure parses as SVG and names its series), and the binary keeps only the
//! argument glue. [`chart`] draws an experiment's CSV (`ft plot`); [`decision`] draws a
//! decision: the step time of each strategy split by resource, and the tok/s of each
//! strategy against each input that decides it, with the current host and the break-evens
//! marked (`ft explain --plot`). Both draw on the canvas of `chart::svg` and set up each
//! chart with `chart::frame` (margins, caption, mesh), and take their axis ranges and
//! ticks from [`axis`] and their legends from [`legend`].

pub mod axis;
pub mod chart;
pub mod decision;
pub mod legend;

/// What can go wrong drawing a figure.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The input (a CSV, an argument) cannot be drawn; the message names it.
    #[error("{0}")]
    Input(String),
    /// The figure has nothing to draw, or a value it cannot place.
    #[error("figure '{figure}': {message}")]
    Invalid {
        /// The figure (its title).
        figure: String,
        /// What is wrong.
        message: String,
    },
    /// plotters failed.
    #[error("drawing '{figure}': {message}")]
    Draw {
        /// The figure (its title).
        figure: String,
        /// plotters' message.
        message: String,
    },
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, PlotError>;
