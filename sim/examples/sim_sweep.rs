//! The sweep of `experiments/sim-speed` on ft-sim alone: `ft simulate --sweep` without
//! building the `ft` binary (a release build of this crate is enough to time it).
//!
//! `sim_sweep OUT.csv [--steps N] [--warmup N] [--sweep KEY=V1,V2,...]...`: the points of
//! `ft simulate --sweep` with the same axes (in the same order) and its defaults otherwise
//! (host rtx4090-2x-xeon4310, model qwen3.8-flash-next, the typical routing, seed 1, a
//! 1,200-token prompt and 256 output tokens per request, hybrid's fraction and layer
//! split's N from the analytic model where not given), the same CSV rows (`sweep::write_csv`).
//! Prints `points,seconds,events,events_per_s` on stdout.

use std::time::Instant;

use ft_model::strategy::StrategyKind;
use ft_sim::compare::{CacheChoice, CompareConfig};
use ft_sim::sweep::{self, SweepPoint};

fn usage() -> ! {
    eprintln!("usage: sim_sweep OUT.csv [--steps N] [--warmup N] [--sweep KEY=V1,V2,...]...");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let out = args.next().unwrap_or_else(|| usage());
    let mut config = CompareConfig::field_report(1);
    config.cache = CacheChoice::Slots { slots: 2000 };
    let mut axes = Vec::new();
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        let number = || -> u64 {
            value.parse().unwrap_or_else(|_| {
                eprintln!("{flag}: {value} is not a whole number");
                std::process::exit(2)
            })
        };
        match flag.as_str() {
            "--steps" => config.steps = number(),
            "--warmup" => config.warmup_steps = number(),
            "--sweep" => axes.push(sweep::parse_axis(&value).unwrap_or_else(|e| {
                eprintln!("--sweep {value}: {e}");
                std::process::exit(2)
            })),
            _ => usage(),
        }
    }
    let base = SweepPoint {
        host: ft_sim::hosts::DEFAULT_HOST.to_string(),
        model: "qwen3.8-flash-next".to_string(),
        strategy: StrategyKind::Offload,
        config,
    };
    let points = sweep::expand(&base, &axes).unwrap_or_else(|e| {
        eprintln!("sweep: {e}");
        std::process::exit(2)
    });
    let started = Instant::now();
    let rows = sweep::run_sweep(&points, false, &|_, _| {}).unwrap_or_else(|e| {
        eprintln!("sweep: {e}");
        std::process::exit(1)
    });
    let secs = started.elapsed().as_secs_f64();
    let events: u64 = rows.iter().map(|r| r.events).sum();
    let file = std::fs::File::create(&out).unwrap_or_else(|e| {
        eprintln!("{out}: {e}");
        std::process::exit(2)
    });
    sweep::write_csv(&rows, file).expect("the sweep's rows are written");
    println!("points,seconds,events,events_per_s");
    println!(
        "{},{secs:.3},{events},{:.0}",
        rows.len(),
        events as f64 / secs
    );
}
