//! `ft plot`'s figures: a CSV of results drawn as an SVG.
//!
//! Every experiment under `experiments/` commits its raw CSV and a plot of it; this module
//! makes the plot from the CSV, so that a figure is always reproducible from the data
//! beside it (no notebook, no hand step). It reads any CSV with a header row (what `ft
//! simulate --sweep` writes, or an experiment's own tables) and draws one of:
//!
//! - `scatter` or `line`: the y column(s) against the x column, one colour per value of the
//!   series column(s) (and one line style per y column when there are several); a diagonal
//!   adds the line y = x on equal axes, for predicted against measured.
//! - `histogram` or `cdf`: the distribution of the x column per series (for regret
//!   distributions); the summary gives each series' count, mean and quantiles.
//!
//! Series are named for readers, not by their CSV columns: a column's name becomes words
//! with its unit (`sim_tok_s_total` reads "simulator total (tok/s)", or what `--label`
//! says), a numeric series value is named with its column ("streams 2"). A line series
//! that has several rows at one x (a hybrid strategy at several fetch fractions) is split
//! by the column that tells those rows apart, one line per value, rather than drawn as one
//! zig-zag. The legend goes where no data is ([`crate::legend`]); log axes are labelled at
//! every decade ([`crate::axis`]).

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;
use std::path::Path;

use ft_model::stats::nearest_rank;

use crate::axis::{self, Fit, Scale};
use crate::legend::{self, Corner, Entry, Swatch};
use crate::{PlotError, Result};

/// What a chart draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Points.
    #[default]
    Scatter,
    /// Points joined in order of x.
    Line,
    /// Counts of x in equal bins, one overlaid set of bars per series.
    Histogram,
    /// Empirical cumulative distribution of x, one step line per series.
    Cdf,
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "scatter" => Kind::Scatter,
            "line" => Kind::Line,
            "histogram" => Kind::Histogram,
            "cdf" => Kind::Cdf,
            _ => return Err(format!("'{s}': one of scatter, line, histogram, cdf")),
        })
    }
}

/// Where a chart's legend goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Legend {
    /// The first corner of the plot with no data under it, else beside the plot.
    #[default]
    Auto,
    /// Inside the plot, in this corner, whatever is under it.
    Corner(Corner),
    /// Beside the plot, on the right.
    Outside,
    /// No legend.
    None,
}

impl std::str::FromStr for Legend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "auto" => Legend::Auto,
            "upper-left" => Legend::Corner(Corner::UpperLeft),
            "upper-right" => Legend::Corner(Corner::UpperRight),
            "lower-left" => Legend::Corner(Corner::LowerLeft),
            "lower-right" => Legend::Corner(Corner::LowerRight),
            "outside" => Legend::Outside,
            "none" => Legend::None,
            _ => {
                return Err(format!(
                    "'{s}': one of auto, upper-left, upper-right, lower-left, lower-right, outside, none"
                ))
            }
        })
    }
}

/// Bins of a histogram unless said otherwise: fine enough to show a distribution's shape
/// over a few hundred values, coarse enough that bins are not mostly empty.
pub const DEFAULT_BINS: usize = 20;
/// Default figure width in pixels (fits a README column at full resolution).
pub const DEFAULT_WIDTH: u32 = 900;
/// Default figure height in pixels (a 16:10 aspect).
pub const DEFAULT_HEIGHT: u32 = 560;
/// Smallest figure side accepted, in pixels: below it the axes' labels no longer fit.
pub const MIN_SIDE: u32 = 200;
/// Largest figure side accepted, in pixels (a figure is a picture, not a canvas).
pub const MAX_SIDE: u32 = 10_000;
/// Largest number of bins accepted (more bins than this are lines, not bars).
pub const MAX_BINS: usize = 1000;
/// Radius of a scatter point, in pixels.
const POINT_RADIUS: i32 = 3;
/// Opacity of histogram bars (overlaid series stay visible through each other).
const BAR_OPACITY: f64 = 0.45;
/// Dash and gap of the second y column's line, in pixels.
const DASH: (u32, u32) = (8, 5);
/// Dot and gap of the third and later y columns' lines, in pixels.
const DOT: (u32, u32) = (2, 4);
/// Vertical distance between the numbers of successive marks, in pixels, so that marks at
/// nearby x do not print over each other.
const MARK_LABEL_STEP: i32 = 16;
/// Number of heights the marks' numbers cycle through at the top of the plot.
const MARK_STAGGER: usize = 3;
/// Margin around the chart, in pixels.
const MARGIN: u32 = 12;
/// Height of the x axis' labels and description, in pixels.
const X_LABELS: u32 = 44;
/// Width of the y axis' labels and description, in pixels.
const Y_LABELS: u32 = 70;
/// Size of the title, in pixels.
const TITLE: u32 = 20;
/// Height of the band the title is drawn in, in pixels.
const TITLE_BAND: u32 = 36;
/// Distance of a legend inside the plot from its frame, in pixels.
const LEGEND_INSET: i32 = 8;
/// Step of the densified lines the legend avoids, as a share of the plot's side.
const DENSIFY_STEP: f64 = 0.005;

/// Tableau 10: ten colours told apart by most readers, colour-blind ones included; series
/// beyond ten reuse them in order.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Colour of the `i`th series.
pub fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Colour of the diagonal (dark grey, apart from the series).
const DIAGONAL_COLOR: RGBColor = RGBColor(60, 60, 60);

/// Colours of the marks, in order: dark and apart from the palette's.
const MARK_COLORS: [RGBColor; 5] = [
    RGBColor(0, 0, 0),
    RGBColor(150, 0, 0),
    RGBColor(0, 100, 0),
    RGBColor(90, 0, 140),
    RGBColor(120, 80, 0),
];

fn bad(message: impl Into<String>) -> PlotError {
    PlotError::Input(message.into())
}

/// A CSV read into memory: the header and the rows as text.
#[derive(Debug, Clone)]
pub struct Table {
    /// Where it came from (for errors).
    origin: String,
    /// Column names.
    header: Vec<String>,
    /// Rows, each with its line number in the file (the header is line 1).
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    /// Parse CSV text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(false)
            .from_reader(text.as_bytes());
        let header: Vec<String> = reader
            .headers()
            .map_err(|e| bad(format!("{origin}: reading the header row: {e}")))?
            .iter()
            .map(|h| h.trim().to_string())
            .collect();
        if header.is_empty() || header.iter().all(|h| h.is_empty()) {
            return Err(bad(format!("{origin}: no header row (an empty file?)")));
        }
        let mut rows = Vec::new();
        for (i, record) in reader.records().enumerate() {
            let record =
                record.map_err(|e| bad(format!("{origin}: reading row {}: {e}", i + 1)))?;
            let line = record
                .position()
                .map(|p| p.line() as usize)
                .unwrap_or(i + 2);
            rows.push((line, record.iter().map(|c| c.trim().to_string()).collect()));
        }
        Ok(Table {
            origin: origin.to_string(),
            header,
            rows,
        })
    }

    /// Read a CSV file.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Index of a column; the error lists the known ones.
    fn column(&self, flag: &str, name: &str) -> Result<usize> {
        self.header.iter().position(|h| h == name).ok_or_else(|| {
            bad(format!(
                "{flag} {name}: {} has no such column; its columns are: {}",
                self.origin,
                self.header.join(", ")
            ))
        })
    }

    fn cell(&self, line: usize, col: usize, cell: &str) -> Result<Option<f64>> {
        if cell.is_empty() {
            return Ok(None);
        }
        match cell.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(v)),
            Ok(_) => Ok(None),
            Err(_) => Err(bad(format!(
                "{} line {line}, column {}: '{cell}' is not a number",
                self.origin, self.header[col]
            ))),
        }
    }
}

/// What to draw from a table: the arguments of `ft plot`, checked by [`chart`].
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// What to draw.
    pub kind: Kind,
    /// Column on the x axis (for histogram and cdf: the column whose distribution is drawn).
    pub x: String,
    /// Column(s) on the y axis (scatter and line only).
    pub y: Vec<String>,
    /// Column(s) whose values split the rows into series (one colour each).
    pub series: Vec<String>,
    /// Keep only rows where COL equals one of the values, as `COL=V1,V2` (all must hold).
    pub filters: Vec<String>,
    /// Readable names of columns, as `COL=TEXT` (the legend and default axis labels).
    pub labels: Vec<String>,
    /// Title (default: the columns drawn).
    pub title: Option<String>,
    /// Label of the x axis (default: the x column's readable name).
    pub xlabel: Option<String>,
    /// Label of the y axis (default: the y columns' readable names, or "rows" / "share of
    /// rows").
    pub ylabel: Option<String>,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis (scatter and line only).
    pub log_y: bool,
    /// Draw y = x on equal axes (scatter and line only).
    pub diagonal: bool,
    /// Start the y axis at 0 (linear y only).
    pub y_from_zero: bool,
    /// Vertical lines, as `VALUE:LABEL`.
    pub mark_x: Vec<String>,
    /// Where the legend goes.
    pub legend: Legend,
    /// Bins of a histogram.
    pub bins: usize,
    /// Width of the figure, in pixels.
    pub width: u32,
    /// Height of the figure, in pixels.
    pub height: u32,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            kind: Kind::Scatter,
            x: String::new(),
            y: Vec::new(),
            series: Vec::new(),
            filters: Vec::new(),
            labels: Vec::new(),
            title: None,
            xlabel: None,
            ylabel: None,
            log_x: false,
            log_y: false,
            diagonal: false,
            y_from_zero: false,
            mark_x: Vec::new(),
            legend: Legend::Auto,
            bins: DEFAULT_BINS,
            width: DEFAULT_WIDTH,
            height: DEFAULT_HEIGHT,
        }
    }
}

/// One `--where COL=V1,V2` filter.
#[derive(Debug, Clone, PartialEq)]
struct Filter {
    column: String,
    values: Vec<String>,
}

fn parse_filter(s: &str) -> Result<Filter> {
    let Some((col, vals)) = s.split_once('=') else {
        return Err(bad(format!("--where {s}: expected COL=VALUE or COL=V1,V2")));
    };
    let column = col.trim().to_string();
    let values: Vec<String> = vals.split(',').map(|v| v.trim().to_string()).collect();
    if column.is_empty() {
        return Err(bad(format!("--where {s}: no column before '='")));
    }
    Ok(Filter { column, values })
}

/// One vertical mark (`--mark-x VALUE:LABEL`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mark {
    /// Where the line is, in the x column's units.
    pub x: f64,
    /// Its label (the value itself when none is given).
    pub label: String,
}

fn parse_mark(s: &str) -> Result<Mark> {
    let (value, label) = match s.split_once(':') {
        Some((v, l)) => (v.trim(), l.trim().to_string()),
        None => (s.trim(), String::new()),
    };
    let x: f64 = value
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite())
        .ok_or_else(|| bad(format!("--mark-x {s}: '{value}' is not a finite number")))?;
    let label = if label.is_empty() {
        value.to_string()
    } else {
        label
    };
    Ok(Mark { x, label })
}

/// Words of column names read out, and the units pulled to the end in parentheses.
const WORDS: [(&str, &str); 12] = [
    ("sim", "simulator"),
    ("cpu", "CPU"),
    ("gpu", "GPU"),
    ("moe", "MoE"),
    ("pcie", "PCIe"),
    ("kv", "KV"),
    ("dram", "DRAM"),
    ("hbm", "HBM"),
    ("pred", "predicted"),
    ("abs", "absolute"),
    ("rel", "relative"),
    ("n", "number of"),
];

/// Unit words of column names (at their end or anywhere) and how they read.
const UNITS: [(&str, &str); 8] = [
    ("gbs", "GB/s"),
    ("pct", "%"),
    ("mb", "MB"),
    ("gb", "GB"),
    ("ms", "ms"),
    ("us", "us"),
    ("bytes", "bytes"),
    ("tokens", "tokens"),
];

/// A column's name as a reader reads it: words separated, known abbreviations spelled out,
/// the unit last in parentheses (`sim_tok_s_total` reads "simulator total (tok/s)",
/// `served_cpu_moe_gbs` "served CPU-MoE (GB/s)").
pub fn readable(column: &str) -> String {
    let words: Vec<String> = column
        .split(['_', '-', ' '])
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let mut out: Vec<String> = Vec::new();
    let mut unit: Option<&str> = None;
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        let next = words.get(i + 1).map(String::as_str);
        if w == "tok" && next == Some("s") {
            unit = unit.or(Some("tok/s"));
            i += 2;
            continue;
        }
        if w == "cpu" && next == Some("moe") {
            out.push("CPU-MoE".into());
            i += 2;
            continue;
        }
        if let Some((_, u)) = UNITS.iter().find(|(k, _)| *k == w) {
            // A unit word that is the whole name is a name.
            if words.len() > 1 {
                unit = unit.or(Some(u));
                i += 1;
                continue;
            }
        }
        match WORDS.iter().find(|(k, _)| *k == w) {
            Some((_, r)) if !(w == "n" && words.len() == 1) => out.push(r.to_string()),
            _ => out.push(w.to_string()),
        }
        i += 1;
    }
    let name = out.join(" ");
    match (unit, name.is_empty()) {
        (Some(u), true) => u.to_string(),
        (Some(u), false) => format!("{name} ({u})"),
        (None, _) => name,
    }
}

/// The points (or values) of one series.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    name: String,
    /// Palette index: one per series group (per y column when there is no series column).
    color: usize,
    /// Line and marker style: one per y column (solid with filled points, dashed with
    /// hollow points, dotted with crosses), so that a model's column drawn beside a
    /// simulation's keeps its series' colour.
    style: usize,
    /// (x, y) for scatter and line; (value, 0) for histogram and cdf.
    points: Vec<(f64, f64)>,
}

/// Quantiles and moments of one series' values (histogram and cdf).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Values.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// Largest.
    pub max: f64,
}

impl Stats {
    fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Stats {
            n,
            min: v.first().copied().unwrap_or(f64::NAN),
            mean: v.iter().sum::<f64>() / n.max(1) as f64,
            p50: nearest_rank(&v, 0.5),
            p90: nearest_rank(&v, 0.9),
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// One series as `ft plot` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesSummary {
    /// Legend name.
    pub name: String,
    /// Points (or values) drawn.
    pub points: usize,
    /// Smallest and largest x.
    pub x_range: [f64; 2],
    /// Smallest and largest y (scatter and line only).
    pub y_range: Option<[f64; 2]>,
    /// Distribution of x (histogram and cdf only).
    pub stats: Option<Stats>,
}

/// What `ft plot` reports: the figure and what is in it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The SVG written (set by the caller that writes it).
    pub out: String,
    /// What was drawn.
    pub kind: Kind,
    /// The x column.
    pub x: String,
    /// The y column(s).
    pub y: Vec<String>,
    /// Rows read.
    pub rows: usize,
    /// Rows dropped by `--where`.
    pub filtered_out: usize,
    /// Rows with an empty or non-finite cell in a plotted column (that column's point is
    /// left out; the row's other columns are drawn).
    pub skipped: usize,
    /// The column a line series with several rows at one x was split by (one line per
    /// value), if any.
    pub split_by: Option<String>,
    /// Where the legend went: a corner, "outside", or "none".
    pub legend: String,
    /// The series, in order of first appearance.
    pub series: Vec<SeriesSummary>,
    /// The vertical marks.
    pub marks: Vec<Mark>,
}

impl Summary {
    /// The summary as a table for a terminal.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "wrote {}: {:?} of {}{}, {} series ({} rows: {} dropped by --where, {} with empty cells)",
            self.out,
            self.kind,
            if self.y.is_empty() {
                String::new()
            } else {
                format!("{} against ", self.y.join(", "))
            },
            self.x,
            self.series.len(),
            self.rows,
            self.filtered_out,
            self.skipped
        );
        if let Some(c) = &self.split_by {
            let _ = writeln!(out, "line series split by {c} (several rows at one x)");
        }
        if self.series.iter().any(|r| r.stats.is_some()) {
            let _ = writeln!(
                out,
                "{:<36} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11}",
                "series", "n", "min", "mean", "p50", "p90", "max"
            );
            for r in &self.series {
                if let Some(st) = &r.stats {
                    let _ = writeln!(
                        out,
                        "{:<36} {:>6} {:>11.4} {:>11.4} {:>11.4} {:>11.4} {:>11.4}",
                        r.name, st.n, st.min, st.mean, st.p50, st.p90, st.max
                    );
                }
            }
        } else {
            let _ = writeln!(
                out,
                "{:<36} {:>6} {:>11} {:>11} {:>11} {:>11}",
                "series", "points", "x min", "x max", "y min", "y max"
            );
            for r in &self.series {
                let [ylo, yhi] = r.y_range.unwrap_or([f64::NAN; 2]);
                let _ = writeln!(
                    out,
                    "{:<36} {:>6} {:>11.4} {:>11.4} {:>11.4} {:>11.4}",
                    r.name, r.points, r.x_range[0], r.x_range[1], ylo, yhi
                );
            }
        }
        for m in &self.marks {
            let _ = writeln!(out, "mark at x = {}: {}", m.x, m.label);
        }
        out
    }
}

/// A validated plan: everything checked before drawing.
#[derive(Debug, Clone)]
struct Plan {
    kind: Kind,
    series: Vec<Series>,
    marks: Vec<Mark>,
    title: String,
    xlabel: String,
    ylabel: String,
    log_x: bool,
    log_y: bool,
    diagonal: bool,
    y_from_zero: bool,
    legend: Legend,
    show_legend: bool,
    bins: usize,
    size: (u32, u32),
}

/// A row kept for drawing: its line, its series key and its x.
struct Kept<'t> {
    line: usize,
    row: &'t [String],
    key: Vec<String>,
    x: f64,
}

/// A series value as a reader reads it: a number with its column's name ("streams 2"),
/// anything else as it is.
fn value_name(column: &str, value: &str) -> String {
    if value.parse::<f64>().is_ok() {
        format!("{column} {value}")
    } else {
        value.to_string()
    }
}

/// The column (not among `skip`) that tells apart the rows of each series having several
/// rows at one x, with the fewest distinct values; `None` when no series has such rows,
/// `Some(None)` when no column tells them apart.
fn split_column(kept: &[Kept<'_>], ncols: usize, skip: &[usize]) -> Option<Option<usize>> {
    let dup = |extra: Option<usize>| {
        let mut seen = std::collections::HashSet::new();
        kept.iter().any(|k| {
            let e = extra.map(|c| k.row[c].as_str()).unwrap_or("");
            !seen.insert((k.key.clone(), k.x.to_bits(), e.to_string()))
        })
    };
    if !dup(None) {
        return None;
    }
    let best = (0..ncols)
        .filter(|c| !skip.contains(c))
        .filter(|&c| !dup(Some(c)))
        .min_by_key(|&c| {
            kept.iter()
                .map(|k| k.row[c].as_str())
                .collect::<std::collections::HashSet<_>>()
                .len()
        });
    Some(best)
}

/// Check the spec against the table and gather the series.
fn plan(spec: &Spec, table: &Table) -> Result<(Plan, Summary)> {
    let distribution = matches!(spec.kind, Kind::Histogram | Kind::Cdf);
    if distribution && !spec.y.is_empty() {
        return Err(bad(format!(
            "--y: a {:?} draws the distribution of --x alone; leave --y out",
            spec.kind
        )));
    }
    if !distribution && spec.y.is_empty() {
        return Err(bad(format!(
            "--y: a {:?} plot needs at least one y column",
            spec.kind
        )));
    }
    if distribution && (spec.diagonal || spec.log_y || spec.y_from_zero) {
        return Err(bad(
            "--diagonal, --log-y and --y-from-zero apply to scatter and line plots only",
        ));
    }
    if spec.y_from_zero && spec.log_y {
        return Err(bad("--y-from-zero: a logarithmic y axis has no 0"));
    }
    if spec.diagonal && spec.log_x != spec.log_y {
        return Err(bad("--diagonal needs both axes on the same scale (give both --log-x and --log-y, or neither)"));
    }
    if spec.kind == Kind::Histogram && !(1..=MAX_BINS).contains(&spec.bins) {
        return Err(bad(format!(
            "--bins {}: must be between 1 and {MAX_BINS}",
            spec.bins
        )));
    }
    let sides = MIN_SIDE..=MAX_SIDE;
    if !sides.contains(&spec.width) || !sides.contains(&spec.height) {
        return Err(bad(format!(
            "--width {} --height {}: each must be between {MIN_SIDE} and {MAX_SIDE} pixels",
            spec.width, spec.height
        )));
    }
    let xcol = table.column("--x", &spec.x)?;
    let ycols: Vec<usize> = spec
        .y
        .iter()
        .map(|y| table.column("--y", y))
        .collect::<Result<_>>()?;
    let scols: Vec<usize> = spec
        .series
        .iter()
        .map(|s| table.column("--series", s))
        .collect::<Result<_>>()?;
    let filters: Vec<(usize, Filter)> = spec
        .filters
        .iter()
        .map(|f| {
            let f = parse_filter(f)?;
            Ok((table.column("--where", &f.column)?, f))
        })
        .collect::<Result<_>>()?;
    let mut names: Vec<(String, String)> = Vec::new();
    for l in &spec.labels {
        let Some((col, text)) = l.split_once('=') else {
            return Err(bad(format!("--label {l}: expected COL=TEXT")));
        };
        table.column("--label", col.trim())?;
        names.push((col.trim().to_string(), text.trim().to_string()));
    }
    let name_of = |col: &str| {
        names
            .iter()
            .find(|(c, _)| c == col)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| readable(col))
    };
    let marks: Vec<Mark> = spec
        .mark_x
        .iter()
        .map(|m| parse_mark(m))
        .collect::<Result<_>>()?;

    // Rows kept, with their series key and x.
    let (mut filtered_out, mut skipped) = (0, 0);
    let mut kept: Vec<Kept<'_>> = Vec::new();
    for (line, row) in &table.rows {
        if !filters.iter().all(|(c, f)| f.values.contains(&row[*c])) {
            filtered_out += 1;
            continue;
        }
        let Some(x) = table.cell(*line, xcol, &row[xcol])? else {
            skipped += 1;
            continue;
        };
        if spec.log_x && x <= 0.0 {
            return Err(bad(format!(
                "--log-x: {} line {line} has {} = {x}; a logarithmic axis needs positive values",
                table.origin, spec.x
            )));
        }
        kept.push(Kept {
            line: *line,
            row,
            key: scols.iter().map(|&c| row[c].clone()).collect(),
            x,
        });
    }
    // A line series with several rows at one x is split by the column telling them apart.
    let mut key_cols: Vec<usize> = scols.clone();
    let mut split_by = None;
    if spec.kind == Kind::Line {
        let skip: Vec<usize> = [xcol].iter().chain(&ycols).chain(&scols).copied().collect();
        match split_column(&kept, table.header.len(), &skip) {
            Some(Some(c)) => {
                for k in &mut kept {
                    k.key.push(k.row[c].clone());
                }
                key_cols.push(c);
                split_by = Some(table.header[c].clone());
            }
            Some(None) => {
                return Err(bad(format!(
                    "{}: a line series has several rows at one x and no column tells them apart; \
                     name the column(s) that do with --series, or draw a scatter",
                    table.origin
                )))
            }
            None => {}
        }
    }
    let group_name = |key: &[String]| -> Option<String> {
        (!key.is_empty()).then(|| {
            key.iter()
                .zip(&key_cols)
                .map(|(v, &c)| value_name(&name_of(&table.header[c]), v))
                .collect::<Vec<_>>()
                .join(", ")
        })
    };

    let mut series: Vec<Series> = Vec::new();
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut push = |name: String, group: &[String], style: usize, p: (f64, f64)| {
        let color = match groups.iter().position(|g| g == group) {
            Some(i) => i,
            None => {
                groups.push(group.to_vec());
                groups.len() - 1
            }
        };
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push(p),
            None => series.push(Series {
                name,
                color,
                style,
                points: vec![p],
            }),
        }
    };
    for k in &kept {
        let group = group_name(&k.key);
        if distribution {
            let name = group.unwrap_or_else(|| name_of(&spec.x));
            push(name, &k.key, 0, (k.x, 0.0));
            continue;
        }
        // Each y column on its own: an empty cell drops that point only (a model's column
        // may reach further than a simulation's), and the row counts as skipped.
        let mut ys = Vec::with_capacity(ycols.len());
        for &c in &ycols {
            ys.push(table.cell(k.line, c, &k.row[c])?);
        }
        if ys.iter().any(Option::is_none) {
            skipped += 1;
        }
        for (i, y) in ys.into_iter().enumerate() {
            let Some(y) = y else { continue };
            if spec.log_y && y <= 0.0 {
                return Err(bad(format!(
                    "--log-y: {} line {} has {} = {y}; a logarithmic axis needs positive values",
                    table.origin, k.line, spec.y[i]
                )));
            }
            let yname = name_of(&spec.y[i]);
            let (name, color_key, style) = match (&group, ycols.len()) {
                (Some(g), 1) => (g.clone(), k.key.clone(), 0),
                (Some(g), _) => (format!("{g}, {yname}"), k.key.clone(), i),
                (None, _) => (yname, vec![spec.y[i].clone()], 0),
            };
            push(name, &color_key, style, (k.x, y));
        }
    }
    if series.is_empty() {
        return Err(bad(format!(
            "{}: nothing to plot ({} rows, {filtered_out} dropped by --where, {skipped} with empty cells)",
            table.origin,
            table.rows.len()
        )));
    }
    if spec.log_x {
        if let Some(m) = marks.iter().find(|m| m.x <= 0.0) {
            return Err(bad(format!(
                "--mark-x {}: a logarithmic x axis needs a positive value",
                m.x
            )));
        }
    }
    if spec.kind == Kind::Line {
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
    }
    let summaries = series
        .iter()
        .map(|s| {
            let xs: Vec<f64> = s.points.iter().map(|p| p.0).collect();
            let ys: Vec<f64> = s.points.iter().map(|p| p.1).collect();
            SeriesSummary {
                name: s.name.clone(),
                points: s.points.len(),
                x_range: min_max(&xs),
                y_range: (!distribution).then(|| min_max(&ys)),
                stats: distribution.then(|| Stats::of(&xs)),
            }
        })
        .collect();
    let default_y = match spec.kind {
        Kind::Histogram => "rows".to_string(),
        Kind::Cdf => "share of rows at or below".to_string(),
        _ => spec
            .y
            .iter()
            .map(|y| name_of(y))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let xlabel = spec.xlabel.clone().unwrap_or_else(|| name_of(&spec.x));
    let title = spec.title.clone().unwrap_or_else(|| match spec.kind {
        Kind::Histogram | Kind::Cdf => format!("distribution of {xlabel}"),
        _ => format!("{default_y} against {xlabel}"),
    });
    let named = series.iter().any(|s| s.name != xlabel);
    let show_legend = series.len() > 1 || spec.diagonal || !marks.is_empty() || named;
    let plan = Plan {
        kind: spec.kind,
        series,
        marks: marks.clone(),
        title,
        xlabel,
        ylabel: spec.ylabel.clone().unwrap_or(default_y),
        log_x: spec.log_x,
        log_y: spec.log_y,
        diagonal: spec.diagonal,
        y_from_zero: spec.y_from_zero,
        legend: spec.legend,
        show_legend,
        bins: spec.bins,
        size: (spec.width, spec.height),
    };
    let summary = Summary {
        out: String::new(),
        kind: spec.kind,
        x: spec.x.clone(),
        y: spec.y.clone(),
        rows: table.rows.len(),
        filtered_out,
        skipped,
        split_by,
        legend: String::new(),
        series: summaries,
        marks,
    };
    Ok((plan, summary))
}

fn min_max(v: &[f64]) -> [f64; 2] {
    v.iter()
        .fold([f64::INFINITY, f64::NEG_INFINITY], |[lo, hi], &x| {
            [lo.min(x), hi.max(x)]
        })
}

/// The bin of `value` among `bins` equal bins over `[lo, hi]` (the last bin is closed on
/// the right), in the transformed space when `log`.
pub fn bin_of(value: f64, lo: f64, hi: f64, bins: usize, log: bool) -> usize {
    let t = |v: f64| if log { v.log10() } else { v };
    let (a, b) = (t(lo), t(hi));
    if b - a <= 0.0 {
        return 0;
    }
    let i = ((t(value) - a) / (b - a) * bins as f64).floor();
    (i.max(0.0) as usize).min(bins - 1)
}

/// Bin edges and per-series counts of a histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `bins + 1` edges, increasing, in the x column's units.
    pub edges: Vec<f64>,
    /// Counts per series, each `bins` long.
    pub counts: Vec<Vec<usize>>,
}

/// Count each series' values into `bins` equal bins spanning all of them.
pub fn histogram(values: &[Vec<f64>], bins: usize, log: bool) -> Histogram {
    let all: Vec<f64> = values.iter().flatten().copied().collect();
    let [mut lo, mut hi] = min_max(&all);
    if hi - lo <= f64::EPSILON * lo.abs().max(1.0) {
        (lo, hi) = if log {
            (lo / 2.0, hi * 2.0)
        } else {
            (lo - 0.5, hi + 0.5)
        };
    }
    let edges = (0..=bins)
        .map(|i| {
            let f = i as f64 / bins as f64;
            if log {
                10f64.powf(lo.log10() + f * (hi.log10() - lo.log10()))
            } else {
                lo + f * (hi - lo)
            }
        })
        .collect();
    let counts = values
        .iter()
        .map(|vs| {
            let mut c = vec![0; bins];
            for &v in vs {
                c[bin_of(v, lo, hi, bins, log)] += 1;
            }
            c
        })
        .collect();
    Histogram { edges, counts }
}

/// The step points of an empirical CDF: for sorted values `v_1..v_n`, the line rises from
/// `(i-1)/n` to `i/n` at `v_i`.
pub fn cdf_steps(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mut out = Vec::with_capacity(2 * v.len());
    for (i, &x) in v.iter().enumerate() {
        out.push((x, i as f64 / n));
        out.push((x, (i + 1) as f64 / n));
    }
    out
}

/// Map a plotters error into this crate's.
fn draw_err<E: std::fmt::Debug>(title: &str) -> impl Fn(E) -> PlotError + '_ {
    move |e| PlotError::Draw {
        figure: title.to_string(),
        message: format!("{e:?}"),
    }
}

/// The axis ranges of a plan.
struct Ranges {
    x: (f64, f64),
    y: (f64, f64),
    hist: Option<Histogram>,
}

fn ranges(plan: &Plan) -> Ranges {
    let xs = || {
        plan.series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(plan.marks.iter().map(|m| m.x))
    };
    let ys = || {
        plan.series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
    };
    let (xs_scale, ys_scale) = (Scale::of(plan.log_x), Scale::of(plan.log_y));
    match plan.kind {
        Kind::Histogram => {
            let values: Vec<Vec<f64>> = plan
                .series
                .iter()
                .map(|s| s.points.iter().map(|p| p.0).collect())
                .collect();
            let h = histogram(&values, plan.bins, plan.log_x);
            let edges = [h.edges[0], h.edges[plan.bins]];
            let top = h.counts.iter().flatten().copied().max().unwrap_or(1).max(1) as f64;
            Ranges {
                x: axis::range(xs().chain(edges), xs_scale, Fit::PADDED),
                y: axis::range([0.0, top], Scale::Linear, Fit::FROM_ZERO),
                hist: Some(h),
            }
        }
        Kind::Cdf => Ranges {
            x: axis::range(xs(), xs_scale, Fit::PADDED),
            y: axis::range([0.0, 1.0], Scale::Linear, Fit::FROM_ZERO),
            hist: None,
        },
        Kind::Scatter | Kind::Line => {
            let yfit = if plan.y_from_zero {
                Fit::FROM_ZERO
            } else {
                Fit::PADDED
            };
            if plan.diagonal {
                let r = axis::range(xs().chain(ys()), xs_scale, Fit::PADDED);
                Ranges {
                    x: r,
                    y: r,
                    hist: None,
                }
            } else {
                Ranges {
                    x: axis::range(xs(), xs_scale, Fit::PADDED),
                    y: axis::range(ys(), ys_scale, yfit),
                    hist: None,
                }
            }
        }
    }
}

/// A value's place along an axis over `range`, 0 at its start and 1 at its end.
fn unit(v: f64, (lo, hi): (f64, f64), log: bool) -> f64 {
    if log {
        (v.log10() - lo.log10()) / (hi.log10() - lo.log10())
    } else {
        (v - lo) / (hi - lo)
    }
}

/// Everything the plan draws, in the plot's unit square: points, lines densified, bars
/// filled, marks and the diagonal (what a legend must not cover).
fn drawn_points(plan: &Plan, r: &Ranges) -> Vec<(f64, f64)> {
    let u = |(x, y): (f64, f64)| (unit(x, r.x, plan.log_x), unit(y, r.y, plan.log_y));
    let mut out = Vec::new();
    for (i, s) in plan.series.iter().enumerate() {
        match plan.kind {
            Kind::Scatter => out.extend(s.points.iter().map(|&p| u(p))),
            Kind::Line => {
                let line: Vec<_> = s.points.iter().map(|&p| u(p)).collect();
                out.extend(legend::densify(&line, DENSIFY_STEP));
            }
            Kind::Cdf => {
                let values: Vec<f64> = s.points.iter().map(|p| p.0).collect();
                let line: Vec<_> = cdf_steps(&values).into_iter().map(u).collect();
                out.extend(legend::densify(&line, DENSIFY_STEP));
            }
            Kind::Histogram => {
                let Some(h) = &r.hist else { continue };
                for (b, &n) in h.counts[i].iter().enumerate().filter(|(_, &n)| n > 0) {
                    let (x0, x1) = (u((h.edges[b], 0.0)).0, u((h.edges[b + 1], 0.0)).0);
                    let top = u((h.edges[b], n as f64)).1;
                    let outline = [(x0, 0.0), (x0, top), (x1, top), (x1, 0.0)];
                    out.extend(legend::densify(&outline, DENSIFY_STEP));
                    // Inside of the bar, sampled.
                    let steps = ((x1 - x0) / 0.02).ceil().max(1.0) as usize;
                    for k in 0..=steps {
                        let x = x0 + (x1 - x0) * k as f64 / steps as f64;
                        out.extend(legend::densify(&[(x, 0.0), (x, top)], 0.02));
                    }
                }
            }
        }
    }
    for m in &plan.marks {
        let x = unit(m.x, r.x, plan.log_x);
        out.extend(legend::densify(&[(x, 0.0), (x, 1.0)], DENSIFY_STEP));
    }
    if plan.diagonal {
        out.extend(legend::densify(&[(0.0, 0.0), (1.0, 1.0)], DENSIFY_STEP));
    }
    out
}

/// The legend's entries of a plan.
fn entries(plan: &Plan) -> Vec<Entry> {
    let mut v: Vec<Entry> = plan
        .series
        .iter()
        .map(|s| Entry {
            label: s.name.clone(),
            color: color(s.color),
            swatch: match (plan.kind, s.style) {
                (Kind::Line, 0) => Swatch::LinePoint,
                (Kind::Line, 1) => Swatch::DashedRing,
                (Kind::Line, _) => Swatch::DottedCross,
                (Kind::Scatter, 0) => Swatch::Point,
                (Kind::Scatter, 1) => Swatch::Ring,
                (Kind::Scatter, _) => Swatch::Cross,
                (Kind::Cdf, _) => Swatch::Line,
                (Kind::Histogram, _) => Swatch::Block,
            },
        })
        .collect();
    if plan.diagonal {
        v.push(Entry {
            label: "y = x".into(),
            color: DIAGONAL_COLOR,
            swatch: Swatch::Line,
        });
    }
    for (k, m) in plan.marks.iter().enumerate() {
        v.push(Entry {
            label: format!("[{}] {}", k + 1, m.label),
            color: MARK_COLORS[k % MARK_COLORS.len()],
            swatch: Swatch::DashedTick,
        });
    }
    v
}

/// Where the legend of a plan goes, given its ranges.
fn placement(plan: &Plan, r: &Ranges, legend_px: (i32, i32)) -> Legend {
    if !plan.show_legend {
        return Legend::None;
    }
    match plan.legend {
        Legend::Auto => {
            // The plot's size in pixels, less the title, margins and axis labels.
            let (w, h) = plan.size;
            let pw = w.saturating_sub(2 * MARGIN + Y_LABELS).max(1) as f64;
            let ph = h.saturating_sub(2 * MARGIN + X_LABELS + TITLE_BAND).max(1) as f64;
            let size = (
                (legend_px.0 + LEGEND_INSET) as f64 / pw,
                (legend_px.1 + LEGEND_INSET) as f64 / ph,
            );
            match legend::free_corner(&drawn_points(plan, r), size) {
                Some(c) => Legend::Corner(c),
                None => Legend::Outside,
            }
        }
        other => other,
    }
}

fn legend_name(l: Legend) -> String {
    match l {
        Legend::Auto => "auto".into(),
        Legend::Corner(c) => match c {
            Corner::UpperLeft => "upper-left",
            Corner::UpperRight => "upper-right",
            Corner::LowerLeft => "lower-left",
            Corner::LowerRight => "lower-right",
        }
        .into(),
        Legend::Outside => "outside".into(),
        Legend::None => "none".into(),
    }
}

/// An area of an SVG figure.
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Colour of the light grid lines between labelled ticks.
const LIGHT_LINE: RGBColor = RGBColor(235, 235, 235);

/// An SVG document of `size` pixels (width, height): a white canvas that `draw` draws on,
/// then written out; what `draw` returns comes back beside the document. Every figure of
/// this crate (`ft plot`'s charts, a decision's picture) is made here. Errors name
/// `figure`.
pub(crate) fn svg<T>(
    size: (u32, u32),
    figure: &str,
    draw: impl FnOnce(&Area<'_>) -> Result<T>,
) -> Result<(String, T)> {
    let err = draw_err::<DrawingAreaErrorKind<std::io::Error>>(figure);
    let mut svg = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let drawn = draw(&root)?;
        root.present().map_err(&err)?;
        drawn
    };
    Ok((svg, drawn))
}

/// One axis of a [`Frame`]: its description (with its unit) and how its labels read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameAxis<'a> {
    /// The description under (x) or beside (y) the axis.
    pub desc: &'a str,
    /// The axis' range, which the labels' decimals follow ([`axis::label`]).
    pub range: (f64, f64),
    /// Linear or logarithmic.
    pub scale: Scale,
}

/// How a chart sits in its area and what its axes say: the one setup of a chart (margins,
/// caption, label areas, mesh) that `ft plot`'s charts and a decision's bars and panels
/// share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame<'a> {
    /// A caption over the chart (15 px), if any.
    pub caption: Option<&'a str>,
    /// Margin on every side, in pixels.
    pub margin: u32,
    /// Margin above (room for a legend row under the caption), in pixels.
    pub margin_top: u32,
    /// Height of the x axis' labels and description, in pixels.
    pub x_labels: u32,
    /// Width of the y axis' labels and description, in pixels.
    pub y_labels: u32,
    /// The x axis.
    pub x: FrameAxis<'a>,
    /// The y axis; `None`: no y labels and no horizontal grid lines (a bar chart whose
    /// rows are named by the caller).
    pub y: Option<FrameAxis<'a>>,
}

/// A chart drawn on an SVG area, over the coordinates `X` and `Y`.
pub(crate) type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;

/// A chart on `area` as `f` sets it up, over the coordinates `x` and `y`, its mesh drawn:
/// labels by [`axis::label`] (log axes at their key points), light grid lines.
pub(crate) fn frame<'a, X, Y>(
    area: &Area<'a>,
    f: &Frame<'_>,
    x: X,
    y: Y,
) -> std::result::Result<Chart<'a, X::CoordDescType, Y::CoordDescType>, String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(f.margin)
        .margin_top(f.margin_top)
        .x_label_area_size(f.x_labels)
        .y_label_area_size(f.y_labels);
    if let Some(c) = f.caption {
        builder.caption(c, ("sans-serif", 15));
    }
    let mut chart = builder
        .build_cartesian_2d(x, y)
        .map_err(|e| e.to_string())?;
    let x_label = |v: &f64| axis::label(*v, f.x.range, f.x.scale);
    let y_label = |v: &f64| {
        f.y.map_or_else(String::new, |a| axis::label(*v, a.range, a.scale))
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(f.x.desc)
        .x_label_formatter(&x_label)
        .max_light_lines(axis::LIGHT_LINES)
        .light_line_style(LIGHT_LINE);
    match &f.y {
        Some(a) => mesh.y_desc(a.desc).y_label_formatter(&y_label),
        None => mesh.disable_y_mesh().y_labels(0),
    };
    mesh.draw().map_err(|e| e.to_string())?;
    Ok(chart)
}

/// Height of a legend drawn in rows under the chart, `width` pixels wide.
fn outside_height(entries: &[Entry], width: i32) -> i32 {
    legend::row_lines(entries, width) as i32 * legend::ROW_HEIGHT + 12
}

/// Draw `plan` into an SVG string; returns it and where the legend went.
fn render(plan: &Plan) -> Result<(String, Legend)> {
    let r = ranges(plan);
    let entries = entries(plan);
    let legend_px = legend::column_size(&entries);
    let place = placement(plan, &r, legend_px);
    let err = draw_err::<DrawingAreaErrorKind<std::io::Error>>(&plan.title);
    let (svg, ()) = svg(plan.size, &plan.title, |root| {
        // The title over the whole width; below it the chart, and an outside legend in
        // rows under the chart (beside it, long series names would squeeze the plot).
        let (title_area, body) = root.split_vertically(TITLE_BAND);
        title_area
            .draw(&Text::new(
                plan.title.clone(),
                (plan.size.0 as i32 / 2, TITLE_BAND as i32 / 2 + 2),
                ("sans-serif", TITLE)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Center)),
            ))
            .map_err(&err)?;
        let rows_width = plan.size.0 as i32 - 2 * MARGIN as i32 - Y_LABELS as i32;
        let (chart_area, below) = if place == Legend::Outside {
            let h = outside_height(&entries, rows_width);
            let (a, b) = body.split_vertically(body.dim_in_pixel().1 as i32 - h);
            (a, Some(b))
        } else {
            (body.clone(), None)
        };
        let key = |(lo, hi): (f64, f64)| axis::log_ticks(lo, hi, axis::MAX_LOG_TICKS);
        let (x, y) = (r.x.0..r.x.1, r.y.0..r.y.1);
        let corners = match (plan.log_x, plan.log_y) {
            (false, false) => draw(&chart_area, plan, &r, x, y)?,
            (true, false) => draw(
                &chart_area,
                plan,
                &r,
                x.log_scale().with_key_points(key(r.x)),
                y,
            )?,
            (false, true) => draw(
                &chart_area,
                plan,
                &r,
                x,
                y.log_scale().with_key_points(key(r.y)),
            )?,
            (true, true) => draw(
                &chart_area,
                plan,
                &r,
                x.log_scale().with_key_points(key(r.x)),
                y.log_scale().with_key_points(key(r.y)),
            )?,
        };
        match (place, below) {
            (Legend::Corner(c), _) => {
                let (x0, y0) = corners.0;
                let plot = (corners.1 .0 - x0, corners.1 .1 - y0);
                let (lx, ly) = c.origin(plot, legend_px, LEGEND_INSET);
                legend::draw_column(root, &entries, (x0 + lx, y0 + ly)).map_err(&err)?;
            }
            (Legend::Outside, Some(below)) => {
                let (_, by) = below.get_base_pixel();
                let at = (corners.0 .0, by + legend::ROW_HEIGHT / 2 + 4);
                legend::draw_rows(root, &entries, at, rows_width).map_err(&err)?;
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok((svg, place))
}

/// Draw the axes, series, diagonal and marks; returns the plotting area's corners in the
/// root's pixels (top left, bottom right).
fn draw<X, Y>(
    root: &Area<'_>,
    plan: &Plan,
    r: &Ranges,
    x: X,
    y: Y,
) -> Result<((i32, i32), (i32, i32))>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let e = draw_err(&plan.title);
    let f = Frame {
        caption: None,
        margin: MARGIN,
        margin_top: MARGIN,
        x_labels: X_LABELS,
        y_labels: Y_LABELS,
        x: FrameAxis {
            desc: &plan.xlabel,
            range: r.x,
            scale: Scale::of(plan.log_x),
        },
        y: Some(FrameAxis {
            desc: &plan.ylabel,
            range: r.y,
            scale: Scale::of(plan.log_y),
        }),
    };
    let mut chart = frame(root, &f, x, y).map_err(|message| PlotError::Draw {
        figure: plan.title.clone(),
        message,
    })?;

    for (i, s) in plan.series.iter().enumerate() {
        let c = color(s.color);
        let style = s.style;
        match plan.kind {
            Kind::Scatter | Kind::Line => {
                if plan.kind == Kind::Line {
                    let pts = s.points.iter().copied();
                    let line = c.stroke_width(2);
                    match style {
                        0 => chart.draw_series(LineSeries::new(pts, line)).map(|_| ()),
                        1 => chart
                            .draw_series(DashedLineSeries::new(pts, DASH.0, DASH.1, line))
                            .map(|_| ()),
                        _ => chart
                            .draw_series(DashedLineSeries::new(pts, DOT.0, DOT.1, line))
                            .map(|_| ()),
                    }
                    .map_err(&e)?;
                }
                let pts = s.points.iter();
                match style {
                    0 => chart
                        .draw_series(pts.map(|&p| Circle::new(p, POINT_RADIUS, c.filled())))
                        .map(|_| ()),
                    1 => chart
                        .draw_series(
                            pts.map(|&p| Circle::new(p, POINT_RADIUS + 1, c.stroke_width(2))),
                        )
                        .map(|_| ()),
                    _ => chart
                        .draw_series(
                            pts.map(|&p| Cross::new(p, POINT_RADIUS + 1, c.stroke_width(2))),
                        )
                        .map(|_| ()),
                }
                .map_err(&e)?;
            }
            Kind::Cdf => {
                let values: Vec<f64> = s.points.iter().map(|p| p.0).collect();
                chart
                    .draw_series(LineSeries::new(cdf_steps(&values), c.stroke_width(2)))
                    .map_err(&e)?;
            }
            Kind::Histogram => {
                let Some(h) = &r.hist else { continue };
                let bars = h.counts[i]
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(b, &n)| {
                        Rectangle::new(
                            [(h.edges[b], 0.0), (h.edges[b + 1], n as f64)],
                            c.mix(BAR_OPACITY).filled(),
                        )
                    });
                chart.draw_series(bars).map_err(&e)?;
            }
        }
    }
    if plan.diagonal {
        let (lo, hi) = (r.x.0.max(r.y.0), r.x.1.min(r.y.1));
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(lo, lo), (hi, hi)],
                DIAGONAL_COLOR.stroke_width(1),
            )))
            .map_err(&e)?;
    }
    for (k, m) in plan.marks.iter().enumerate() {
        // Each mark: a dashed vertical line in its own dark colour, its number at the top
        // (staggered so that marks at nearby x stay readable), its label in the legend.
        let c = MARK_COLORS[k % MARK_COLORS.len()];
        chart
            .draw_series(DashedLineSeries::new(
                vec![(m.x, r.y.0), (m.x, r.y.1)],
                DASH.0,
                DASH.1,
                c.stroke_width(2),
            ))
            .map_err(&e)?;
        let top = chart.backend_coord(&(m.x, r.y.1));
        let (bx, by) = root.get_base_pixel();
        let stagger = MARK_LABEL_STEP * (k % MARK_STAGGER) as i32;
        root.draw(&Text::new(
            format!("[{}]", k + 1),
            (top.0 - bx + 3, top.1 - by + 3 + stagger),
            ("sans-serif", 12).into_font().color(&c),
        ))
        .map_err(&e)?;
    }
    let (px, py) = chart.plotting_area().get_pixel_range();
    Ok(((px.start, py.start), (px.end, py.end)))
}

/// Check `spec` against `table` and draw it: the SVG document and the summary (its `out`
/// left for the caller that writes the file).
pub fn chart(spec: &Spec, table: &Table) -> Result<(String, Summary)> {
    let (plan, mut summary) = plan(spec, table)?;
    let (svg, place) = render(&plan)?;
    summary.legend = legend_name(place);
    Ok((svg, summary))
}

#[cfg(test)]
mod tests;
