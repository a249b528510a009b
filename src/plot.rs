//! `ft plot`: turn a CSV of results into an SVG figure. The drawing is `ft_plot::chart`'s;
//! this module parses the arguments, reads and writes the files and prints the summary.

use anyhow::{Context, Result};
use ft_plot::chart::{self, Kind, Legend, Spec, Table};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `ft plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The CSV file to read (a header row, then one row per record).
    pub input: PathBuf,
    /// The SVG file to write.
    #[arg(short, long)]
    pub out: PathBuf,
    /// What to draw: scatter, line, histogram or cdf.
    #[arg(long, default_value = "scatter")]
    pub kind: Kind,
    /// Column on the x axis (for histogram and cdf: the column whose distribution is drawn).
    #[arg(long)]
    pub x: String,
    /// Column(s) on the y axis, comma separated (scatter and line only).
    #[arg(long, value_delimiter = ',')]
    pub y: Vec<String>,
    /// Column(s) whose values split the rows into series (one colour each), comma
    /// separated. A line series with several rows at one x is split further by the column
    /// that tells them apart (a hybrid strategy's fetch fraction).
    #[arg(long, value_delimiter = ',')]
    pub series: Vec<String>,
    /// Keep only rows where COL equals one of the comma-separated values (repeatable; all
    /// must hold).
    #[arg(long = "where", value_name = "COL=V1,V2")]
    pub filters: Vec<String>,
    /// Name a column for readers, in the legend and the default axis labels (repeatable;
    /// default: its name read out with its unit, `sim_tok_s_total` as "simulator total
    /// (tok/s)").
    #[arg(long = "label", value_name = "COL=TEXT")]
    pub labels: Vec<String>,
    /// Title above the plot (default: the columns drawn).
    #[arg(long)]
    pub title: Option<String>,
    /// Label of the x axis, with its unit (default: the x column's name read out).
    #[arg(long)]
    pub xlabel: Option<String>,
    /// Label of the y axis, with its unit (default: the y columns' names read out, or
    /// "rows" / "share of rows").
    #[arg(long)]
    pub ylabel: Option<String>,
    /// Logarithmic x axis (every x must be positive), labelled at every decade.
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
    /// Where the legend goes: auto (a corner with no data under it, else beside the plot),
    /// upper-left, upper-right, lower-left, lower-right, outside or none.
    #[arg(long, default_value = "auto")]
    pub legend: Legend,
    /// Bins of a histogram.
    #[arg(long, default_value_t = chart::DEFAULT_BINS)]
    pub bins: usize,
    /// Width of the figure, in pixels.
    #[arg(long, default_value_t = chart::DEFAULT_WIDTH)]
    pub width: u32,
    /// Height of the figure, in pixels.
    #[arg(long, default_value_t = chart::DEFAULT_HEIGHT)]
    pub height: u32,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    fn spec(&self) -> Spec {
        Spec {
            kind: self.kind,
            x: self.x.clone(),
            y: self.y.clone(),
            series: self.series.clone(),
            filters: self.filters.clone(),
            labels: self.labels.clone(),
            title: self.title.clone(),
            xlabel: self.xlabel.clone(),
            ylabel: self.ylabel.clone(),
            log_x: self.log_x,
            log_y: self.log_y,
            diagonal: self.diagonal,
            y_from_zero: self.y_from_zero,
            mark_x: self.mark_x.clone(),
            legend: self.legend,
            bins: self.bins,
            width: self.width,
            height: self.height,
        }
    }
}

/// Everything `ft plot` does but printing: read, check, draw, write; returns the summary.
pub fn plot(args: &Args) -> Result<chart::Summary> {
    let table = Table::read(&args.input)?;
    let (svg, mut summary) = chart::chart(&args.spec(), &table)?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--out: creating {}", dir.display()))?;
    }
    std::fs::write(&args.out, svg).with_context(|| format!("--out {}", args.out.display()))?;
    summary.out = args.out.display().to_string();
    Ok(summary)
}

/// Run `ft plot`.
pub fn run(args: Args) -> Result<()> {
    let summary = plot(&args)?;
    if let Some(c) = &summary.split_by {
        tracing::info!(column = %c, "line series with several rows at one x split by a column");
    }
    tracing::info!(out = %summary.out, series = summary.series.len(), legend = %summary.legend, "plot written");
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        write!(out, "{}", summary.text())?;
    }
    Ok(())
}
