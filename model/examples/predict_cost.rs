//! What a prediction and its break-evens cost, apart: the wall time (median of the
//! repetitions, in s) of [`ft_model::perf::predict`] and of its break-evens
//! ([`ft_model::perf::breakeven::break_evens`]: the scenario's traffic, then the search of
//! every input) with `ft predict`'s defaults (the default host and model, layer split
//! searched). The break-evens are timed twice: from the prediction's own counting runs (as
//! `ft predict` makes them) and from a copy of the prediction read back from JSON, which
//! keeps no runs, so its scenario counts them again.
//!
//! Why it exists: `ft predict`, `ft explain` and `ft serve`'s start line compute break-evens
//! after the prediction; this says what they add, without a second build of the binary.
//!
//! ```sh
//! cargo run --release -p ft-model --example predict_cost -- [repetitions] [streams]
//! ```

use std::time::Instant;

use ft_model::perf::breakeven::Scenario;
use ft_model::perf::{decide, predict, PredictConfig, Prediction};
use ft_model::{hosts, CpuLayers, ModelSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let reps: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    let streams: usize = args.next().map_or(Ok(1), |a| a.parse())?;
    let model = ModelSpec::preset("qwen3.8-flash-next")?;
    let host = hosts::resolve(hosts::DEFAULT_HOST)?;
    let config = PredictConfig {
        streams,
        layer_split: Some(CpuLayers::Auto),
        ..PredictConfig::default()
    };
    // Seconds of: predict, scenario and search from the prediction's runs, and the same
    // counting again.
    let mut t: [Vec<f64>; 5] = Default::default();
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        let pred = predict(&model, &host.perf, &config)?;
        t[0].push(start.elapsed().as_secs_f64());
        let d = decide(&pred);
        let cold: Prediction = serde_json::from_value(serde_json::to_value(&pred)?)?;
        for (i, p) in [(1, &pred), (3, &cold)] {
            // `break_evens` is these two steps.
            let start = Instant::now();
            let scenario = Scenario::new(&model, &host.perf, &config, p, d.kind)?;
            t[i].push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            std::hint::black_box(scenario.report(config.streams, config.context)?);
            t[i + 1].push(start.elapsed().as_secs_f64());
        }
    }
    let m: Vec<f64> = t
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect();
    println!(
        "{{\"reps\": {}, \"streams\": {streams}, \"predict_s\": {:.4}, \
         \"break_evens_s\": {:.4}, \"scenario_s\": {:.4}, \"search_s\": {:.4}, \
         \"break_evens_recounted_s\": {:.4}, \"scenario_recounted_s\": {:.4}}}",
        reps.max(1),
        m[0],
        m[1] + m[2],
        m[1],
        m[2],
        m[3] + m[4],
        m[3]
    );
    Ok(())
}
