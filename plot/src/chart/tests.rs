use super::*;

/// The SVG parses as XML (roxmltree) with one `svg` root.
pub(crate) fn assert_well_formed(svg: &str) {
    let doc = roxmltree::Document::parse(svg).expect("the SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
}

/// The texts of an SVG (plotters writes each on its own line between tags).
fn texts(svg: &str) -> Vec<String> {
    svg.split('>')
        .filter_map(|s| s.split('<').next())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn spec(kind: Kind, x: &str, y: &[&str]) -> Spec {
    Spec {
        kind,
        x: x.to_string(),
        y: y.iter().map(|s| s.to_string()).collect(),
        ..Spec::default()
    }
}

const SWEEP: &str = "streams,strategy,tok_s,model_tok_s\n\
    1,offload,40.1,40.0\n2,offload,43.4,43.0\n4,offload,50.2,\n\
    1,hybrid,65.4,64.6\n2,hybrid,80.0,79.6\n4,hybrid,91.0,92.5\n";

fn table(text: &str) -> Table {
    Table::parse(text, "s.csv").unwrap()
}

#[test]
fn scatter_with_series_writes_valid_svg_with_every_point_and_name() {
    let mut s = spec(Kind::Scatter, "streams", &["tok_s"]);
    s.series = vec!["strategy".into()];
    s.mark_x = vec!["2:field report & ratio".into()];
    let (svg, sum) = chart(&s, &table(SWEEP)).unwrap();
    assert_well_formed(&svg);
    // One circle per point (and one per legend swatch), the series in the legend, the
    // mark's label escaped.
    let names: Vec<&str> = sum.series.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["offload", "hybrid"]);
    assert_eq!(sum.series.iter().map(|r| r.points).sum::<usize>(), 6);
    assert_eq!(svg.matches("<circle").count(), 6 + 2);
    let t = texts(&svg);
    for n in names {
        assert!(t.iter().any(|x| x == n), "{n} missing");
    }
    assert!(svg.contains("field report &amp; ratio"));
    assert_eq!(sum.series[1].y_range, Some([65.4, 91.0]));
    assert_eq!(sum.skipped, 0);
}

#[test]
fn several_y_columns_skip_empty_cells_filter_rows_and_read_as_words() {
    let mut s = spec(Kind::Line, "streams", &["tok_s", "model_tok_s"]);
    s.series = vec!["strategy".into()];
    s.filters = vec!["strategy=offload".into()];
    let (svg, sum) = chart(&s, &table(SWEEP)).unwrap();
    assert_eq!(sum.filtered_out, 3);
    assert_eq!(sum.skipped, 1, "the row with no model value");
    let points: Vec<usize> = sum.series.iter().map(|r| r.points).collect();
    assert_eq!(
        points,
        [3, 2],
        "the empty cell drops its column's point only"
    );
    // Named for readers: the column's words and its unit, not the CSV's name.
    let names: Vec<&str> = sum.series.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["offload, tok/s", "offload, model (tok/s)"]);
    assert_well_formed(&svg);
    let t = texts(&svg);
    assert!(!t.iter().any(|x| x.contains("model_tok_s")), "{t:?}");
    // The first y column solid (one polyline) with filled points, the second dashed (a
    // polyline per dash) with hollow ones.
    assert!(svg.matches("<polyline").count() > 2);
    // --label names a column.
    s.labels = vec!["model_tok_s=analytic model (tok/s)".into()];
    let (_, sum) = chart(&s, &table(SWEEP)).unwrap();
    assert_eq!(sum.series[1].name, "offload, analytic model (tok/s)");
}

#[test]
fn columns_read_as_words_with_their_units() {
    for (col, words) in [
        ("sim_tok_s_total", "simulator total (tok/s)"),
        ("served_cpu_moe_gbs", "served CPU-MoE (GB/s)"),
        ("hybrid_over_offload_pct", "hybrid over offload (%)"),
        ("cold_window_miss_rate", "cold window miss rate"),
        ("expert_mb", "expert (MB)"),
        ("tok_s", "tok/s"),
        ("streams", "streams"),
        ("pcie_gather_contended_gbs", "PCIe gather contended (GB/s)"),
    ] {
        assert_eq!(readable(col), words, "{col}");
    }
}

#[test]
fn a_line_series_with_several_rows_at_one_x_is_one_line_per_fetch_fraction() {
    // A sweep of hybrid at two fetch fractions per streams: drawn by strategy alone, it
    // would be one zig-zag line through both fractions.
    let csv = "streams,strategy,fetch_fraction,tok_s\n\
        1,offload,1.0,40\n2,offload,1.0,43\n\
        1,hybrid,0.3,60\n1,hybrid,0.6,55\n2,hybrid,0.3,70\n2,hybrid,0.6,75\n";
    let mut s = spec(Kind::Line, "streams", &["tok_s"]);
    s.series = vec!["strategy".into()];
    let (_, sum) = chart(&s, &table(csv)).unwrap();
    assert_eq!(sum.split_by.as_deref(), Some("fetch_fraction"));
    let names: Vec<&str> = sum.series.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "offload, fetch fraction 1.0",
            "hybrid, fetch fraction 0.3",
            "hybrid, fetch fraction 0.6"
        ]
    );
    // Each line has one point per x, in order.
    for r in &sum.series {
        assert_eq!(r.points, 2, "{}", r.name);
    }
    // Naming both columns as series gives the same lines, without a split.
    s.series = vec!["strategy".into(), "fetch_fraction".into()];
    let (_, sum2) = chart(&s, &table(csv)).unwrap();
    assert_eq!(sum2.split_by, None);
    assert_eq!(sum2.series.len(), 3);
    // A scatter is not split: points at one x are what a scatter shows.
    s.kind = Kind::Scatter;
    s.series = vec!["strategy".into()];
    let (_, sum3) = chart(&s, &table(csv)).unwrap();
    assert_eq!(sum3.series.len(), 2);
    // Rows at one x that nothing tells apart: an error naming the way out.
    let same = "x,y\n1,2\n1,3\n";
    let e = chart(&spec(Kind::Line, "x", &["y"]), &table(same))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--series"), "{e}");
}

#[test]
fn the_legend_of_a_cdf_covers_no_curve() {
    // Regrets: nine in ten near 0, a long tail: the curves rise at the left and run
    // along the top, where a fixed upper-left legend sat on them.
    let mut text = String::from("rule,regret\n");
    for i in 0..50 {
        let v = if i < 45 {
            i as f64 / 45.0
        } else {
            80.0 * (i - 44) as f64 / 6.0
        };
        text.push_str(&format!("ratio,{v}\nmodel,{}\n", v / 3.0));
    }
    let mut s = spec(Kind::Cdf, "regret", &[]);
    s.series = vec!["rule".into()];
    let t = table(&text);
    let (plan, _) = plan(&s, &t).unwrap();
    let r = ranges(&plan);
    let (svg, sum) = chart(&s, &t).unwrap();
    assert_well_formed(&svg);
    assert_ne!(sum.legend, "upper-left");
    let px = legend::column_size(&entries(&plan));
    let place = placement(&plan, &r, px);
    let Legend::Corner(c) = place else {
        panic!("{place:?}")
    };
    assert!(matches!(c, Corner::LowerRight | Corner::LowerLeft), "{c:?}");
}

#[test]
fn a_legend_with_no_free_corner_goes_outside() {
    // Lines through all four corners.
    let csv = "x,a,b\n0,0,10\n1,10,0\n";
    let (svg, sum) = chart(&spec(Kind::Line, "x", &["a", "b"]), &table(csv)).unwrap();
    assert_eq!(sum.legend, "outside");
    assert_well_formed(&svg);
    // An explicit corner is honoured; none draws none.
    let mut s = spec(Kind::Line, "x", &["a", "b"]);
    s.legend = Legend::Corner(Corner::UpperRight);
    assert_eq!(chart(&s, &table(csv)).unwrap().1.legend, "upper-right");
    s.legend = Legend::None;
    let (svg, sum) = chart(&s, &table(csv)).unwrap();
    assert_eq!(sum.legend, "none");
    assert!(!texts(&svg).iter().any(|t| t == "a"));
}

#[test]
fn diagonal_and_log_axes_labelled_at_every_decade() {
    let csv = "measured,predicted\n0.5,0.6\n3,2.5\n40,45\n700,650\n";
    let mut s = spec(Kind::Scatter, "measured", &["predicted"]);
    s.diagonal = true;
    s.log_x = true;
    s.log_y = true;
    let (svg, sum) = chart(&s, &table(csv)).unwrap();
    assert_well_formed(&svg);
    assert!(svg.contains("y = x"));
    assert_eq!(sum.series[0].points, 4);
    let t = texts(&svg);
    for label in ["1", "10", "100"] {
        assert!(t.iter().any(|x| x == label), "{label} missing from {t:?}");
    }
    // Equal axes: the diagonal needs matching scales.
    s.log_y = false;
    let e = chart(&s, &table(csv)).unwrap_err().to_string();
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
    let mut text = String::from("rule,regret\n");
    for i in 0..10 {
        text.push_str(&format!(
            "ratio,{}\nmodel,{}\n",
            i as f64 / 10.0,
            i as f64 / 100.0
        ));
    }
    let t = table(&text);
    for kind in [Kind::Histogram, Kind::Cdf] {
        let mut s = spec(kind, "regret", &[]);
        s.series = vec!["rule".into()];
        s.bins = 5;
        let (svg, sum) = chart(&s, &t).unwrap();
        assert_well_formed(&svg);
        let ratio = sum.series[0].stats.as_ref().unwrap();
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
            // values fall in the first bin), plus the legend's square; cdf: one line
            // plus the legend's swatch.
            let expected = match (kind, i) {
                (Kind::Histogram, 0) => 5 + 1,
                (Kind::Histogram, _) => 1 + 1,
                _ => 1 + 1,
            };
            assert_eq!(drawn, expected, "{kind:?} series {i} ({hex})");
        }
    }
    // A distribution takes no --y.
    let e = chart(&spec(Kind::Cdf, "regret", &["rule"]), &t)
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
}

#[test]
fn bad_input_gets_errors_that_name_it() {
    let t = table(SWEEP);
    let e = chart(&spec(Kind::Scatter, "stream", &["tok_s"]), &t)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--x stream") && e.contains("streams, strategy"),
        "{e}"
    );
    let e = chart(&spec(Kind::Scatter, "streams", &["strategy"]), &t)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 2") && e.contains("strategy") && e.contains("offload"),
        "{e}"
    );
    let mut s = spec(Kind::Scatter, "streams", &["tok_s"]);
    s.mark_x = vec!["abc:label".into()];
    assert!(chart(&s, &t)
        .unwrap_err()
        .to_string()
        .contains("--mark-x abc:label"));
    s.mark_x = vec![];
    s.filters = vec!["strategy=fused".into()];
    assert!(chart(&s, &t)
        .unwrap_err()
        .to_string()
        .contains("nothing to plot"));
    s.filters = vec!["nostrat".into()];
    assert!(chart(&s, &t).unwrap_err().to_string().contains("COL=VALUE"));
    s.filters = vec![];
    s.labels = vec!["nocol=x".into()];
    assert!(chart(&s, &t)
        .unwrap_err()
        .to_string()
        .contains("--label nocol"));
    s.labels = vec![];
    s.width = 100_000;
    assert!(chart(&s, &t).unwrap_err().to_string().contains("--width"));
    let zero = table("x,y\n0,1\n1,2\n");
    let mut s = spec(Kind::Scatter, "x", &["y"]);
    s.log_x = true;
    let e = chart(&s, &zero).unwrap_err().to_string();
    assert!(e.contains("--log-x") && e.contains("line 2"), "{e}");
    assert!(Table::parse("x,y\n1,2\n3\n", "r.csv").is_err());
    let e = Table::read(Path::new("/nonexistent/none.csv"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("none.csv"), "{e}");
}

#[test]
fn marks_and_filters_parse_with_and_without_labels() {
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
    assert_eq!(
        "lower-right".parse(),
        Ok(Legend::Corner(Corner::LowerRight))
    );
    assert!("middle".parse::<Legend>().is_err());
    assert_eq!("cdf".parse(), Ok(Kind::Cdf));
}
