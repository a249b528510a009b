//! `ft plot` end to end: the thin binary over `ft_plot::chart` reads a CSV, writes an SVG
//! that parses, prints its summary as JSON (readable series names, the split of a zig-zag
//! line, where the legend went), and refuses bad input with exit 2 and the input named.

mod common;
use common::{assert_ok, ft, json_ok, stderr, write};

/// A sweep of hybrid at two fetch fractions per stream count, beside offload.
const SWEEP: &str = "streams,strategy,fetch_fraction,sim_tok_s_total\n\
    1,offload,1.0,40\n2,offload,1.0,43\n4,offload,1.0,50\n\
    1,hybrid,0.3,60\n1,hybrid,0.6,55\n2,hybrid,0.3,70\n2,hybrid,0.6,75\n\
    4,hybrid,0.3,80\n4,hybrid,0.6,90\n";

#[test]
fn plot_writes_an_svg_and_a_summary_with_readable_series() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write(dir.path(), "sweep.csv", SWEEP);
    let svg = dir.path().join("figs/sweep.svg");
    let out = ft(&[
        "plot",
        &csv,
        "-o",
        svg.to_str().unwrap(),
        "--kind",
        "line",
        "--x",
        "streams",
        "--log-x",
        "--y",
        "sim_tok_s_total",
        "--series",
        "strategy",
        "--json",
    ]);
    let s = json_ok(&out);
    assert_eq!(s["split_by"], "fetch_fraction");
    let names: Vec<&str> = s["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "offload, fetch fraction 1.0",
            "hybrid, fetch fraction 0.3",
            "hybrid, fetch fraction 0.6"
        ]
    );
    assert!(s["legend"].as_str().is_some_and(|l| l != "none"), "{s}");
    let text = std::fs::read_to_string(&svg).expect("the SVG, its folder created");
    let doc = roxmltree::Document::parse(&text).expect("the SVG parses as XML");
    let texts: Vec<&str> = doc
        .descendants()
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    // The y axis reads as words with its unit; the names are in the legend.
    assert!(texts.contains(&"simulator total (tok/s)"), "{texts:?}");
    for n in names {
        assert!(texts.contains(&n), "{n} missing");
    }
    // The human twin.
    let out = ft(&[
        "plot",
        &csv,
        "-o",
        svg.to_str().unwrap(),
        "--x",
        "streams",
        "--y",
        "sim_tok_s_total",
    ]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("wrote "));
}

#[test]
fn plot_refuses_bad_input_with_exit_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write(dir.path(), "sweep.csv", SWEEP);
    let svg = dir.path().join("x.svg");
    let svg = svg.to_str().unwrap();
    for (args, names) in [
        (
            vec!["--x", "stream", "--y", "sim_tok_s_total"],
            "--x stream",
        ),
        (vec!["--x", "streams", "--y", "strategy"], "line 2"),
        (
            vec![
                "--x",
                "streams",
                "--y",
                "sim_tok_s_total",
                "--legend",
                "middle",
            ],
            "middle",
        ),
        (
            vec![
                "--x",
                "streams",
                "--y",
                "sim_tok_s_total",
                "--width",
                "99999",
            ],
            "--width",
        ),
    ] {
        let mut a = vec!["plot", csv.as_str(), "-o", svg];
        a.extend(args.iter().copied());
        let out = ft(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(names), "{a:?}: {}", stderr(&out));
    }
}
