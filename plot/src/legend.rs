//! Legends, shared by every figure: what an entry looks like, how large a legend is, and
//! where it goes so that it covers no data.
//!
//! plotters' own series labels sit in a fixed corner whatever is under them (a CDF's
//! curves ran under the legend); here a legend goes in the first corner of the plot that
//! no point, line or mark passes through, and beside the plot when every corner is taken.
//! The decision figure draws its one legend as a row above its panels with the same
//! entries.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Size of a legend's text, in pixels.
pub const FONT: u32 = 13;

/// Width of an entry's swatch, in pixels.
const SWATCH: i32 = 26;

/// Space between a swatch and its text, and around the legend's entries, in pixels.
const GAP: i32 = 6;

/// Height of one entry, in pixels.
const ROW: i32 = 19;

/// Space between entries of a row legend, in pixels.
const ROW_GAP: i32 = 18;

/// Average advance of a character of the sans-serif legend font, as a share of its size:
/// the SVG is laid out by the viewer, so widths are estimated (generously, so that text
/// does not run out of its box).
const CHAR_WIDTH: f64 = 0.55;

/// What an entry's swatch shows: how its series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swatch {
    /// A solid line.
    Line,
    /// A dashed line.
    Dashed,
    /// A dotted line.
    Dotted,
    /// A solid line with a filled point.
    LinePoint,
    /// A dashed line with a hollow point.
    DashedRing,
    /// A dotted line with a cross.
    DottedCross,
    /// A filled point.
    Point,
    /// A hollow point.
    Ring,
    /// A cross.
    Cross,
    /// A filled square (a bar or an area).
    Block,
    /// A short vertical tick (a mark on the x axis).
    Tick,
    /// A dashed vertical tick.
    DashedTick,
}

/// One entry of a legend.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// What it names (a series, with its unit where the axis does not say it).
    pub label: String,
    /// Its colour.
    pub color: RGBColor,
    /// Its swatch.
    pub swatch: Swatch,
}

/// Estimated width of `text` at `size` pixels.
pub fn text_width(text: &str, size: u32) -> i32 {
    (text.chars().count() as f64 * size as f64 * CHAR_WIDTH).ceil() as i32
}

/// Width and height of a legend of `entries` in one column (its frame included), in
/// pixels.
pub fn column_size(entries: &[Entry]) -> (i32, i32) {
    let text = entries
        .iter()
        .map(|e| text_width(&e.label, FONT))
        .max()
        .unwrap_or(0);
    (
        2 * GAP + SWATCH + GAP + text,
        2 * GAP + ROW * entries.len() as i32,
    )
}

/// Width of one column of a row legend, in pixels: the widest entry's, so that entries
/// line up in a grid.
fn row_column_width(entries: &[Entry]) -> i32 {
    entries
        .iter()
        .map(|e| SWATCH + GAP + text_width(&e.label, FONT) + ROW_GAP)
        .max()
        .unwrap_or(1)
}

/// Entries per line of a row legend `width` pixels wide (at least one).
fn row_columns(entries: &[Entry], width: i32) -> usize {
    (width / row_column_width(entries)).max(1) as usize
}

/// Rows a row legend of `entries` needs within `width` pixels.
pub fn row_lines(entries: &[Entry], width: i32) -> usize {
    entries.len().div_ceil(row_columns(entries, width)).max(1)
}

/// Height of one line of a row legend, in pixels.
pub const ROW_HEIGHT: i32 = ROW + 4;

type Area<'a, DB> = DrawingArea<DB, plotters::coord::Shift>;

fn swatch<DB: DrawingBackend>(
    area: &Area<'_, DB>,
    e: &Entry,
    (x, y): (i32, i32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let c = e.color;
    let line = |a: &Area<'_, DB>, dash: Option<(i32, i32)>| {
        let style = c.stroke_width(2);
        match dash {
            None => a.draw(&PathElement::new(vec![(x, y), (x + SWATCH, y)], style)),
            Some((on, off)) => {
                let mut x0 = x;
                while x0 < x + SWATCH {
                    let x1 = (x0 + on).min(x + SWATCH);
                    a.draw(&PathElement::new(vec![(x0, y), (x1, y)], style))?;
                    x0 = x1 + off;
                }
                Ok(())
            }
        }
    };
    let mid = (x + SWATCH / 2, y);
    match e.swatch {
        Swatch::Line => line(area, None),
        Swatch::Dashed => line(area, Some((7, 4))),
        Swatch::Dotted => line(area, Some((2, 3))),
        Swatch::LinePoint => {
            line(area, None)?;
            area.draw(&Circle::new(mid, 3, c.filled()))
        }
        Swatch::DashedRing => {
            line(area, Some((7, 4)))?;
            area.draw(&Circle::new(mid, 4, WHITE.filled()))?;
            area.draw(&Circle::new(mid, 4, c.stroke_width(2)))
        }
        Swatch::DottedCross => {
            line(area, Some((2, 3)))?;
            area.draw(&Cross::new(mid, 4, c.stroke_width(2)))
        }
        Swatch::Point => area.draw(&Circle::new(mid, 3, c.filled())),
        Swatch::Ring => area.draw(&Circle::new(mid, 4, c.stroke_width(2))),
        Swatch::Cross => area.draw(&Cross::new(mid, 4, c.stroke_width(2))),
        Swatch::Block => area.draw(&Rectangle::new(
            [(x + 6, y - 6), (x + SWATCH - 6, y + 6)],
            c.filled(),
        )),
        Swatch::Tick => area.draw(&PathElement::new(
            vec![(mid.0, y - 8), (mid.0, y + 8)],
            c.stroke_width(2),
        )),
        Swatch::DashedTick => {
            for (a, b) in [(-8, -4), (-1, 3), (6, 9)] {
                area.draw(&PathElement::new(
                    vec![(mid.0, y + a), (mid.0, y + b)],
                    c.stroke_width(2),
                ))?;
            }
            Ok(())
        }
    }
}

fn text<DB: DrawingBackend>(
    area: &Area<'_, DB>,
    e: &Entry,
    (x, y): (i32, i32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    area.draw(&Text::new(
        e.label.clone(),
        (x + SWATCH + GAP, y),
        ("sans-serif", FONT)
            .into_font()
            .color(&RGBColor(30, 30, 30))
            .pos(Pos::new(HPos::Left, VPos::Center)),
    ))
}

/// Draw `entries` in one framed column whose top-left corner is `at` (in `area`'s pixels).
pub fn draw_column<DB: DrawingBackend>(
    area: &Area<'_, DB>,
    entries: &[Entry],
    at: (i32, i32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, h) = column_size(entries);
    area.draw(&Rectangle::new(
        [at, (at.0 + w, at.1 + h)],
        WHITE.mix(0.9).filled(),
    ))?;
    area.draw(&Rectangle::new(
        [at, (at.0 + w, at.1 + h)],
        RGBColor(180, 180, 180).stroke_width(1),
    ))?;
    for (i, e) in entries.iter().enumerate() {
        let p = (at.0 + GAP, at.1 + GAP + ROW * i as i32 + ROW / 2);
        swatch(area, e, p)?;
        text(area, e, p)?;
    }
    Ok(())
}

/// Draw `entries` as rows of at most `width` pixels, in columns as wide as the widest
/// entry, the first row's middle at `at`.
pub fn draw_rows<DB: DrawingBackend>(
    area: &Area<'_, DB>,
    entries: &[Entry],
    at: (i32, i32),
    width: i32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (col, per_line) = (row_column_width(entries), row_columns(entries, width));
    for (i, e) in entries.iter().enumerate() {
        let p = (
            at.0 + col * (i % per_line) as i32,
            at.1 + ROW_HEIGHT * (i / per_line) as i32,
        );
        swatch(area, e, p)?;
        text(area, e, p)?;
    }
    Ok(())
}

/// Draw `entries` on one line from `at` (its middle), each as wide as its text: a
/// figure's header, where a grid's second line would not fit.
pub fn draw_line<DB: DrawingBackend>(
    area: &Area<'_, DB>,
    entries: &[Entry],
    at: (i32, i32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let mut x = at.0;
    for e in entries {
        swatch(area, e, (x, at.1))?;
        text(area, e, (x, at.1))?;
        x += SWATCH + GAP + text_width(&e.label, FONT) + ROW_GAP;
    }
    Ok(())
}

/// A corner of a plot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corner {
    /// Top left.
    UpperLeft,
    /// Top right.
    UpperRight,
    /// Bottom right.
    LowerRight,
    /// Bottom left.
    LowerLeft,
}

impl Corner {
    /// The order corners are tried in.
    pub const ALL: [Corner; 4] = [
        Corner::UpperLeft,
        Corner::UpperRight,
        Corner::LowerRight,
        Corner::LowerLeft,
    ];

    /// The box of a legend of `size` (a share of the plot's width and height) in this
    /// corner, in the plot's unit square (0 bottom-left, 1 top-right), with `margin`.
    fn unit_box(self, (w, h): (f64, f64), margin: f64) -> [(f64, f64); 2] {
        let (x0, x1) = match self {
            Corner::UpperLeft | Corner::LowerLeft => (0.0, w + 2.0 * margin),
            _ => (1.0 - w - 2.0 * margin, 1.0),
        };
        let (y0, y1) = match self {
            Corner::LowerLeft | Corner::LowerRight => (0.0, h + 2.0 * margin),
            _ => (1.0 - h - 2.0 * margin, 1.0),
        };
        [(x0, y0), (x1, y1)]
    }

    /// The top-left pixel of a legend `legend` pixels large in this corner of a plot
    /// `plot` pixels large, `inset` pixels from its frame.
    pub fn origin(self, plot: (i32, i32), legend: (i32, i32), inset: i32) -> (i32, i32) {
        let x = match self {
            Corner::UpperLeft | Corner::LowerLeft => inset,
            _ => plot.0 - legend.0 - inset,
        };
        let y = match self {
            Corner::UpperLeft | Corner::UpperRight => inset,
            _ => plot.1 - legend.1 - inset,
        };
        (x, y)
    }
}

/// Share of the plot kept clear around a legend inside it.
const CLEAR: f64 = 0.02;

/// The first corner (in [`Corner::ALL`]'s order) where a legend of `size` (a share of the
/// plot's width and height) covers none of `points` (the data, lines densified, in the
/// plot's unit square: 0 bottom-left, 1 top-right); `None` when every corner covers some,
/// or the legend does not fit.
pub fn free_corner(points: &[(f64, f64)], size: (f64, f64)) -> Option<Corner> {
    if size.0 + 2.0 * CLEAR > 0.6 || size.1 + 2.0 * CLEAR > 0.9 {
        return None;
    }
    Corner::ALL.into_iter().find(|c| {
        let [(x0, y0), (x1, y1)] = c.unit_box(size, CLEAR);
        !points
            .iter()
            .any(|&(x, y)| x >= x0 && x <= x1 && y >= y0 && y <= y1)
    })
}

/// The points of a polyline in the unit square, with extra points every `step` along each
/// segment, so that a line through a box is seen even where no vertex lies in it.
pub fn densify(line: &[(f64, f64)], step: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(line.len());
    for w in line.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        let len = ((x1 - x0).powi(2) + (y1 - y0).powi(2)).sqrt();
        let n = if len.is_finite() {
            (len / step).ceil().clamp(1.0, 10_000.0) as usize
        } else {
            1
        };
        for i in 0..n {
            let t = i as f64 / n as f64;
            out.push((x0 + t * (x1 - x0), y0 + t * (y1 - y0)));
        }
    }
    out.extend(line.last().copied());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legend_goes_where_no_data_is() {
        let size = (0.25, 0.2);
        // Nothing drawn: the first corner.
        assert_eq!(free_corner(&[], size), Some(Corner::UpperLeft));
        // A CDF rising early: its curve runs along the top from the left, so the legend
        // goes bottom right, below the curve.
        let cdf = densify(&[(0.0, 0.0), (0.05, 0.9), (0.3, 1.0), (1.0, 1.0)], 0.01);
        assert_eq!(free_corner(&cdf, size), Some(Corner::LowerRight));
        // A rising diagonal (y = x): the upper left is free.
        let diag = densify(&[(0.0, 0.0), (1.0, 1.0)], 0.01);
        assert_eq!(free_corner(&diag, size), Some(Corner::UpperLeft));
        // A line through every corner's box: none is free, the legend goes outside.
        let zig = densify(
            &[
                (0.0, 0.95),
                (0.1, 0.05),
                (0.9, 0.05),
                (1.0, 0.95),
                (0.0, 0.95),
            ],
            0.01,
        );
        assert_eq!(free_corner(&zig, size), None);
        // A legend larger than the plot allows never goes inside.
        assert_eq!(free_corner(&[], (0.7, 0.2)), None);
    }

    #[test]
    fn a_segment_through_a_corner_is_seen_without_a_vertex_in_it() {
        // A segment crossing the upper-left box with both ends outside it.
        let seg = [(0.0, 0.6), (0.4, 1.0)];
        let size = (0.2, 0.2);
        // The vertices alone miss it...
        assert_eq!(free_corner(&seg, size), Some(Corner::UpperLeft));
        // ...the densified line does not.
        assert_eq!(
            free_corner(&densify(&seg, 0.01), size),
            Some(Corner::UpperRight)
        );
        let d = densify(&seg, 0.1);
        assert!(d.iter().any(|&(x, y)| x < 0.21 && y > 0.75), "{d:?}");
    }

    #[test]
    fn sizes_grow_with_entries_and_text() {
        let e = |l: &str| Entry {
            label: l.into(),
            color: RGBColor(0, 0, 0),
            swatch: Swatch::Line,
        };
        let (w1, h1) = column_size(&[e("a")]);
        let (w2, h2) = column_size(&[e("a"), e("a much longer label")]);
        assert!(w2 > w1 && h2 > h1);
        assert_eq!(row_lines(&[e("a"), e("b")], 1000), 1);
        assert_eq!(row_lines(&[e("aaaaaaaaaa"), e("bbbbbbbbbb")], 150), 2);
        // Columns as wide as the widest entry: three short and one long entry in a width
        // that holds two of the long.
        let four = [e("a"), e("b"), e("c"), e("a label of some length")];
        let two_long = 2 * row_column_width(&four[3..]);
        assert_eq!(row_lines(&four, two_long), 2);
        assert_eq!(row_lines(&four, 1), 4, "one per line at least");
    }
}
