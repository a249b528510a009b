//! `ft plot`: turn a CSV of results into an SVG figure.
//!
//! Every experiment under `experiments/` commits its raw CSV and a plot of it; this command
//! makes the plot from the CSV, so that a figure is always reproducible from the data beside
//! it (no notebook, no hand step). It reads any CSV with a header row (what `ft simulate
//! --sweep` writes, or an experiment's own tables) and draws one of:
//!
//! - `scatter` or `line`: `--y` (one or more columns) against `--x`, one colour per value of
//!   `--series` (and per `--y` column when there are several); `--diagonal` adds the line
//!   y = x on equal axes, for predicted against measured.
//! - `histogram` or `cdf`: the distribution of `--x` per series (for regret distributions);
//!   the summary printed on stdout gives each series' count, mean and quantiles.
//!
//! `--where COL=V1,V2` keeps only the rows whose column takes one of the values, `--mark-x
//! VALUE:LABEL` draws a labelled vertical line (an optimum, a rule's choice, a threshold),
//! `--log-x`/`--log-y` use logarithmic axes. An empty cell leaves out that column's point (and
//! is counted); a cell that is not a number is an error naming its line and column.

use anyhow::{bail, Context, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `ft plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The CSV file to read (a header row, then one row per record).
    pub input: PathBuf,
    /// The SVG file to write.
    #[arg(short, long)]
    pub out: PathBuf,
    /// What to draw: scatter, line, histogram or cdf.
    #[arg(long, value_enum, default_value_t = Kind::Scatter)]
    pub kind: Kind,
    /// Column on the x axis (for histogram and cdf: the column whose distribution is drawn).
    #[arg(long)]
    pub x: String,
    /// Column(s) on the y axis, comma separated (scatter and line only).
    #[arg(long, value_delimiter = ',')]
    pub y: Vec<String>,
    /// Column whose values split the rows into series (one colour each).
    #[arg(long)]
    pub series: Option<String>,
    /// Keep only rows where COL equals one of the comma-separated values (repeatable; all
    /// must hold).
    #[arg(long = "where", value_name = "COL=V1,V2")]
    pub filters: Vec<String>,
    /// Title above the plot (default: the columns drawn).
    #[arg(long)]
    pub title: Option<String>,
    /// Label of the x axis (default: the x column).
    #[arg(long)]
    pub xlabel: Option<String>,
    /// Label of the y axis (default: the y column(s), or "rows" / "share of rows").
    #[arg(long)]
    pub ylabel: Option<String>,
    /// Logarithmic x axis (every x must be positive).
    #[arg(long)]
    pub log_x: bool,
    /// Logarithmic y axis (every y must be positive; scatter and line only).
    #[arg(long)]
    pub log_y: bool,
    /// Draw y = x on equal axes (predicted against measured; scatter and line only).
    #[arg(long)]
    pub diagonal: bool,
    /// Start the y axis at 0 (so that a small difference looks small; linear y only).
    #[arg(long)]
    pub y_from_zero: bool,
    /// A vertical line at x = VALUE with a label, as VALUE:LABEL (repeatable).
    #[arg(long = "mark-x", value_name = "VALUE:LABEL")]
    pub mark_x: Vec<String>,
    /// Where the legend goes: upper-left, upper-right, lower-left, lower-right or none.
    #[arg(long, value_enum, default_value_t = Legend::UpperLeft)]
    pub legend: Legend,
    /// Bins of a histogram.
    #[arg(long, default_value_t = DEFAULT_BINS)]
    pub bins: usize,
    /// Width of the figure, in pixels.
    #[arg(long, default_value_t = DEFAULT_WIDTH)]
    pub width: u32,
    /// Height of the figure, in pixels.
    #[arg(long, default_value_t = DEFAULT_HEIGHT)]
    pub height: u32,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// What `ft plot` draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Points.
    Scatter,
    /// Points joined in order of x.
    Line,
    /// Counts of x in equal bins, one overlaid set of bars per series.
    Histogram,
    /// Empirical cumulative distribution of x, one step line per series.
    Cdf,
}

/// Where `ft plot` puts the legend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Legend {
    /// Inside the plot, top left.
    UpperLeft,
    /// Inside the plot, top right.
    UpperRight,
    /// Inside the plot, bottom left.
    LowerLeft,
    /// Inside the plot, bottom right.
    LowerRight,
    /// No legend.
    None,
}

/// Bins of a histogram unless `--bins` says otherwise: fine enough to show a distribution's
/// shape over a few hundred values, coarse enough that bins are not mostly empty.
pub const DEFAULT_BINS: usize = 20;
/// Default figure width in pixels (fits a README column at full resolution).
pub const DEFAULT_WIDTH: u32 = 900;
/// Default figure height in pixels (a 16:10 aspect).
pub const DEFAULT_HEIGHT: u32 = 560;
/// Smallest figure side accepted, in pixels: below it the axes' labels no longer fit.
pub const MIN_SIDE: u32 = 200;
/// Largest number of bins accepted (more bins than this are lines, not bars).
pub const MAX_BINS: usize = 1000;
/// Share of the data range added on each side of an axis, so points do not sit on it.
pub const AXIS_PAD: f64 = 0.05;
/// Radius of a scatter point, in pixels.
pub const POINT_RADIUS: i32 = 3;
/// Opacity of histogram bars (overlaid series stay visible through each other).
pub const BAR_OPACITY: f64 = 0.45;
/// Dash and gap of the second y column's line, in pixels.
const DASH: u32 = 8;
/// See [`DASH`].
const DASH_GAP: u32 = 5;
/// Dot and gap of the third and later y columns' lines, in pixels.
const DOT: u32 = 2;
/// See [`DOT`].
const DOT_GAP: u32 = 4;
/// Vertical distance between the numbers of successive `--mark-x` lines, in pixels, so that
/// marks at nearby x do not print over each other.
pub const MARK_LABEL_STEP: i32 = 16;

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
fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Colour of the diagonal (dark grey, apart from the series).
const MARK_COLOR: RGBColor = RGBColor(60, 60, 60);

/// Colours of the `--mark-x` lines, in order: dark and apart from the palette's.
const MARK_COLORS: [RGBColor; 5] = [
    RGBColor(0, 0, 0),
    RGBColor(150, 0, 0),
    RGBColor(0, 100, 0),
    RGBColor(90, 0, 140),
    RGBColor(120, 80, 0),
];

/// Number of heights the marks' numbers cycle through at the top of the plot.
const MARK_STAGGER: usize = 3;

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
            .with_context(|| format!("{origin}: reading the header row"))?
            .iter()
            .map(|h| h.trim().to_string())
            .collect();
        if header.is_empty() || header.iter().all(|h| h.is_empty()) {
            bail!("{origin}: no header row (an empty file?)");
        }
        let mut rows = Vec::new();
        for (i, record) in reader.records().enumerate() {
            let record = record.with_context(|| format!("{origin}: reading row {}", i + 1))?;
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
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Index of a column; the error lists the known ones.
    fn column(&self, flag: &str, name: &str) -> Result<usize> {
        self.header.iter().position(|h| h == name).ok_or_else(|| {
            anyhow::anyhow!(
                "{flag} {name}: {} has no such column; its columns are: {}",
                self.origin,
                self.header.join(", ")
            )
        })
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
        bail!("--where {s}: expected COL=VALUE or COL=V1,V2");
    };
    let column = col.trim().to_string();
    let values: Vec<String> = vals.split(',').map(|v| v.trim().to_string()).collect();
    if column.is_empty() {
        bail!("--where {s}: no column before '='");
    }
    Ok(Filter { column, values })
}

/// One `--mark-x VALUE:LABEL`.
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
        .ok_or_else(|| anyhow::anyhow!("--mark-x {s}: '{value}' is not a finite number"))?;
    let label = if label.is_empty() {
        value.to_string()
    } else {
        label
    };
    Ok(Mark { x, label })
}

/// The points (or values) of one series.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    name: String,
    /// Palette index: one per value of `--series` (per y column when there is no series
    /// column).
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

/// The nearest-rank `q` quantile (0 < q <= 1) of sorted values: the smallest value with at
/// least a share `q` of the values at or below it.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
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
            p50: quantile(&v, 0.5),
            p90: quantile(&v, 0.9),
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

/// What `ft plot` prints: the figure written and what is in it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The SVG written.
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
    /// The series, in order of first appearance.
    pub series: Vec<SeriesSummary>,
    /// The vertical marks.
    pub marks: Vec<Mark>,
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
    bins: usize,
    size: (u32, u32),
}

fn parse_cell(table: &Table, line: usize, col: usize, cell: &str) -> Result<Option<f64>> {
    if cell.is_empty() {
        return Ok(None);
    }
    match cell.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(Some(v)),
        Ok(_) => Ok(None),
        Err(_) => bail!(
            "{} line {line}, column {}: '{cell}' is not a number",
            table.origin,
            table.header[col]
        ),
    }
}

/// Check the arguments against the table and gather the series.
fn plan(args: &Args, table: &Table) -> Result<(Plan, Summary)> {
    let distribution = matches!(args.kind, Kind::Histogram | Kind::Cdf);
    if distribution && !args.y.is_empty() {
        bail!(
            "--y: a {:?} draws the distribution of --x alone; leave --y out",
            args.kind
        );
    }
    if !distribution && args.y.is_empty() {
        bail!("--y: a {:?} plot needs at least one y column", args.kind);
    }
    if distribution && (args.diagonal || args.log_y || args.y_from_zero) {
        bail!("--diagonal, --log-y and --y-from-zero apply to scatter and line plots only");
    }
    if args.y_from_zero && args.log_y {
        bail!("--y-from-zero: a logarithmic y axis has no 0");
    }
    if args.diagonal && args.log_x != args.log_y {
        bail!("--diagonal needs both axes on the same scale (give both --log-x and --log-y, or neither)");
    }
    if args.kind == Kind::Histogram && !(1..=MAX_BINS).contains(&args.bins) {
        bail!("--bins {}: must be between 1 and {MAX_BINS}", args.bins);
    }
    if args.width < MIN_SIDE || args.height < MIN_SIDE {
        bail!(
            "--width {} --height {}: each must be at least {MIN_SIDE} pixels",
            args.width,
            args.height
        );
    }
    let xcol = table.column("--x", &args.x)?;
    let ycols: Vec<usize> = args
        .y
        .iter()
        .map(|y| table.column("--y", y))
        .collect::<Result<_>>()?;
    let scol = args
        .series
        .as_deref()
        .map(|s| table.column("--series", s))
        .transpose()?;
    let filters: Vec<(usize, Filter)> = args
        .filters
        .iter()
        .map(|f| {
            let f = parse_filter(f)?;
            Ok((table.column("--where", &f.column)?, f))
        })
        .collect::<Result<_>>()?;
    let marks: Vec<Mark> = args
        .mark_x
        .iter()
        .map(|m| parse_mark(m))
        .collect::<Result<_>>()?;

    let mut series: Vec<Series> = Vec::new();
    let mut groups: Vec<String> = Vec::new();
    let (mut filtered_out, mut skipped) = (0, 0);
    let mut push = |name: String, group: &str, style: usize, p: (f64, f64)| {
        let color = match groups.iter().position(|g| g == group) {
            Some(i) => i,
            None => {
                groups.push(group.to_string());
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
    for (line, row) in &table.rows {
        if !filters.iter().all(|(c, f)| f.values.contains(&row[*c])) {
            filtered_out += 1;
            continue;
        }
        let group = scol.map(|c| row[c].clone());
        let Some(x) = parse_cell(table, *line, xcol, &row[xcol])? else {
            skipped += 1;
            continue;
        };
        if args.log_x && x <= 0.0 {
            bail!(
                "--log-x: {} line {line} has {} = {x}; a logarithmic axis needs positive values",
                table.origin,
                args.x
            );
        }
        if distribution {
            let name = group.unwrap_or_else(|| args.x.clone());
            push(name.clone(), &name, 0, (x, 0.0));
            continue;
        }
        // Each y column on its own: an empty cell drops that point only (a model's column
        // may reach further than a simulation's), and the row counts as skipped.
        let mut ys = Vec::with_capacity(ycols.len());
        for &c in &ycols {
            ys.push(parse_cell(table, *line, c, &row[c])?);
        }
        if ys.iter().any(Option::is_none) {
            skipped += 1;
        }
        for (k, y) in ys.into_iter().enumerate() {
            let Some(y) = y else { continue };
            if args.log_y && y <= 0.0 {
                bail!(
                    "--log-y: {} line {line} has {} = {y}; a logarithmic axis needs positive values",
                    table.origin,
                    args.y[k]
                );
            }
            let (name, color_key, style) = match (&group, ycols.len()) {
                (Some(g), 1) => (g.clone(), g.clone(), 0),
                (Some(g), _) => (format!("{g} {}", args.y[k]), g.clone(), k),
                (None, _) => (args.y[k].clone(), args.y[k].clone(), 0),
            };
            push(name, &color_key, style, (x, y));
        }
    }
    if series.is_empty() {
        bail!(
            "{}: nothing to plot ({} rows, {filtered_out} dropped by --where, {skipped} with empty cells)",
            table.origin,
            table.rows.len()
        );
    }
    if args.log_x {
        if let Some(m) = marks.iter().find(|m| m.x <= 0.0) {
            bail!(
                "--mark-x {}: a logarithmic x axis needs a positive value",
                m.x
            );
        }
    }
    if args.kind == Kind::Line {
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
    let default_y = match args.kind {
        Kind::Histogram => "rows".to_string(),
        Kind::Cdf => "share of rows at or below".to_string(),
        _ => args.y.join(", "),
    };
    let title = args.title.clone().unwrap_or_else(|| match args.kind {
        Kind::Histogram | Kind::Cdf => format!("distribution of {}", args.x),
        _ => format!("{} against {}", args.y.join(", "), args.x),
    });
    let plan = Plan {
        kind: args.kind,
        series,
        marks: marks.clone(),
        title,
        xlabel: args.xlabel.clone().unwrap_or_else(|| args.x.clone()),
        ylabel: args.ylabel.clone().unwrap_or(default_y),
        log_x: args.log_x,
        log_y: args.log_y,
        diagonal: args.diagonal,
        y_from_zero: args.y_from_zero,
        legend: args.legend,
        bins: args.bins,
        size: (args.width, args.height),
    };
    let summary = Summary {
        out: args.out.display().to_string(),
        kind: args.kind,
        x: args.x.clone(),
        y: args.y.clone(),
        rows: table.rows.len(),
        filtered_out,
        skipped,
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

/// A padded axis range over `lo..hi`: [`AXIS_PAD`] of the span on each side (of the span of
/// the logarithms on a log axis), and a unit (or a factor of 2) around a single value.
fn padded(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if log {
        let (a, b) = (lo.log10(), hi.log10());
        if b - a < f64::EPSILON * a.abs().max(1.0) {
            return (lo / 2.0, hi * 2.0);
        }
        let pad = (b - a) * AXIS_PAD;
        (10f64.powf(a - pad), 10f64.powf(b + pad))
    } else {
        if hi - lo < f64::EPSILON * lo.abs().max(1.0) {
            let half = if lo == 0.0 {
                1.0
            } else {
                lo.abs() * AXIS_PAD * 10.0
            };
            return (lo - half, hi + half);
        }
        let pad = (hi - lo) * AXIS_PAD;
        (lo - pad, hi + pad)
    }
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

/// Map a plotters error (which borrows the backend) into anyhow.
fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e:?}")
}

/// Draw `plan` into an SVG string.
fn render(plan: &Plan) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, plan.size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (xr, yr, hist) = ranges(plan);
        match (plan.log_x, plan.log_y) {
            (false, false) => draw(&root, plan, xr.0..xr.1, yr.0..yr.1, hist.as_ref())?,
            (true, false) => draw(
                &root,
                plan,
                (xr.0..xr.1).log_scale(),
                yr.0..yr.1,
                hist.as_ref(),
            )?,
            (false, true) => draw(
                &root,
                plan,
                xr.0..xr.1,
                (yr.0..yr.1).log_scale(),
                hist.as_ref(),
            )?,
            (true, true) => draw(
                &root,
                plan,
                (xr.0..xr.1).log_scale(),
                (yr.0..yr.1).log_scale(),
                hist.as_ref(),
            )?,
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

type Range2 = ((f64, f64), (f64, f64), Option<Histogram>);

/// The axis ranges of a plan (and its histogram, which decides the y range of one).
fn ranges(plan: &Plan) -> Range2 {
    let xs: Vec<f64> = plan
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(plan.marks.iter().map(|m| m.x))
        .collect();
    let ys: Vec<f64> = plan
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .collect();
    let [xlo, xhi] = min_max(&xs);
    match plan.kind {
        Kind::Histogram => {
            let values: Vec<Vec<f64>> = plan
                .series
                .iter()
                .map(|s| s.points.iter().map(|p| p.0).collect())
                .collect();
            let h = histogram(&values, plan.bins, plan.log_x);
            let lo = h.edges[0].min(xlo);
            let hi = h.edges[plan.bins].max(xhi);
            let top = h.counts.iter().flatten().copied().max().unwrap_or(1).max(1) as f64;
            (
                padded(lo, hi, plan.log_x),
                (0.0, top * (1.0 + AXIS_PAD)),
                Some(h),
            )
        }
        Kind::Cdf => (padded(xlo, xhi, plan.log_x), (0.0, 1.0 + AXIS_PAD), None),
        Kind::Scatter | Kind::Line => {
            let [mut ylo, yhi] = min_max(&ys);
            if plan.y_from_zero {
                ylo = ylo.min(0.0);
            }
            if plan.diagonal {
                let (lo, hi) = (xlo.min(ylo), xhi.max(yhi));
                let r = padded(lo, hi, plan.log_x);
                (r, r, None)
            } else {
                (
                    padded(xlo, xhi, plan.log_x),
                    padded(ylo, yhi, plan.log_y),
                    None,
                )
            }
        }
    }
}

/// Format an axis value compactly: integers as integers, large and small values in
/// exponent form, else three significant digits without trailing zeros.
fn tick(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        return "0".to_string();
    }
    if !(1e-3..1e7).contains(&a) {
        return format!("{v:.2e}");
    }
    if a.fract() == 0.0 || a >= 100.0 {
        return format!("{v:.0}");
    }
    let digits = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Rough tick spacing of an axis: a tenth of its span on a linear axis (what the mesh's
/// default of about ten labels gives); `None` on a log axis, whose labels span decades.
fn tick_step(start: f64, end: f64, log: bool) -> Option<f64> {
    (!log && end > start).then(|| (end - start) / 10.0)
}

/// A tick label with as many decimals as the axis' tick spacing needs (so that neighbouring
/// labels differ), trailing zeros removed; [`tick`] on a log axis.
fn axis_tick(v: f64, step: Option<f64>) -> String {
    let Some(step) = step.filter(|s| *s > 0.0 && s.is_finite()) else {
        return tick(v);
    };
    if v.abs() >= 1e7 || (v != 0.0 && v.abs() < 1e-3 && step < 1e-3) {
        return format!("{v:.2e}");
    }
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s
    }
}

fn draw<'s, X, Y>(
    root: &DrawingArea<SVGBackend<'s>, plotters::coord::Shift>,
    plan: &Plan,
    x: X,
    y: Y,
    hist: Option<&Histogram>,
) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(&plan.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
        .map_err(draw_err)?;
    let (x_range, y_range) = (chart.x_range(), chart.y_range());
    let x_step = tick_step(x_range.start, x_range.end, plan.log_x);
    let y_step = tick_step(y_range.start, y_range.end, plan.log_y);
    chart
        .configure_mesh()
        .x_desc(plan.xlabel.as_str())
        .y_desc(plan.ylabel.as_str())
        .x_label_formatter(&|v| axis_tick(*v, x_step))
        .y_label_formatter(&|v| axis_tick(*v, y_step))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(draw_err)?;

    for (i, s) in plan.series.iter().enumerate() {
        let c = color(s.color);
        let style = s.style;
        let legend = move |(x, y): (i32, i32)| -> DynElement<'static, SVGBackend<'s>, (i32, i32)> {
            match style {
                0 => Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()).into_dyn(),
                1 => Circle::new((x + 6, y), POINT_RADIUS + 1, c.stroke_width(2)).into_dyn(),
                _ => Cross::new((x + 6, y), POINT_RADIUS + 1, c.stroke_width(2)).into_dyn(),
            }
        };
        let anno = match plan.kind {
            Kind::Scatter | Kind::Line => {
                if plan.kind == Kind::Line {
                    let pts = s.points.iter().copied();
                    let line = c.stroke_width(2);
                    match style {
                        0 => chart.draw_series(LineSeries::new(pts, line)).map(|_| ()),
                        1 => chart
                            .draw_series(DashedLineSeries::new(pts, DASH, DASH_GAP, line))
                            .map(|_| ()),
                        _ => chart
                            .draw_series(DashedLineSeries::new(pts, DOT, DOT_GAP, line))
                            .map(|_| ()),
                    }
                    .map_err(draw_err)?;
                }
                let pts = s.points.iter();
                match style {
                    0 => chart.draw_series(pts.map(|&p| Circle::new(p, POINT_RADIUS, c.filled()))),
                    1 => chart.draw_series(
                        pts.map(|&p| Circle::new(p, POINT_RADIUS + 1, c.stroke_width(2))),
                    ),
                    _ => chart.draw_series(
                        pts.map(|&p| Cross::new(p, POINT_RADIUS + 1, c.stroke_width(2))),
                    ),
                }
            }
            Kind::Cdf => {
                let values: Vec<f64> = s.points.iter().map(|p| p.0).collect();
                chart.draw_series(LineSeries::new(cdf_steps(&values), c.stroke_width(2)))
            }
            Kind::Histogram => {
                let h = hist.expect("a histogram plan carries its bins");
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
                chart.draw_series(bars)
            }
        }
        .map_err(draw_err)?;
        anno.label(s.name.as_str()).legend(legend);
    }
    if plan.diagonal {
        let (lo, hi) = (
            x_range.start.max(y_range.start),
            x_range.end.min(y_range.end),
        );
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(lo, lo), (hi, hi)],
                MARK_COLOR.stroke_width(1),
            )))
            .map_err(draw_err)?
            .label("y = x")
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], MARK_COLOR.stroke_width(1))
            });
    }
    for (k, m) in plan.marks.iter().enumerate() {
        // Each mark: a dashed vertical line in its own dark colour, its number at the top
        // (staggered so that marks at nearby x stay readable), its label in the legend.
        let c = MARK_COLORS[k % MARK_COLORS.len()];
        let tag = format!("[{}]", k + 1);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(m.x, y_range.start), (m.x, y_range.end)],
                DASH,
                DASH_GAP,
                c.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(format!("{tag} {}", m.label))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], c.stroke_width(2)));
        let top = chart.backend_coord(&(m.x, y_range.end));
        let stagger = MARK_LABEL_STEP * (k % MARK_STAGGER) as i32;
        root.draw(&Text::new(
            tag,
            (top.0 + 3, top.1 + 3 + stagger),
            ("sans-serif", 12).into_font().color(&c),
        ))
        .map_err(draw_err)?;
    }
    let named = plan.series.iter().any(|s| s.name != plan.xlabel);
    let position = match plan.legend {
        Legend::UpperLeft => Some(SeriesLabelPosition::UpperLeft),
        Legend::UpperRight => Some(SeriesLabelPosition::UpperRight),
        Legend::LowerLeft => Some(SeriesLabelPosition::LowerLeft),
        Legend::LowerRight => Some(SeriesLabelPosition::LowerRight),
        Legend::None => None,
    };
    let wanted = plan.series.len() > 1 || plan.diagonal || !plan.marks.is_empty() || named;
    if let (true, Some(position)) = (wanted, position) {
        chart
            .configure_series_labels()
            .position(position)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .draw()
            .map_err(draw_err)?;
    }
    Ok(())
}

/// Everything `ft plot` does but printing: read, check, draw, write; returns the summary.
pub fn plot(args: &Args) -> Result<Summary> {
    let table = Table::read(&args.input)?;
    let (plan, summary) = plan(args, &table)?;
    let svg = render(&plan)?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--out: creating {}", dir.display()))?;
    }
    std::fs::write(&args.out, svg).with_context(|| format!("--out {}", args.out.display()))?;
    Ok(summary)
}

fn print_summary(out: &mut impl Write, s: &Summary) -> Result<()> {
    writeln!(
        out,
        "wrote {}: {:?} of {}{}, {} series ({} rows: {} dropped by --where, {} with empty cells)",
        s.out,
        s.kind,
        if s.y.is_empty() {
            String::new()
        } else {
            format!("{} against ", s.y.join(", "))
        },
        s.x,
        s.series.len(),
        s.rows,
        s.filtered_out,
        s.skipped
    )?;
    let distribution = s.series.iter().any(|r| r.stats.is_some());
    if distribution {
        writeln!(
            out,
            "{:<28} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "series", "n", "min", "mean", "p50", "p90", "max"
        )?;
        for r in &s.series {
            if let Some(st) = &r.stats {
                writeln!(
                    out,
                    "{:<28} {:>6} {:>11.4} {:>11.4} {:>11.4} {:>11.4} {:>11.4}",
                    r.name, st.n, st.min, st.mean, st.p50, st.p90, st.max
                )?;
            }
        }
    } else {
        writeln!(
            out,
            "{:<28} {:>6} {:>11} {:>11} {:>11} {:>11}",
            "series", "points", "x min", "x max", "y min", "y max"
        )?;
        for r in &s.series {
            let [ylo, yhi] = r.y_range.unwrap_or([f64::NAN; 2]);
            writeln!(
                out,
                "{:<28} {:>6} {:>11.4} {:>11.4} {:>11.4} {:>11.4}",
                r.name, r.points, r.x_range[0], r.x_range[1], ylo, yhi
            )?;
        }
    }
    for m in &s.marks {
        writeln!(out, "mark at x = {}: {}", m.x, m.label)?;
    }
    Ok(())
}

/// Run `ft plot`.
pub fn run(args: Args) -> Result<()> {
    let summary = plot(&args)?;
    tracing::info!(out = %summary.out, series = summary.series.len(), "plot written");
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        print_summary(&mut out, &summary)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A naive well-formedness check of XML: every tag closed in order, attributes quoted,
    /// one root element. Enough to tell a truncated or interleaved SVG from a valid one.
    fn assert_well_formed(svg: &str) {
        let mut stack: Vec<String> = Vec::new();
        let mut roots = 0;
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            let text = &rest[..start];
            assert!(!text.contains('>'), "stray '>' in text: {text:?}");
            let end = rest[start..].find('>').expect("an unclosed tag") + start;
            let tag = &rest[start + 1..end];
            rest = &rest[end + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            assert_eq!(
                tag.matches('"').count() % 2,
                0,
                "unbalanced quotes in <{tag}>"
            );
            if let Some(name) = tag.strip_prefix('/') {
                let open = stack
                    .pop()
                    .unwrap_or_else(|| panic!("</{name}> closes nothing"));
                assert_eq!(open, name.trim(), "</{name}> closes <{open}>");
                continue;
            }
            let name = tag
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches('/')
                .to_string();
            assert!(!name.is_empty(), "an empty tag");
            if stack.is_empty() {
                roots += 1;
            }
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        assert_eq!(roots, 1, "an SVG has one root element");
        assert!(svg.trim_start().starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    fn args(csv: &Path, out: &Path, kind: Kind, x: &str, y: &[&str]) -> Args {
        Args {
            input: csv.to_path_buf(),
            out: out.to_path_buf(),
            kind,
            x: x.to_string(),
            y: y.iter().map(|s| s.to_string()).collect(),
            series: None,
            filters: vec![],
            title: None,
            xlabel: None,
            ylabel: None,
            log_x: false,
            log_y: false,
            diagonal: false,
            y_from_zero: false,
            mark_x: vec![],
            legend: Legend::UpperLeft,
            bins: DEFAULT_BINS,
            width: DEFAULT_WIDTH,
            height: DEFAULT_HEIGHT,
            json: false,
        }
    }

    const SWEEP: &str = "streams,strategy,tok_s,model_tok_s\n\
        1,offload,40.1,40.0\n2,offload,43.4,43.0\n4,offload,50.2,\n\
        1,hybrid,65.4,64.6\n2,hybrid,80.0,79.6\n4,hybrid,91.0,92.5\n";

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn scatter_with_series_writes_valid_svg_with_every_point_and_name() {
        let dir = tempfile::tempdir().unwrap();
        let csv = write(dir.path(), "s.csv", SWEEP);
        let out = dir.path().join("sub/s.svg");
        let mut a = args(&csv, &out, Kind::Scatter, "streams", &["tok_s"]);
        a.series = Some("strategy".into());
        a.mark_x = vec!["2:field report & ratio".into()];
        let s = plot(&a).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert_well_formed(&svg);
        // One circle per point, the series in the legend, the mark's label escaped.
        let names: Vec<&str> = s.series.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["offload", "hybrid"]);
        assert_eq!(s.series.iter().map(|r| r.points).sum::<usize>(), 6);
        assert_eq!(svg.matches("<circle").count(), 6);
        for n in names {
            assert!(
                svg.contains(&format!(">\n{n}\n<")) || svg.contains(&format!(">{n}<")),
                "{n} missing"
            );
        }
        assert!(svg.contains("field report &amp; ratio"));
        assert_eq!(s.series[1].y_range, Some([65.4, 91.0]));
        assert_eq!(s.skipped, 0);
    }

    #[test]
    fn several_y_columns_skip_empty_cells_and_filter_rows() {
        let dir = tempfile::tempdir().unwrap();
        let csv = write(dir.path(), "s.csv", SWEEP);
        let out = dir.path().join("l.svg");
        let mut a = args(&csv, &out, Kind::Line, "streams", &["tok_s", "model_tok_s"]);
        a.series = Some("strategy".into());
        a.filters = vec!["strategy=offload".into()];
        let s = plot(&a).unwrap();
        assert_eq!(s.filtered_out, 3);
        assert_eq!(s.skipped, 1, "the row with no model value");
        let points: Vec<usize> = s.series.iter().map(|r| r.points).collect();
        assert_eq!(
            points,
            [3, 2],
            "the empty cell drops its column's point only"
        );
        let names: Vec<&str> = s.series.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["offload tok_s", "offload model_tok_s"]);
        let svg = std::fs::read_to_string(&out).unwrap();
        assert_well_formed(&svg);
        // The first y column solid (one polyline) with filled points, the second dashed (a
        // polyline per dash) with hollow ones: 3 + 2 points plus the legend's hollow marker.
        assert!(svg.matches("<polyline").count() > 2);
        assert_eq!(svg.matches("<circle").count(), 3 + 2 + 1);
    }

    #[test]
    fn diagonal_and_log_axes() {
        let dir = tempfile::tempdir().unwrap();
        let csv = write(dir.path(), "s.csv", SWEEP);
        let out = dir.path().join("d.svg");
        let mut a = args(&csv, &out, Kind::Scatter, "model_tok_s", &["tok_s"]);
        a.diagonal = true;
        a.log_x = true;
        a.log_y = true;
        let s = plot(&a).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert_well_formed(&svg);
        assert!(svg.contains("y = x"));
        assert_eq!(s.series[0].points, 5);
        // Equal axes: the diagonal needs matching scales.
        a.log_y = false;
        let e = plot(&a).unwrap_err().to_string();
        assert!(e.contains("--diagonal"), "{e}");
    }

    /// The fast binning against a slow reference: each value's bin by a scan of the edges.
    #[test]
    fn histogram_counts_match_a_scan_of_the_edges() {
        let values: Vec<Vec<f64>> = vec![
            (0..97)
                .map(|i| ((i * 37) % 101) as f64 / 7.3 + 0.01)
                .collect(),
            (0..13).map(|i| 2.0 + i as f64).collect(),
        ];
        for log in [false, true] {
            for bins in [1, 3, 20] {
                let h = histogram(&values, bins, log);
                assert_eq!(h.edges.len(), bins + 1);
                for (s, vs) in values.iter().enumerate() {
                    let mut naive = vec![0; bins];
                    for &v in vs {
                        let b = (0..bins)
                            .find(|&b| v < h.edges[b + 1] * (1.0 - 1e-12) || b == bins - 1)
                            .unwrap();
                        assert!(v >= h.edges[b] * (1.0 - 1e-12), "{v} below bin {b}");
                        naive[b] += 1;
                    }
                    assert_eq!(h.counts[s], naive, "log {log} bins {bins} series {s}");
                    assert_eq!(h.counts[s].iter().sum::<usize>(), vs.len());
                }
            }
        }
        // A single value still gets a bin of positive width.
        let h = histogram(&[vec![3.0, 3.0]], 4, false);
        assert!(h.edges[4] > h.edges[0]);
        assert_eq!(h.counts[0].iter().sum::<usize>(), 2);
    }

    #[test]
    fn histogram_and_cdf_plots_report_the_distribution() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("rule,regret\n");
        for i in 0..10 {
            text.push_str(&format!(
                "ratio,{}\nmodel,{}\n",
                i as f64 / 10.0,
                i as f64 / 100.0
            ));
        }
        let csv = write(dir.path(), "r.csv", &text);
        for kind in [Kind::Histogram, Kind::Cdf] {
            let out = dir.path().join(format!("{kind:?}.svg"));
            let mut a = args(&csv, &out, kind, "regret", &[]);
            a.series = Some("rule".into());
            a.bins = 5;
            let s = plot(&a).unwrap();
            let svg = std::fs::read_to_string(&out).unwrap();
            assert_well_formed(&svg);
            let ratio = s.series[0].stats.as_ref().unwrap();
            assert_eq!(
                (ratio.n, ratio.p50, ratio.p90, ratio.max),
                (10, 0.4, 0.8, 0.9)
            );
            assert!((ratio.mean - 0.45).abs() < 1e-12);
            assert!(svg.contains("ratio") && svg.contains("model"));
            // Each series drawn in its palette colour: bars (histogram) or a step line (cdf).
            for i in 0..2 {
                let RGBColor(r, g, b) = color(i);
                let hex = format!("#{r:02X}{g:02X}{b:02X}");
                let element = if kind == Kind::Histogram {
                    "<rect"
                } else {
                    "<polyline"
                };
                let drawn = svg
                    .split(element)
                    .skip(1)
                    .filter(|e| e.split('>').next().unwrap_or("").contains(&hex))
                    .count();
                // Histogram: bars only for non-empty bins (5 for ratio, 1 for model: all its
                // values fall in the first bin), plus the legend's square; cdf: one line.
                let expected = match (kind, i) {
                    (Kind::Histogram, 0) => 5 + 1,
                    (Kind::Histogram, _) => 1 + 1,
                    _ => 1,
                };
                assert_eq!(drawn, expected, "{kind:?} series {i} ({hex})");
            }
        }
        // A distribution takes no --y.
        let out = dir.path().join("x.svg");
        let e = plot(&args(&csv, &out, Kind::Cdf, "regret", &["rule"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--y"), "{e}");
    }

    #[test]
    fn cdf_steps_rise_by_one_nth_at_each_value() {
        let s = cdf_steps(&[3.0, 1.0, 2.0]);
        let third = 1.0 / 3.0;
        assert_eq!(
            s,
            vec![
                (1.0, 0.0),
                (1.0, third),
                (2.0, third),
                (2.0, 2.0 * third),
                (3.0, 2.0 * third),
                (3.0, 1.0)
            ]
        );
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.9), 4.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn bad_input_gets_errors_that_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let csv = write(dir.path(), "s.csv", SWEEP);
        let out = dir.path().join("e.svg");
        let e = plot(&args(&csv, &out, Kind::Scatter, "stream", &["tok_s"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--x stream") && e.contains("streams, strategy"),
            "{e}"
        );
        let e = plot(&args(&csv, &out, Kind::Scatter, "streams", &["strategy"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("strategy") && e.contains("offload"),
            "{e}"
        );
        let mut a = args(&csv, &out, Kind::Scatter, "streams", &["tok_s"]);
        a.mark_x = vec!["abc:label".into()];
        assert!(plot(&a)
            .unwrap_err()
            .to_string()
            .contains("--mark-x abc:label"));
        a.mark_x = vec![];
        a.filters = vec!["strategy=fused".into()];
        assert!(plot(&a)
            .unwrap_err()
            .to_string()
            .contains("nothing to plot"));
        a.filters = vec!["nostrat".into()];
        assert!(plot(&a).unwrap_err().to_string().contains("COL=VALUE"));
        let zero = write(dir.path(), "z.csv", "x,y\n0,1\n1,2\n");
        let mut a = args(&zero, &out, Kind::Scatter, "x", &["y"]);
        a.log_x = true;
        let e = plot(&a).unwrap_err().to_string();
        assert!(e.contains("--log-x") && e.contains("line 2"), "{e}");
        let ragged = write(dir.path(), "r.csv", "x,y\n1,2\n3\n");
        assert!(plot(&args(&ragged, &out, Kind::Scatter, "x", &["y"])).is_err());
        let missing = dir.path().join("none.csv");
        let e = plot(&args(&missing, &out, Kind::Scatter, "x", &["y"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.csv"), "{e}");
    }

    #[test]
    fn marks_parse_with_and_without_labels() {
        assert_eq!(
            parse_mark("0.35:model optimum (2 streams)").unwrap(),
            Mark {
                x: 0.35,
                label: "model optimum (2 streams)".into()
            }
        );
        assert_eq!(
            parse_mark("16384").unwrap(),
            Mark {
                x: 16384.0,
                label: "16384".into()
            }
        );
        assert!(parse_mark("inf:x").is_err());
        assert_eq!(
            parse_filter("streams=1,2").unwrap(),
            Filter {
                column: "streams".into(),
                values: vec!["1".into(), "2".into()]
            }
        );
    }

    #[test]
    fn ticks_are_compact() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(16384.0), "16384");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1.5), "1.5");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(123.4), "123");
        assert_eq!(tick(1e-5), "1.00e-5");
        // On a linear axis the decimals follow the spacing: neighbours stay distinct.
        let labels: Vec<String> = (0..5)
            .map(|i| axis_tick(47.0 + 0.05 * i as f64, Some(0.05)))
            .collect();
        assert_eq!(labels, ["47", "47.05", "47.1", "47.15", "47.2"]);
        assert_eq!(axis_tick(16384.0, Some(1000.0)), "16384");
        assert_eq!(axis_tick(-0.0001, Some(0.1)), "0");
        assert_eq!(axis_tick(0.25, None), "0.25");
    }
}
