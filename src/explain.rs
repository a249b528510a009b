//! `ft explain`: why the model chooses what it chooses and, where the legacy ratio's verdict
//! differs, which mechanisms it cannot see, in numbers; what would flip the choice (the
//! break-evens); with `--observations`, which input separates measured runs of an engine
//! from their bench-only prediction; with `--plot`, the decision as a picture. Same inputs
//! as `ft predict`.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

use ft_model::perf::breakeven::{reconcile, Input, Scenario};
use ft_model::perf::explain;

use crate::predict::header;

/// Arguments of `ft explain`: those of `ft predict` and its own.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// What to predict (as `ft predict`).
    #[command(flatten)]
    pub predict: crate::predict::Args,
    /// Measured runs of an engine on this host (an observations CSV, `docs/observations.md`):
    /// for each, the value of each input alone that would reconcile it with its bench-only
    /// prediction, and the mechanism most plausibly at work.
    #[arg(long, value_name = "CSV")]
    pub observations: Option<PathBuf>,
    /// Draw the decision to this SVG file: the step time of each strategy split by resource,
    /// and the tok/s of each strategy against each input that decides it, with the current
    /// value marked and the break-evens shown.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// Points of each curve of `--plot`.
const CURVE_POINTS: usize = 41;

/// Stream counts of the streams panel (and the current one): a decode server's usual
/// batch sizes, doubling, where the choice between strategies can flip.
const PANEL_STREAMS: [usize; 8] = [1, 2, 3, 4, 6, 8, 12, 16];

/// Run `ft explain`.
pub fn run(args: ExplainArgs) -> Result<()> {
    let plan = args.predict.plan()?;
    let pred = plan.predict()?;
    let e = explain(&pred, plan.params());
    let flips = plan.break_evens(&pred, &e.decision)?;
    let case = match &args.observations {
        Some(path) => {
            let input = format!("--observations {}", path.display());
            let obs = ft_model::observe::read_observations(path).context(input.clone())?;
            Some(reconcile(&plan.model, &plan.perf, &plan.config, &obs).context(input)?)
        }
        None => None,
    };
    if let Some(path) = &args.plot {
        let scenario = Scenario::new(
            &plan.model,
            &plan.perf,
            &plan.config,
            &pred,
            e.decision.kind,
        )
        .context("--plot")?;
        let mut fig = figure(&pred, &scenario, &flips, &plan.model.name);
        fig.panels
            .push(streams_panel(&plan, &pred, &fig).context("--plot: the streams panel")?);
        let svg = ft_plot::decision::render(&fig).context("--plot")?;
        std::fs::write(path, svg).with_context(|| format!("--plot {}", path.display()))?;
        tracing::info!("wrote {}", path.display());
    }
    let mut out = std::io::stdout().lock();
    if args.predict.json {
        let doc = serde_json::json!({
            "explanation": e,
            "break_evens": flips,
            "observations": case,
            "prediction": pred,
            "profile_untrusted": plan.profile_untrusted,
            "warnings": plan.warnings,
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", header(&plan, &pred))?;
        writeln!(out)?;
        write!(out, "{}", e.text)?;
        writeln!(out)?;
        writeln!(
            out,
            "What would flip the choice (each input alone, the rest held; the cache as it is):"
        )?;
        write!(out, "{}", flips.text)?;
        if let Some(case) = &case {
            writeln!(out)?;
            writeln!(
                out,
                "Measured runs against their bench-only prediction (each input alone solved to reconcile each run):"
            )?;
            write!(out, "{}", case.text)?;
        }
    }
    Ok(())
}

/// The figure of a decision: the step split of every ranked strategy and one panel per
/// input.
fn figure(
    pred: &ft_model::perf::Prediction,
    scenario: &Scenario,
    flips: &ft_model::perf::breakeven::BreakEvens,
    model: &str,
) -> ft_plot::decision::Figure {
    use ft_model::perf::Resource;
    use ft_plot::decision::{Bar, Curve, Figure, Mark, Panel};
    let ranked: Vec<&ft_model::perf::StrategyPrediction> = pred
        .strategies
        .iter()
        .filter(|s| ft_model::perf::breakeven::ranked(s))
        .collect();
    let bars = ranked
        .iter()
        .map(|s| Bar {
            label: s.strategy.to_string(),
            parts: Resource::ALL
                .iter()
                .map(|r| (r.name().to_string(), s.critical.get(*r) / 1e3))
                .collect(),
        })
        .collect();
    let streams = pred.config.streams as f64;
    let panels = flips
        .inputs
        .iter()
        .filter(|b| !(b.input == Input::MissRate && b.current <= 0.0))
        .map(|b| {
            let [lo, mut hi] = b.range;
            if b.input == Input::CpuLayerFixed {
                // Up to twice the farthest flip (or 200 us): beyond, every curve is flat.
                let far = b
                    .below
                    .iter()
                    .chain(b.above.iter())
                    .map(|f| f.at)
                    .fold(0.0, f64::max);
                hi = hi.min((2.0 * far).max(b.current * 2.0).max(200.0));
            }
            let log = matches!(
                b.input,
                Input::CpuServing | Input::LinkRate | Input::Context
            );
            let lo = if b.input == Input::Context {
                lo.max(64.0)
            } else {
                lo
            };
            let xs: Vec<f64> = (0..CURVE_POINTS)
                .map(|i| {
                    let t = i as f64 / (CURVE_POINTS - 1) as f64;
                    if log {
                        (lo.ln() + t * (hi.ln() - lo.ln())).exp()
                    } else {
                        lo + t * (hi - lo)
                    }
                })
                .collect();
            let scale = |x: f64| {
                if b.input == Input::MissRate {
                    100.0 * x
                } else {
                    x
                }
            };
            let curves = scenario
                .strategies()
                .iter()
                .map(|st| Curve {
                    name: st.to_string(),
                    points: xs
                        .iter()
                        .filter_map(|&x| {
                            scenario
                                .step_us_at(st.kind(), b.input, x)
                                .map(|t| (scale(x), streams * 1e6 / t))
                        })
                        .collect(),
                })
                .collect();
            let mut marks = vec![Mark {
                x: scale(b.current),
                label: "this host".to_string(),
                current: true,
            }];
            for f in b.below.iter().chain(b.above.iter()) {
                marks.push(Mark {
                    x: scale(f.at),
                    label: format!("flip to {}", f.to),
                    current: false,
                });
            }
            let (title, x_label) = match b.input {
                Input::CpuServing => (
                    "CPU serving rate",
                    "CPU side's rate (x its modelled rate, log)",
                ),
                Input::CpuLayerFixed => (
                    "fixed cost per CPU layer-step",
                    "fixed cost in series per layer-step with CPU work (us)",
                ),
                Input::MissRate => ("miss rate", "offload's miss rate (%)"),
                Input::LinkRate => ("link rate", "link's gather rate (x its modelled rate, log)"),
                Input::Context => ("context", "context per stream (tokens, log)"),
            };
            Panel {
                title: title.to_string(),
                x_label: x_label.to_string(),
                y_label: "tok/s, all streams".to_string(),
                log_x: log,
                curves,
                marks,
            }
        })
        .collect();
    Figure {
        title: format!(
            "{model} at {} stream(s), context {}: choice {} ({:+.0}% over the runner-up)",
            pred.config.streams,
            pred.config.context,
            ranked
                .iter()
                .find(|s| s.kind == scenario.strategies()[0].kind())
                .map(|s| s.strategy.to_string())
                .unwrap_or_default(),
            100.0 * {
                let mut t: Vec<f64> = ranked.iter().map(|s| s.tok_s_total).collect();
                t.sort_by(|a, b| b.total_cmp(a));
                if t.len() > 1 {
                    t[0] / t[1] - 1.0
                } else {
                    0.0
                }
            }
        ),
        bars_title: "critical path of one decode step, by resource".to_string(),
        bars_unit: "ms per step".to_string(),
        bars,
        panels,
    }
}

/// The streams panel: each ranked strategy's tok/s (all streams) predicted again at each
/// of [`PANEL_STREAMS`] and the current count, the current count marked and a break-even
/// where the best strategy changes (where the two curves cross, between the counts).
/// Curves are named as in the figure's other panels, by the strategy of the current
/// prediction of the same kind, so that each keeps its colour.
fn streams_panel(
    plan: &crate::predict::Plan,
    pred: &ft_model::perf::Prediction,
    fig: &ft_plot::decision::Figure,
) -> Result<ft_plot::decision::Panel> {
    use ft_model::perf::breakeven::ranked;
    use ft_plot::decision::{Curve, Mark, Panel};
    let current = pred.config.streams;
    let mut counts: Vec<usize> = PANEL_STREAMS.to_vec();
    counts.push(current);
    counts.sort_unstable();
    counts.dedup();
    let names = fig.strategies();
    let kinds: Vec<(ft_model::StrategyKind, String)> = pred
        .strategies
        .iter()
        .filter(|s| ranked(s))
        .map(|s| {
            let label = s.strategy.to_string();
            let name = names
                .iter()
                .find(|n| **n == label)
                .cloned()
                .unwrap_or(label);
            (s.kind, name)
        })
        .collect();
    let mut curves: Vec<Curve> = kinds
        .iter()
        .map(|(_, name)| Curve {
            name: name.clone(),
            points: Vec::new(),
        })
        .collect();
    for &n in &counts {
        let config = ft_model::perf::predict::PredictConfig {
            streams: n,
            ..plan.config.clone()
        };
        let p = ft_model::perf::predict(&plan.model, &plan.perf, &config)
            .with_context(|| format!("predicting {n} stream(s)"))?;
        for ((kind, _), curve) in kinds.iter().zip(curves.iter_mut()) {
            if let Some(s) = p.strategies.iter().find(|s| s.kind == *kind && ranked(s)) {
                curve.points.push((n as f64, s.tok_s_total));
            }
        }
    }
    let mut marks = vec![Mark {
        x: current as f64,
        label: "this host".to_string(),
        current: true,
    }];
    marks.extend(ft_plot::decision::flips(&curves));
    Ok(Panel {
        title: "streams".to_string(),
        x_label: "concurrent streams (log)".to_string(),
        y_label: "tok/s, all streams".to_string(),
        log_x: true,
        curves,
        marks,
    })
}
