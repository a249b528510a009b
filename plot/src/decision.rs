//! The picture of a decision (`ft explain --plot`): what each strategy's decode step is made
//! of, and how each strategy's tok/s moves with each input that decides between them.
//!
//! Top: one horizontal stacked bar per strategy, its step's critical path split by the
//! resource each part runs on (ms per step). Below: one panel per input (the CPU side's
//! serving rate, the fixed cost per layer-step with CPU work, the miss rate, the link's
//! rate, the context), each with one curve per strategy (tok/s of all streams against the
//! input), the current host marked by a solid line and every break-even (where the choice
//! flips) by a dashed one. One legend for the whole figure, above the panels, so that no
//! legend covers a curve; every series is named by its strategy, never by a column.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::axis::{self, Fit, Scale};
use crate::chart::{self, Area, Chart, Frame, FrameAxis};
use crate::legend::{self, Entry, Swatch};
use crate::{PlotError, Result};

/// Width of a decision figure, in pixels.
pub const WIDTH: u32 = 1200;

/// Height of the figure's title and legend band, in pixels.
const HEADER: u32 = 84;

/// Height of one bar row, in pixels.
const BAR_ROW: u32 = 30;

/// Height of one row of panels, in pixels.
const PANEL_HEIGHT: u32 = 340;

/// Panels per row.
const PANEL_COLUMNS: usize = 2;

/// Colours of the strategies, in the figure's order (colour-blind-safe: Okabe-Ito).
const STRATEGY_COLORS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(120, 120, 120),
];

/// Colours of the resources of the bars, by name; others take grey.
const RESOURCE_COLORS: [(&str, RGBColor); 6] = [
    ("pcie", RGBColor(0, 114, 178)),
    ("cpu", RGBColor(213, 94, 0)),
    ("gpu", RGBColor(0, 158, 115)),
    ("sync", RGBColor(204, 121, 167)),
    ("dense", RGBColor(150, 150, 150)),
    ("other", RGBColor(230, 159, 0)),
];

/// The current host's mark.
const CURRENT_COLOR: RGBColor = RGBColor(30, 30, 30);

/// A break-even's mark.
const FLIP_COLOR: RGBColor = RGBColor(200, 30, 30);

/// One strategy's step, split by resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// The strategy.
    pub label: String,
    /// (resource, ms per step) in drawing order; the parts add up to the step.
    pub parts: Vec<(String, f64)>,
}

/// One strategy's curve in a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// The strategy (the same name in every panel gets the same colour).
    pub name: String,
    /// (input value, tok/s) points, in increasing input.
    pub points: Vec<(f64, f64)>,
}

/// A vertical mark in a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// Where, in the panel's x unit.
    pub x: f64,
    /// What it marks.
    pub label: String,
    /// True for the current host (solid); false for a break-even (dashed).
    pub current: bool,
}

/// One input's panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Its title.
    pub title: String,
    /// The x axis' label, with its unit.
    pub x_label: String,
    /// The y axis' label, with its unit.
    pub y_label: String,
    /// Logarithmic x axis (every x positive).
    pub log_x: bool,
    /// One curve per strategy.
    pub curves: Vec<Curve>,
    /// The current value and the break-evens.
    pub marks: Vec<Mark>,
}

/// A decision's figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The title.
    pub title: String,
    /// The bars' title.
    pub bars_title: String,
    /// The bars' unit (x axis).
    pub bars_unit: String,
    /// One bar per strategy.
    pub bars: Vec<Bar>,
    /// One panel per input.
    pub panels: Vec<Panel>,
}

impl Figure {
    /// Every strategy named by a bar or a curve, in first-seen order (their colours).
    pub fn strategies(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        let names = self.bars.iter().map(|b| &b.label).chain(
            self.panels
                .iter()
                .flat_map(|p| p.curves.iter().map(|c| &c.name)),
        );
        for n in names {
            if !v.contains(n) {
                v.push(n.clone());
            }
        }
        v
    }

    fn invalid(&self, message: impl Into<String>) -> PlotError {
        PlotError::Invalid {
            figure: self.title.clone(),
            message: message.into(),
        }
    }

    fn check(&self) -> Result<()> {
        if self.bars.is_empty() && self.panels.is_empty() {
            return Err(self.invalid("nothing to draw"));
        }
        for p in &self.panels {
            let xs = p
                .curves
                .iter()
                .flat_map(|c| c.points.iter().map(|q| q.0))
                .chain(p.marks.iter().map(|m| m.x));
            for x in xs {
                if !x.is_finite() || (p.log_x && x <= 0.0) {
                    return Err(self.invalid(format!(
                        "panel '{}': x = {x} cannot be placed{}",
                        p.title,
                        if p.log_x { " on a log axis" } else { "" }
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Where the best of `curves` (the highest y) changes between two neighbouring x at which
/// every curve concerned has a point: a break-even mark where the old best and the new one
/// cross, by linear interpolation of their difference, named for the new best. For inputs
/// the model is evaluated at a few points only (stream counts).
pub fn flips(curves: &[Curve]) -> Vec<Mark> {
    let at = |c: &Curve, x: f64| c.points.iter().find(|p| p.0 == x).map(|p| p.1);
    let best = |x: f64| {
        curves
            .iter()
            .enumerate()
            .filter_map(|(i, c)| at(c, x).map(|y| (i, y)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    let mut xs: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let mut marks = Vec::new();
    for w in xs.windows(2) {
        let (Some((a, _)), Some((b, _))) = (best(w[0]), best(w[1])) else {
            continue;
        };
        if a == b {
            continue;
        }
        let d = |x: f64| Some(at(&curves[b], x)? - at(&curves[a], x)?);
        let (Some(d0), Some(d1)) = (d(w[0]), d(w[1])) else {
            continue;
        };
        let t = if d1 != d0 { -d0 / (d1 - d0) } else { 0.5 };
        marks.push(Mark {
            x: w[0] + t.clamp(0.0, 1.0) * (w[1] - w[0]),
            label: format!("flip to {}", curves[b].name),
            current: false,
        });
    }
    marks
}

fn draw_err(figure: &str) -> impl Fn(String) -> PlotError + '_ {
    move |message| PlotError::Draw {
        figure: figure.to_string(),
        message,
    }
}

fn resource_color(name: &str) -> RGBColor {
    RESOURCE_COLORS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| *c)
        .unwrap_or(RGBColor(190, 190, 190))
}

/// Draw `fig` as an SVG document.
pub fn render(fig: &Figure) -> Result<String> {
    fig.check()?;
    let bars_h = if fig.bars.is_empty() {
        0
    } else {
        90 + BAR_ROW * fig.bars.len() as u32
    };
    let rows = fig.panels.len().div_ceil(PANEL_COLUMNS) as u32;
    let height = HEADER + bars_h + rows * PANEL_HEIGHT;
    let strategies = fig.strategies();
    let color_of = |name: &str| {
        let i = strategies.iter().position(|s| s == name).unwrap_or(0);
        STRATEGY_COLORS[i % STRATEGY_COLORS.len()]
    };
    let err = draw_err(&fig.title);
    let (svg, ()) = chart::svg((WIDTH, height), &fig.title, |root| {
        let (header, rest) = root.split_vertically(HEADER);
        draw_header(&header, fig, &strategies, &color_of).map_err(&err)?;
        let (bars, panels) = rest.split_vertically(bars_h);
        if !fig.bars.is_empty() {
            draw_bars(&bars, fig).map_err(&err)?;
        }
        if rows > 0 {
            let areas = panels.split_evenly((rows as usize, PANEL_COLUMNS));
            for (p, area) in fig.panels.iter().zip(areas.iter()) {
                draw_panel(area, p, &color_of).map_err(&err)?;
            }
        }
        Ok(())
    })?;
    Ok(svg)
}

/// A backend pixel in `area`'s own coordinates (what its `draw` takes).
fn local(area: &Area<'_>, (x, y): (i32, i32)) -> (i32, i32) {
    let (bx, by) = area.get_base_pixel();
    (x - bx, y - by)
}

fn text_style(size: u32, color: RGBColor) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&color)
}

/// The figure's one legend: the strategies' colours and the marks' styles.
fn legend_entries(strategies: &[String], color_of: &dyn Fn(&str) -> RGBColor) -> Vec<Entry> {
    let mut v: Vec<Entry> = strategies
        .iter()
        .map(|s| Entry {
            label: s.clone(),
            color: color_of(s),
            swatch: Swatch::Line,
        })
        .collect();
    v.push(Entry {
        label: "this host".into(),
        color: CURRENT_COLOR,
        swatch: Swatch::Tick,
    });
    v.push(Entry {
        label: "break-even (the choice flips)".into(),
        color: FLIP_COLOR,
        swatch: Swatch::DashedTick,
    });
    v
}

/// The title, and one legend for the figure.
fn draw_header(
    area: &Area<'_>,
    fig: &Figure,
    strategies: &[String],
    color_of: &dyn Fn(&str) -> RGBColor,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
    area.draw(&Text::new(
        fig.title.clone(),
        (16, 12),
        text_style(19, RGBColor(0, 0, 0)),
    ))
    .map_err(e)?;
    let entries = legend_entries(strategies, color_of);
    legend::draw_line(area, &entries, (16, 52)).map_err(e)?;
    Ok(())
}

/// One stacked horizontal bar per strategy, split by resource, with its own legend row.
fn draw_bars(area: &Area<'_>, fig: &Figure) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
    let n = fig.bars.len();
    let longest = fig
        .bars
        .iter()
        .map(|b| b.parts.iter().map(|p| p.1.max(0.0)).sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-9);
    let f = Frame {
        caption: Some(&fig.bars_title),
        margin: 10,
        margin_top: 28,
        x_labels: 38,
        y_labels: 190,
        x: FrameAxis {
            desc: &fig.bars_unit,
            range: (0.0, longest),
            scale: Scale::Linear,
        },
        y: None,
    };
    let mut chart = chart::frame(area, &f, 0.0..longest * 1.05, 0.0..n as f64)?;
    let mut resources: Vec<&str> = Vec::new();
    for (i, b) in fig.bars.iter().enumerate() {
        // The first bar on top.
        let y = (n - 1 - i) as f64;
        let mut x0 = 0.0;
        for (r, ms) in &b.parts {
            if *ms <= 0.0 {
                continue;
            }
            if !resources.contains(&r.as_str()) {
                resources.push(r);
            }
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, y + 0.18), (x0 + ms, y + 0.82)],
                    resource_color(r).filled(),
                )))
                .map_err(|e| e.to_string())?;
            x0 += ms;
        }
        let (px, py) = local(area, chart.backend_coord(&(0.0, y + 0.5)));
        area.draw(&Text::new(
            b.label.clone(),
            (px - 8, py),
            text_style(13, CURRENT_COLOR).pos(Pos::new(HPos::Right, VPos::Center)),
        ))
        .map_err(e)?;
        let (tx, _) = local(area, chart.backend_coord(&(x0, y + 0.5)));
        area.draw(&Text::new(
            format!("{} ms", axis::tick(x0)),
            (tx + 6, py),
            text_style(12, CURRENT_COLOR).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(e)?;
    }
    // The resources' legend, under the caption, on the right.
    let entries: Vec<Entry> = resources
        .into_iter()
        .map(|r| Entry {
            label: r.to_string(),
            color: resource_color(r),
            swatch: Swatch::Block,
        })
        .collect();
    let width: i32 = entries
        .iter()
        .map(|e| legend::text_width(&e.label, legend::FONT) + 50)
        .sum();
    let right = area.dim_in_pixel().0 as i32;
    legend::draw_line(area, &entries, ((right - width).max(0), 14)).map_err(e)?;
    Ok(())
}

fn draw_panel(
    area: &Area<'_>,
    p: &Panel,
    color_of: &dyn Fn(&str) -> RGBColor,
) -> std::result::Result<(), String> {
    let scale = Scale::of(p.log_x);
    let (xlo, xhi) = axis::range(
        p.curves
            .iter()
            .flat_map(|c| c.points.iter().map(|q| q.0))
            .chain(p.marks.iter().map(|m| m.x)),
        scale,
        Fit::TIGHT,
    );
    let (_, yhi) = axis::range(
        p.curves.iter().flat_map(|c| c.points.iter().map(|q| q.1)),
        Scale::Linear,
        Fit::FROM_ZERO,
    );
    let f = Frame {
        caption: Some(&p.title),
        margin: 12,
        margin_top: 12,
        x_labels: 42,
        y_labels: 60,
        x: FrameAxis {
            desc: &p.x_label,
            range: (xlo, xhi),
            scale,
        },
        y: Some(FrameAxis {
            desc: &p.y_label,
            range: (0.0, yhi),
            scale: Scale::Linear,
        }),
    };
    if p.log_x {
        let ticks = axis::log_ticks(xlo, xhi, axis::MAX_LOG_TICKS);
        let x = (xlo..xhi).log_scale().with_key_points(ticks);
        fill_panel(chart::frame(area, &f, x, 0.0..yhi)?, p, color_of, yhi)
    } else {
        fill_panel(
            chart::frame(area, &f, xlo..xhi, 0.0..yhi)?,
            p,
            color_of,
            yhi,
        )
    }
}

fn fill_panel<'a, X>(
    mut chart: Chart<'a, X, plotters::coord::types::RangedCoordf64>,
    p: &Panel,
    color_of: &dyn Fn(&str) -> RGBColor,
    yhi: f64,
) -> std::result::Result<(), String>
where
    X: Ranged<ValueType = f64>,
{
    for c in &p.curves {
        let color = color_of(&c.name);
        chart
            .draw_series(LineSeries::new(
                c.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
    }
    for (k, m) in p.marks.iter().enumerate() {
        let pts = vec![(m.x, 0.0), (m.x, yhi)];
        if m.current {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    pts,
                    CURRENT_COLOR.stroke_width(2),
                )))
                .map_err(|e| e.to_string())?;
        } else {
            chart
                .draw_series(DashedLineSeries::new(pts, 6, 4, FLIP_COLOR.stroke_width(2)))
                .map_err(|e| e.to_string())?;
        }
        let plot = chart.plotting_area().strip_coord_spec();
        let (px, py) = local(&plot, chart.backend_coord(&(m.x, yhi)));
        let color = if m.current { CURRENT_COLOR } else { FLIP_COLOR };
        // Right of the line, or left of it in the right third of the panel; staggered
        // from the top so that marks close together stay readable.
        let right_third = px > plot.dim_in_pixel().0 as i32 * 2 / 3;
        let (x, anchor) = if right_third {
            (px - 4, HPos::Right)
        } else {
            (px + 4, HPos::Left)
        };
        plot.draw(&Text::new(
            format!("{} ({})", m.label, axis::tick(m.x)),
            (x, py + 4 + 15 * k as i32),
            text_style(12, color).pos(Pos::new(anchor, VPos::Top)),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure() -> Figure {
        let curve = |name: &str, k: f64| Curve {
            name: name.to_string(),
            points: (0..20)
                .map(|i| {
                    let x = 0.02 * 1.4f64.powi(i);
                    (x, 80.0 + k * x.ln())
                })
                .collect(),
        };
        Figure {
            title: "test decision".into(),
            bars_title: "critical path".into(),
            bars_unit: "ms per step".into(),
            bars: vec![
                Bar {
                    label: "hybrid(f=0.350)".into(),
                    parts: vec![
                        ("pcie".into(), 4.5),
                        ("cpu".into(), 2.0),
                        ("dense".into(), 3.1),
                    ],
                },
                Bar {
                    label: "offload".into(),
                    parts: vec![("pcie".into(), 8.2), ("dense".into(), 3.1)],
                },
            ],
            panels: vec![Panel {
                title: "CPU serving rate".into(),
                x_label: "x its bench rate".into(),
                y_label: "tok/s".into(),
                log_x: true,
                curves: vec![curve("hybrid(f=0.350)", 10.0), curve("offload", 0.0)],
                marks: vec![
                    Mark {
                        x: 1.0,
                        label: "this host".into(),
                        current: true,
                    },
                    Mark {
                        x: 0.27,
                        label: "flip to offload".into(),
                        current: false,
                    },
                ],
            }],
        }
    }

    #[test]
    fn a_decision_figure_names_its_series_and_labels_its_log_axis() {
        let svg = render(&figure()).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for name in [
            "hybrid(f=0.350)",
            "offload",
            "this host",
            "flip to offload",
            "pcie",
            "cpu",
        ] {
            assert!(svg.contains(name), "{name} missing");
        }
        // Labelled beyond 10 and between decades.
        let texts: Vec<&str> = svg.lines().map(str::trim).collect();
        for label in ["0.05", "0.1", "0.2", "1", "10"] {
            assert!(texts.contains(&label), "{label} missing");
        }
    }

    #[test]
    fn a_log_axis_refuses_a_non_positive_value() {
        let mut f = figure();
        f.panels[0].marks[0].x = 0.0;
        let e = render(&f).unwrap_err().to_string();
        assert!(e.contains("log axis"), "{e}");
    }

    /// The flips found by interpolation against a brute-force scan of the interpolated
    /// curves: the best changes once, between 2 and 4 streams, where the lines cross.
    #[test]
    fn flips_sit_where_the_best_curve_changes() {
        let c = |name: &str, pts: &[(f64, f64)]| Curve {
            name: name.into(),
            points: pts.to_vec(),
        };
        let curves = [
            c(
                "hybrid",
                &[(1.0, 100.0), (2.0, 120.0), (4.0, 130.0), (8.0, 135.0)],
            ),
            c(
                "offload",
                &[(1.0, 60.0), (2.0, 90.0), (4.0, 150.0), (8.0, 200.0)],
            ),
        ];
        let f = flips(&curves);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].label, "flip to offload");
        assert!(!f[0].current);
        // Slow reference: scan the piecewise-linear curves for the first x where
        // offload is ahead.
        let lerp = |c: &Curve, x: f64| {
            let w = c
                .points
                .windows(2)
                .find(|w| w[0].0 <= x && x <= w[1].0)
                .unwrap();
            w[0].1 + (x - w[0].0) / (w[1].0 - w[0].0) * (w[1].1 - w[0].1)
        };
        let cross = (0..=60_000)
            .map(|i| 2.0 + i as f64 / 30_000.0)
            .find(|&x| lerp(&curves[1], x) >= lerp(&curves[0], x))
            .unwrap();
        assert!((f[0].x - cross).abs() < 1e-3, "{} vs {cross}", f[0].x);
        // No change of the best: no flip.
        assert!(flips(&curves[..1]).is_empty());
    }
}
