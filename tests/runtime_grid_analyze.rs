//! `experiments/runtime-grid/analyze.py` on a committed grid: hybrid is judged against
//! offload only beyond the runs' own noise (the larger round spread of the two), so a
//! "favoured" run, a win, a loss and an "UNEXPECTED LOSS" each mean what the summary says.

mod common;

use common::{python, repo_root};

fn num(row: &csv::StringRecord, at: usize) -> f64 {
    row[at]
        .parse()
        .unwrap_or_else(|_| panic!("a number in column {at}: {row:?}"))
}

#[test]
fn hybrid_is_favoured_won_or_lost_only_beyond_the_runs_noise() {
    let committed = repo_root().join("experiments/runtime-grid/results/20261206T0419Z-h100-full");
    let dir = tempfile::tempdir().unwrap();
    // Unpacking the committed reports, then analysing them.
    python([
        std::ffi::OsStr::new("-c"),
        "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])".as_ref(),
        committed.join("json-logs.tar.xz").as_os_str(),
        dir.path().as_os_str(),
    ]);
    python([
        repo_root()
            .join("experiments/runtime-grid/analyze.py")
            .as_os_str(),
        dir.path().as_os_str(),
    ]);

    let mut grid = csv::Reader::from_path(dir.path().join("grid.csv")).expect("grid.csv");
    let header = grid.headers().unwrap().clone();
    let at = |name: &str| header.iter().position(|c| c == name).expect(name);
    let rows: Vec<csv::StringRecord> = grid.records().map(|r| r.unwrap()).collect();
    let spread = |r: &csv::StringRecord| r[at("round_spread")].parse::<f64>().unwrap_or(0.0);
    let offload = |r: &csv::StringRecord| {
        rows.iter()
            .find(|o| {
                &o[at("strategy")] == "offload"
                    && o[at("streams")] == r[at("streams")]
                    && o[at("cache_slots")] == r[at("cache_slots")]
            })
            .expect("offload at the same point")
    };
    let (mut favoured, mut marginal) = (0, 0);
    for r in rows.iter().filter(|r| &r[at("strategy")] == "hybrid") {
        let off = offload(r);
        let noise = spread(r).max(spread(off));
        let (expected, off_layer) = (
            num(r, at("expected_hybrid_layer_us")),
            num(off, at("layer_us")),
        );
        let fav = &r[at("favoured")];
        match fav {
            "True" => {
                favoured += 1;
                assert!(expected < off_layer * (1.0 - noise), "{r:?}");
            }
            "False" => assert!(expected > off_layer * (1.0 + noise), "{r:?}"),
            "marginal" => {
                marginal += 1;
                assert!((expected / off_layer - 1.0).abs() <= noise, "{r:?}");
            }
            other => panic!("favoured is {other}"),
        }
        let vs = num(r, at("vs_offload"));
        let want = if vs > noise {
            "wins"
        } else if vs < -noise {
            "loses"
        } else {
            "ties"
        };
        assert_eq!(&r[at("outcome")], want, "{r:?}");
    }
    assert!(
        favoured > 0 && marginal > 0,
        "the grid has both kinds: {favoured} {marginal}"
    );

    // The summary flags only favoured losses, and counts the runs of each kind.
    let summary = std::fs::read_to_string(dir.path().join("summary.txt")).unwrap();
    for line in summary.lines().filter(|l| l.contains("UNEXPECTED LOSS")) {
        assert!(line.contains(" True "), "{line}");
    }
    assert!(
        summary.contains(&format!(
            "hybrid favoured by the bandwidths beyond the runs' noise: {favoured} run(s)"
        )),
        "{summary}"
    );

    // Offload's ceiling with nothing after the last copy, recomputed from its columns: the
    // bound's time a layer over the link's busy time plus the dense part before the router.
    // It bounds what the run reached, and every run below the target says it.
    let mut below = 0;
    for r in rows.iter().filter(|r| &r[at("strategy")] == "offload") {
        let layers = num(r, at("layers"));
        let bound = num(r, at("pcie_bound_step_us")) / layers;
        let (busy, dense) = (
            num(r, at("pcie_busy_layer_us")),
            num(r, at("idle_dense_us")),
        );
        let ceiling = num(r, at("tail_free_ceiling"));
        assert!((ceiling - bound / (busy + dense)).abs() < 1e-9, "{r:?}");
        assert!(
            (num(r, at("link_busy_rate")) - bound / busy).abs() < 1e-9,
            "{r:?}"
        );
        assert!(ceiling >= num(r, at("share_of_pcie_bound")), "{r:?}");
        if &r[at("meets_pcie_target")] == "False" {
            below += 1;
            let line = summary
                .lines()
                .find(|l| {
                    l.contains(" offload ")
                        && l.contains("BELOW")
                        && l.contains(&format!("{:.0}%", 100.0 * ceiling))
                })
                .unwrap_or_else(|| panic!("no ceiling in the summary for {r:?}"));
            assert!(line.contains("with nothing after the last copy"), "{line}");
        }
    }
    assert!(
        below > 0,
        "the committed grid has offload runs below the target"
    );
}
