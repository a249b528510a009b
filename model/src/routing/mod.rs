//! Which experts each token of a decode step is routed to, from a synthetic process or a trace.
//!
//! Routing is the input every view of a decode step shares: the runtime, the simulator and the
//! counting simulation in [`crate::traffic`] all pull [`StepRouting`]s from a [`RoutingSource`]
//! and hand each layer's routes to [`crate::plan::plan_layer`]. Two kinds of source exist:
//!
//! - [`SyntheticRouting`], a seeded stochastic process ([`RoutingProcess`], with named presets)
//!   whose temporal locality, popularity skew, token-to-token reuse and layer-to-layer
//!   correlation are fitted so that its cache hit rates and hot-list coverage match those
//!   measured on real MoE models (see `docs/routing.md`);
//! - [`TraceReader`], which replays a recorded trace (JSON lines or a compact binary form, both
//!   documented in `docs/routing.md`); [`RecordingSource`] writes one while passing steps through;
//!   [`import::import_csv`] converts the per-token CSV engines can log into a trace.
//!
//! [`stats`] computes what engines publish about their routing (hit rate against cache size,
//! hot-list coverage, reuse distances, union growth, layer-to-layer prediction) for any
//! source, and [`fit`] matches a process's knobs to such numbers.
//!
//! Streams are the concurrent sequences of a batch. `next_step(streams)` may be called with a
//! different count each step: stream `i` keeps its identity (its recent history) across steps, a
//! stream index that was not present in the previous step starts fresh.

pub mod fit;
pub mod import;
mod presets;
pub mod stats;
mod synthetic;
mod trace;

pub use presets::{describe, PRESET_NAMES};
pub use synthetic::{RoutingProcess, StreamState, SyntheticRouting};
pub use trace::{
    trace_geometry, trace_requests, RecordingSource, StreamTag, TraceFormat, TraceReader,
    TraceRequest, TraceRequests, TraceWriter, MAX_TRACE_STREAMS, REQUESTS_LISTED,
    TRACE_FORMAT_NAME,
};

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;

/// Largest deviation of a route's weight sum from 1 that validation accepts (f32 rounding of
/// a softmax over up to a few hundred experts stays far below it; a trace exported with
/// 3-4 decimal digits per weight stays below it too).
pub const WEIGHT_SUM_TOLERANCE: f32 = 1e-3;

/// The experts one token is routed to at one layer, with their router weights.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRoute {
    /// `top_k` distinct expert indices within the layer (0..experts).
    pub experts: Vec<u32>,
    /// Router weight of each expert, same order; non-negative, summing to 1.
    pub weights: Vec<f32>,
}

impl TokenRoute {
    /// Check this route against a geometry: `top_k` entries, distinct ids below `experts`,
    /// finite non-negative weights summing to 1 within [`WEIGHT_SUM_TOLERANCE`].
    /// `what` names the route in the error (e.g. `"trace.jsonl:17"`).
    pub fn validate(&self, geometry: &MoeGeometry, what: &str) -> Result<()> {
        let k = geometry.top_k;
        if self.experts.len() != k || self.weights.len() != k {
            return Err(ModelError::invalid(
                what,
                format!(
                    "{} experts and {} weights; the geometry routes each token to top_k = {k}",
                    self.experts.len(),
                    self.weights.len()
                ),
            ));
        }
        for (i, &e) in self.experts.iter().enumerate() {
            if e as usize >= geometry.experts {
                return Err(ModelError::invalid(
                    what,
                    format!(
                        "expert id {e} is out of range (the layer has {} experts)",
                        geometry.experts
                    ),
                ));
            }
            if self.experts[..i].contains(&e) {
                return Err(ModelError::invalid(
                    what,
                    format!("expert id {e} appears twice in one token's route"),
                ));
            }
        }
        let mut sum = 0.0f64;
        for &w in &self.weights {
            if !w.is_finite() || w < 0.0 {
                return Err(ModelError::invalid(
                    what,
                    format!("weight {w} is not a finite non-negative number"),
                ));
            }
            sum += w as f64;
        }
        if (sum - 1.0).abs() > WEIGHT_SUM_TOLERANCE as f64 {
            return Err(ModelError::invalid(
                what,
                format!("weights sum to {sum:.6}, not 1"),
            ));
        }
        Ok(())
    }
}

/// The routing of one decode step: for every MoE layer, one route per stream.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRouting {
    /// Step index as the source counts it (0 for the first step a source produced).
    pub step: u64,
    /// Routes indexed `[layer][stream]`.
    pub layers: Vec<Vec<TokenRoute>>,
}

impl StepRouting {
    /// Number of streams in this step (0 when there are no layers).
    pub fn streams(&self) -> usize {
        self.layers.first().map_or(0, Vec::len)
    }

    /// The same step restricted to the first `streams` streams.
    pub fn truncated(&self, streams: usize) -> StepRouting {
        StepRouting {
            step: self.step,
            layers: self
                .layers
                .iter()
                .map(|l| l[..streams.min(l.len())].to_vec())
                .collect(),
        }
    }

    /// Check the shape (`moe_layers` layers, the same stream count in each) and every route.
    /// `what` names the step in errors.
    pub fn validate(&self, geometry: &MoeGeometry, what: &str) -> Result<()> {
        if self.layers.len() != geometry.moe_layers {
            return Err(ModelError::invalid(
                what,
                format!(
                    "{} layers; the geometry has {} MoE layers",
                    self.layers.len(),
                    geometry.moe_layers
                ),
            ));
        }
        let streams = self.streams();
        for (l, routes) in self.layers.iter().enumerate() {
            if routes.len() != streams {
                return Err(ModelError::invalid(
                    what,
                    format!(
                        "layer {l} has {} streams, layer 0 has {streams}",
                        routes.len()
                    ),
                ));
            }
            for (s, r) in routes.iter().enumerate() {
                r.validate(geometry, &format!("{what} layer {l} stream {s}"))?;
            }
        }
        Ok(())
    }
}

/// A producer of decode-step routing.
pub trait RoutingSource: Send {
    /// The geometry every produced step conforms to (`moe_layers` layers, `top_k` distinct
    /// experts below `experts` per route).
    fn geometry(&self) -> &MoeGeometry;

    /// The routing of the next decode step for `streams` concurrent streams.
    fn next_step(&mut self, streams: usize) -> Result<StepRouting>;

    /// Like [`RoutingSource::next_step`], writing into `out` so that a hot loop can reuse its
    /// allocations. The default calls `next_step`; sources override it where it saves work.
    fn next_step_into(&mut self, streams: usize, out: &mut StepRouting) -> Result<()> {
        *out = self.next_step(streams)?;
        Ok(())
    }
}

impl<T: RoutingSource + ?Sized> RoutingSource for Box<T> {
    fn geometry(&self) -> &MoeGeometry {
        (**self).geometry()
    }

    fn next_step(&mut self, streams: usize) -> Result<StepRouting> {
        (**self).next_step(streams)
    }

    fn next_step_into(&mut self, streams: usize, out: &mut StepRouting) -> Result<()> {
        (**self).next_step_into(streams, out)
    }
}

/// Resolve what a `--routing` argument names: a preset name (see [`PRESET_NAMES`]), a TOML
/// file holding a [`RoutingProcess`] (`.toml`), or a trace file (JSON lines or binary; the
/// format is recognised from its first bytes). `seed`, when given, replaces the synthetic
/// process's seed; it is ignored for traces.
pub fn resolve(
    name_or_path: &str,
    geometry: &MoeGeometry,
    seed: Option<u64>,
) -> Result<Box<dyn RoutingSource>> {
    let path = Path::new(name_or_path);
    if PRESET_NAMES.contains(&name_or_path) {
        let mut process = RoutingProcess::preset(name_or_path)?;
        if let Some(seed) = seed {
            process.seed = seed;
        }
        return Ok(Box::new(SyntheticRouting::new(&process, *geometry)?));
    }
    if name_or_path.ends_with(".toml") {
        let mut process = RoutingProcess::from_toml_file(path)?;
        if let Some(seed) = seed {
            process.seed = seed;
        }
        return Ok(Box::new(SyntheticRouting::new(&process, *geometry)?));
    }
    if path.exists() {
        return Ok(Box::new(TraceReader::open(path, geometry)?));
    }
    Err(ModelError::UnknownName {
        kind: "routing (preset, .toml process or trace file)",
        name: name_or_path.to_string(),
        known: PRESET_NAMES.join(", "),
    })
}

/// A routing source opened for a report, with what it is in words (for the report's header).
pub struct NamedSource {
    /// The source.
    pub source: Box<dyn RoutingSource>,
    /// `trace PATH`, or `NAME (what the preset is for) on MODEL`.
    pub what: String,
}

/// Whether a `--routing` argument names a trace file: not a preset or a process TOML, and an
/// existing path.
pub fn names_trace(routing: &str) -> bool {
    let is_process = PRESET_NAMES.contains(&routing) || routing.ends_with(".toml");
    !is_process && Path::new(routing).exists()
}

/// Open what a `--routing` argument names for `ft routing stats`: a trace is routed on its own
/// header's geometry (`layers` must then be `None`), a preset or a process TOML on `model`'s
/// (a preset name or a model file), cut to its first `layers` MoE layers if given. `seed`
/// replaces a synthetic process's seed.
pub fn open_named(
    routing: &str,
    model: &str,
    layers: Option<usize>,
    seed: Option<u64>,
) -> Result<NamedSource> {
    if names_trace(routing) {
        let g = trace_geometry(Path::new(routing))?;
        if layers.is_some() {
            return Err(ModelError::invalid(
                "--layers",
                format!(
                    "cannot change a trace's layers ({} in {routing})",
                    g.moe_layers
                ),
            ));
        }
        let r = TraceReader::open(Path::new(routing), &g)?;
        return Ok(NamedSource {
            source: Box::new(r),
            what: format!("trace {routing}"),
        });
    }
    let spec = crate::preset::ModelSpec::resolve(model)?;
    let mut g = spec.geometry;
    if let Some(l) = layers {
        if l == 0 || l > g.moe_layers {
            return Err(ModelError::invalid(
                "--layers",
                format!(
                    "{l} is outside 1..={} (the model's MoE layers)",
                    g.moe_layers
                ),
            ));
        }
        g.moe_layers = l;
    }
    let source = resolve(routing, &g, seed)?;
    let what = match describe(routing) {
        Some(d) => format!("{routing} ({d}) on {}", spec.name),
        None => format!("{routing} on {}", spec.name),
    };
    Ok(NamedSource { source, what })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> MoeGeometry {
        MoeGeometry {
            hidden: 64,
            intermediate: 64,
            experts: 8,
            top_k: 2,
            moe_layers: 3,
            shared_experts: 0,
        }
    }

    #[test]
    fn routes_are_validated_with_named_errors() {
        let g = geo();
        let ok = TokenRoute {
            experts: vec![1, 7],
            weights: vec![0.25, 0.75],
        };
        ok.validate(&g, "r").unwrap();
        let bad = [
            (vec![1], vec![1.0], "top_k = 2"),
            (vec![1, 8], vec![0.5, 0.5], "out of range"),
            (vec![2, 2], vec![0.5, 0.5], "appears twice"),
            (vec![1, 2], vec![0.5, 0.6], "sum to"),
            (vec![1, 2], vec![1.5, -0.5], "non-negative"),
            (vec![1, 2], vec![f32::NAN, 1.0], "finite"),
        ];
        for (experts, weights, want) in bad {
            let e = TokenRoute { experts, weights }
                .validate(&g, "route@x")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("route@x"), "{e}");
        }
        let step = StepRouting {
            step: 4,
            layers: vec![vec![ok.clone(), ok.clone()]; 3],
        };
        step.validate(&g, "s").unwrap();
        assert_eq!(step.streams(), 2);
        assert_eq!(step.truncated(1).streams(), 1);
        assert_eq!(step.truncated(1).step, 4);
        let mut ragged = step.clone();
        ragged.layers[1].pop();
        assert!(ragged
            .validate(&g, "s")
            .unwrap_err()
            .to_string()
            .contains("layer 1"));
        let mut short = step;
        short.layers.pop();
        assert!(short.validate(&g, "s").is_err());
    }

    #[test]
    fn resolve_presets_processes_and_unknown_names() {
        let g = geo();
        let mut a = resolve("skewed", &g, None).unwrap();
        let mut b = resolve("skewed", &g, Some(presets::DEFAULT_SEED)).unwrap();
        assert_eq!(a.next_step(2).unwrap(), b.next_step(2).unwrap());
        let mut c = resolve("skewed", &g, Some(99)).unwrap();
        let mut d = resolve("skewed", &g, None).unwrap();
        assert_ne!(c.next_step(2).unwrap(), d.next_step(2).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, "zipf = 0.9\nreuse = 0.5\nseed = 3\n").unwrap();
        let mut p = resolve(path.to_str().unwrap(), &g, None).unwrap();
        assert_eq!(p.geometry(), &g);
        p.next_step(1).unwrap().validate(&g, "p").unwrap();
        let e = resolve("nosuch", &g, None).err().unwrap().to_string();
        assert!(e.contains("nosuch") && e.contains("typical"), "{e}");
        assert!(resolve("/nonexistent/p.toml", &g, None).is_err());
    }

    #[test]
    fn open_named_cuts_layers_and_describes_the_source() {
        let n = open_named("typical", "qwen3.8-flash-next", Some(2), Some(7)).unwrap();
        assert_eq!(n.source.geometry().moe_layers, 2);
        assert!(
            n.what.starts_with("typical (") && n.what.ends_with(" on qwen3.8-flash-next"),
            "{}",
            n.what
        );
        let full = open_named("uniform", "qwen3.8-flash-next", None, None).unwrap();
        let spec = crate::preset::ModelSpec::resolve("qwen3.8-flash-next").unwrap();
        assert_eq!(*full.source.geometry(), spec.geometry);
        for layers in [0, spec.geometry.moe_layers + 1] {
            let e = open_named("typical", "qwen3.8-flash-next", Some(layers), None)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("--layers") && e.contains("outside"), "{e}");
        }
        let e = open_named("nosuch", "qwen3.8-flash-next", None, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("nosuch"), "{e}");
    }

    #[test]
    fn open_named_reads_a_trace_on_its_own_geometry() {
        let g = geo();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut w = TraceWriter::create(&path, &g).unwrap();
        let mut src = SyntheticRouting::new(&RoutingProcess::default(), g).unwrap();
        for _ in 0..4 {
            w.write_step(&src.next_step(1).unwrap()).unwrap();
        }
        w.finish().unwrap();
        let name = path.display().to_string();
        // The model is not read for a trace.
        let mut n = open_named(&name, "no-such-model", None, None).unwrap();
        assert_eq!(n.what, format!("trace {name}"));
        assert_eq!(*n.source.geometry(), g);
        assert_eq!(n.source.next_step(1).unwrap().layers.len(), g.moe_layers);
        let e = open_named(&name, "no-such-model", Some(1), None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cannot change a trace's layers"), "{e}");
        // Its own statistics as fit points: enough steps, and a clear refusal past the end.
        let pts = fit::points_from_trace(&path, 1, 3).unwrap();
        assert_eq!((pts.experts, pts.moe_layers), (g.experts, g.moe_layers));
        assert_eq!((pts.warmup_steps, pts.steps), (1, 3));
        let e = fit::points_from_trace(&path, 2, 3).unwrap_err().to_string();
        assert!(e.contains("4 steps") && e.contains("need 5"), "{e}");
    }

    #[test]
    fn a_named_process_is_a_preset_or_a_toml_file() {
        assert_eq!(
            RoutingProcess::named("skewed").unwrap(),
            RoutingProcess::preset("skewed").unwrap()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        let p = RoutingProcess::preset("mild").unwrap();
        std::fs::write(&path, toml::to_string(&p).unwrap()).unwrap();
        assert_eq!(RoutingProcess::named(path.to_str().unwrap()).unwrap(), p);
        assert!(RoutingProcess::named("nosuch").is_err());
    }
}
