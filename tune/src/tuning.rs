//! The tuning loop: run a configuration, calibrate, decide, pick the next, within a budget.
//!
//! One run is: start the engine from the template for one configuration, wait until it
//! answers, run the field report's protocol through `ft_serve::loadgen::replay` (unscored
//! warm-up requests, then measured requests at 1 stream and at each requested concurrency),
//! stop the engine, and append two observations per concurrency to the observations file
//! (client-side end to end and decode only, so a calibration sees prefill apart). After
//! every run the calibrator turns all runs into estimates and [`crate::plan::standing`]
//! says whether the choice is settled and what to run next; once every strategy has been
//! measured, each other cache size is run once ([`TuneConfig::extra_caches`]). The loop ends
//! when the choice is settled (and those runs are made), when the next run would not fit in the wall budget (judged by the longest run so
//! far; a run still going at the budget's end is stopped and discarded), or after
//! `max_runs` runs. An engine that crashes, hangs or fails its requests ends the loop with
//! an error; the guard in [`crate::engine::Engine`] stops it on every path.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ft_model::cache::CacheOptions;
use ft_model::observe::{Measure, Observation, ObservedCache, ObservedStrategy};
use ft_serve::loadgen::{self, DecodeBasis, EndpointKind, ReplayConfig, ReplayReport};
use serde::Serialize;
use tracing::info;

use crate::calib::{BreakEvenSection, Calibrator, Estimate, Question, Target};
use crate::engine::{Engine, EngineSpec};
use crate::error::{Result, TuneError};
use crate::obsfile;
use crate::plan::{self, Standing};
use crate::template::{config_name, Endpoint, Launch, Template};

/// Most runs one tune makes when no `--max-runs` is given: with two to four candidates a
/// settled choice takes a handful; beyond a dozen the budget is the better bound.
pub const DEFAULT_MAX_RUNS: usize = 12;

/// What to tune.
#[derive(Debug, Clone)]
pub struct TuneConfig {
    /// The configurations to choose between, in the order unmeasured ones are run.
    pub candidates: Vec<ObservedStrategy>,
    /// The decision's streams, lengths, measure and cache.
    pub target: Target,
    /// The concurrencies every run measures: 1 and the requested ones
    /// ([`crate::setup::concurrencies`]; the target's among them).
    pub concurrencies: Vec<usize>,
    /// The engine's cache options (policy, topology, slots per layer, admission), recorded
    /// in the runs of cached strategies.
    pub cache_options: CacheOptions,
    /// Other cache sizes, each run once with the leading cached candidate
    /// ([`crate::setup::cache_sizes`]; the template sets them through `{cache_gb}`).
    pub extra_caches: Vec<ObservedCache>,
    /// Unscored warm-up requests per run.
    pub warmup: usize,
    /// The engine's CPU threads, recorded in the observations.
    pub threads: Option<usize>,
    /// The engine's port (0: a free one per run).
    pub port: u16,
    /// Wall budget of the whole tune.
    pub budget: Duration,
    /// Most runs.
    pub max_runs: usize,
    /// Where the observations, the engines' logs and the report go.
    pub out_dir: PathBuf,
    /// This binary's path (`{ft}`).
    pub ft_exe: String,
    /// Per-request timeout of the protocol, s.
    pub request_timeout_s: f64,
    /// Seed of the prompts.
    pub seed: u64,
    /// The model id sent in requests (`None`: the first of `/v1/models`).
    pub model_id: Option<String>,
}

/// One concurrency of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// Concurrent streams.
    pub streams: usize,
    /// Client-side tok/s per stream over the whole request (prefill included).
    pub e2e_tok_s: f64,
    /// Decode tok/s per stream: over the steady window where every stream decodes, or the
    /// mean of the requests' `(n_out - 1) / (t_last - t_first)` ([`Measured::decode_basis`]).
    pub decode_tok_s: f64,
    /// How the decode rate was taken.
    pub decode_basis: DecodeBasis,
    /// Mean time to first token, s.
    pub ttft_s: f64,
}

/// One run of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRecord {
    /// 1-based.
    pub index: usize,
    /// The configuration's name.
    pub config: String,
    /// What was started.
    pub command: Vec<String>,
    /// The strategy's flags.
    pub flags: Vec<String>,
    /// The engine's expert cache in this run.
    pub cache: Option<ObservedCache>,
    /// Seconds from the start of the tune to the start of this run.
    pub started_s: f64,
    /// Seconds the engine took to answer.
    pub ready_s: f64,
    /// Seconds the whole run took (start to stopped).
    pub wall_s: f64,
    /// Per concurrency.
    pub measured: Vec<Measured>,
    /// How the engine ended.
    pub stopped: String,
    /// Why it was run.
    pub why: String,
}

/// A candidate and where it stands at the end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateRow {
    /// The configuration's name.
    pub config: String,
    /// Its estimate at the target, if any.
    pub estimate: Option<Estimate>,
    /// Its prediction from host inputs alone, where the calibrator has a host model.
    pub host_only: Option<f64>,
    /// The interval's bounds.
    pub interval: Option<(f64, f64)>,
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ended {
    /// The best candidate's interval is above every other's.
    Settled,
    /// The next run would not fit in the budget, or one was cut at its end.
    Budget,
    /// `max_runs` runs were made.
    MaxRuns,
}

/// The choice and how to run it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    /// The configuration's name.
    pub config: String,
    /// Its estimate.
    pub estimate: Estimate,
    /// The interval's bounds.
    pub interval: (f64, f64),
    /// The engine's flags for it.
    pub flags: Vec<String>,
    /// The whole command, as tune ran it.
    pub command: Vec<String>,
    /// The runner-up and the margin (tok/s, relative).
    pub runner_up: Option<(String, f64, f64)>,
}

/// Everything a tune did and decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TuneReport {
    /// The engine template's name and file.
    pub engine: String,
    /// The template's file.
    pub template: String,
    /// How runs became estimates.
    pub calibrator: String,
    /// The decision's target.
    pub target: Target,
    /// Runs made by this tune.
    pub runs: Vec<RunRecord>,
    /// Runs read from an earlier tune's observations.
    pub prior_runs: usize,
    /// Every candidate at the end.
    pub candidates: Vec<CandidateRow>,
    /// The choice (`None` if no candidate has an estimate).
    pub choice: Option<Choice>,
    /// Whether the choice is settled, and why the loop ended.
    pub ended: Ended,
    /// The decision's standing at the end.
    pub standing: Standing,
    /// Seconds the tune took.
    pub wall_s: f64,
    /// The budget, s.
    pub budget_s: f64,
    /// The observations file.
    pub observations: PathBuf,
    /// How far each uncertain input must move for the choice to flip.
    pub break_evens: BreakEvenSection,
}

fn endpoint(e: Endpoint) -> EndpointKind {
    match e {
        Endpoint::Completions => EndpointKind::Completions,
        Endpoint::Chat => EndpointKind::Chat,
    }
}

/// A file-name-safe form of a configuration's name.
fn file_stem(config: &str) -> String {
    config
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The observations of one protocol report: per concurrency, one row in each measure the
/// client sees (`client-e2e` with its prompt length, and `decode`), so a calibration sees
/// prefill and decode apart.
fn observations_of(
    report: &ReplayReport,
    strategy: &ObservedStrategy,
    cache: Option<ObservedCache>,
    cfg: &TuneConfig,
    label: &str,
) -> (Vec<Observation>, Vec<Measured>) {
    let mut obs = Vec::new();
    let mut measured = Vec::new();
    for r in &report.runs {
        let ok: Vec<_> = r.streams.iter().filter(|s| s.error.is_none()).collect();
        let n = ok.len().max(1) as f64;
        let prompts: Vec<usize> = ok.iter().filter_map(|s| s.prompt_tokens).collect();
        let prompt_tokens = if prompts.is_empty() {
            cfg.target.prompt_tokens
        } else {
            prompts.iter().sum::<usize>() / prompts.len()
        };
        let output_tokens = (ok.iter().map(|s| s.completion_tokens).sum::<usize>() as f64 / n)
            .round()
            .max(1.0) as usize;
        measured.push(Measured {
            streams: r.concurrency,
            e2e_tok_s: r.mean_e2e_tok_s,
            decode_tok_s: r.decode_tok_s,
            decode_basis: r.decode_basis,
            ttft_s: r.mean_ttft_s,
        });
        for (measure, tok_s) in [
            (Measure::ClientE2e, r.mean_e2e_tok_s),
            (Measure::Decode, r.decode_tok_s),
        ] {
            if !(tok_s.is_finite() && tok_s > 0.0) {
                continue;
            }
            obs.push(Observation {
                row: 0,
                label: Some(format!("{label} x{} {measure}", r.concurrency)),
                strategy: *strategy,
                streams: r.concurrency,
                prompt_tokens,
                output_tokens,
                context: (prompt_tokens + output_tokens / 2).max(1),
                cache: if strategy.needs_cache() { cache } else { None },
                cache_options: strategy.needs_cache().then(|| cfg.cache_options.clone()),
                tok_s_per_stream: tok_s,
                measure,
                miss_rate: None,
                fetched_per_layer: None,
                cpu_per_layer: None,
                layer_us: None,
                threads: cfg.threads,
                derived: vec!["context".into()],
            });
        }
    }
    (obs, measured)
}

/// One run: start, wait, protocol, stop (see the module docs).
async fn run_one(
    template: &Template,
    cfg: &TuneConfig,
    strategy: &ObservedStrategy,
    index: usize,
    deadline: Instant,
) -> Result<(Launch, f64, ReplayReport, String)> {
    let port = if cfg.port == 0 {
        crate::engine::free_port()?
    } else {
        cfg.port
    };
    let launch = template.launch(strategy, port, &cfg.ft_exe)?;
    let spec = EngineSpec {
        argv: launch.argv.clone(),
        env: launch.env.clone(),
        port,
        ready_path: template.file.ready_path.clone(),
        startup_timeout: Duration::from_secs_f64(template.file.startup_timeout_s),
        stop_grace: Duration::from_secs_f64(template.file.stop_grace_s),
        log_stem: cfg
            .out_dir
            .join(format!("run-{index:02}-{}", file_stem(&launch.config))),
    };
    let url = spec.url();
    let mut engine = Engine::spawn(spec)?;
    let ready = engine.wait_ready(Some(deadline)).await?;
    info!(config = %launch.config, ready_s = ready.as_secs_f64(), "engine ready");
    let remaining = deadline.saturating_duration_since(Instant::now());
    let rc = ReplayConfig {
        url: url.clone(),
        model: cfg.model_id.clone(),
        concurrency: cfg.concurrencies.clone(),
        warmup: cfg.warmup,
        prompt_tokens: cfg.target.prompt_tokens,
        chars_per_token: template.file.chars_per_token,
        max_tokens: cfg.target.output_tokens,
        ignore_eos: template.file.ignore_eos,
        endpoint: endpoint(template.file.endpoint),
        seed: cfg.seed,
        timeout_s: cfg.request_timeout_s.min(remaining.as_secs_f64()).max(1.0),
    };
    let protocol_error = |engine: &mut Engine, message: String| {
        engine.check_alive("while it was measured")?;
        Err(TuneError::Protocol {
            url: url.clone(),
            config: launch.config.clone(),
            message,
        })
    };
    let report = match loadgen::replay(&rc).await {
        Ok(r) => r,
        Err(e) => return protocol_error(&mut engine, e.to_string()),
    };
    let failed: Vec<String> = report
        .warmup
        .iter()
        .chain(report.runs.iter().flat_map(|r| r.streams.iter()))
        .filter_map(|s| s.error.clone())
        .collect();
    if let Some(first) = failed.first() {
        let total =
            report.warmup.len() + report.runs.iter().map(|r| r.streams.len()).sum::<usize>();
        return protocol_error(
            &mut engine,
            format!(
                "{} of {total} request(s) failed; the first: {first}",
                failed.len()
            ),
        );
    }
    let stopped = engine.stop()?;
    Ok((launch, ready.as_secs_f64(), report, format!("{stopped:?}")))
}

/// The next run at another cache size, if one is due: once every strategy has been measured
/// at the target, each of `extra_caches` no run has been made at yet is run once, with the
/// cached candidate the estimates put first. A run at one cache cannot tell how speed moves
/// with the cache's residency (the miss rate's terms); one more size can.
fn extra_run(
    runs: &[Observation],
    cfg: &TuneConfig,
    est: &[Option<Estimate>],
    names: &[String],
) -> Option<(ObservedStrategy, Option<ObservedCache>, String)> {
    if plan::first_of_an_unmeasured_strategy(est, names).is_some() {
        return None;
    }
    let cache = *cfg
        .extra_caches
        .iter()
        .find(|c| !runs.iter().any(|o| o.cache == Some(**c)))?;
    let (i, _) = cfg
        .candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.needs_cache())
        .max_by(|(a, _), (b, _)| {
            let t = |i: usize| est[i].map_or(f64::NEG_INFINITY, |e| e.tok_s);
            t(*a).total_cmp(&t(*b)).then(b.cmp(a))
        })?;
    Some((
        cfg.candidates[i],
        Some(cache),
        format!(
            "a cache of {} is run once with the leading cached candidate {}, so the runs tell how speed moves with the cache",
            crate::setup::cache_text(&cache),
            names[i]
        ),
    ))
}

impl TuneConfig {
    /// What tune asks its calibrator, given `runs`.
    pub fn question<'a>(&'a self, runs: &'a [Observation]) -> Question<'a> {
        Question {
            runs,
            candidates: &self.candidates,
            target: &self.target,
        }
    }
}

/// Estimates and standing of the runs so far.
fn assess(
    calibrator: &dyn Calibrator,
    runs: &[Observation],
    cfg: &TuneConfig,
    names: &[String],
) -> Result<(Vec<Option<Estimate>>, Standing)> {
    let est = calibrator.estimate(cfg.question(runs))?;
    let st = plan::standing(&est, names);
    Ok((est, st))
}

/// Run the tune (see the module docs). `prior` are runs of an earlier tune (its
/// observations file); they count as runs made.
pub async fn tune(
    template: &Template,
    cfg: &TuneConfig,
    calibrator: &dyn Calibrator,
    prior: Vec<Observation>,
) -> Result<TuneReport> {
    if cfg.candidates.is_empty() {
        return Err(TuneError::invalid("--strategies", "no candidate to run"));
    }
    for c in &cfg.candidates {
        if c.needs_cache() && cfg.target.cache.is_none() {
            return Err(TuneError::invalid(
                "--cache-gb",
                format!(
                    "{} runs an expert cache: give its size (--cache-gb or --cache-residency) so the runs say what they measured",
                    config_name(c)
                ),
            ));
        }
    }
    if !cfg.extra_caches.is_empty() && !cfg.candidates.iter().any(|c| c.needs_cache()) {
        return Err(TuneError::invalid(
            "--cache-gb",
            "other cache sizes were given, but no candidate runs a cache",
        ));
    }
    if !cfg.concurrencies.contains(&cfg.target.streams) {
        return Err(TuneError::invalid(
            "--streams",
            format!(
                "the decision's {} streams are not among the runs' concurrencies",
                cfg.target.streams
            ),
        ));
    }
    std::fs::create_dir_all(&cfg.out_dir).map_err(|source| TuneError::Io {
        path: cfg.out_dir.display().to_string(),
        source,
    })?;
    let obs_path = cfg.out_dir.join("observations.csv");
    let comment = format!(
        "ft tune: engine {} ({}), {} stream(s), {} prompt and {} output tokens; rows in client-e2e and decode, the decision in {}",
        template.file.name,
        template.path,
        cfg.target.streams,
        cfg.target.prompt_tokens,
        cfg.target.output_tokens,
        obsfile::measure_name(cfg.target.measure)
    );
    let names: Vec<String> = cfg.candidates.iter().map(config_name).collect();
    let start = Instant::now();
    let deadline = start + cfg.budget;
    let prior_runs = prior.len();
    let mut runs = prior;
    let mut records: Vec<RunRecord> = Vec::new();
    let mut longest = Duration::ZERO;
    let ended = loop {
        let (est, st) = assess(calibrator, &runs, cfg, &names)?;
        let extra = extra_run(&runs, cfg, &est, &names);
        if st.settled && extra.is_none() {
            break Ended::Settled;
        }
        if records.len() >= cfg.max_runs {
            break Ended::MaxRuns;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() || remaining < longest {
            break Ended::Budget;
        }
        let (strategy, cache, why) = match extra {
            Some(x) => x,
            None => match st.next {
                Some(next) => (cfg.candidates[next], cfg.target.cache, st.why.clone()),
                None => break Ended::Settled,
            },
        };
        let run_template = match cache.filter(|c| Some(*c) != cfg.target.cache) {
            Some(c) => template.with_value(
                "cache_gb",
                &crate::setup::cache_gb_value(&c).unwrap_or_default(),
            ),
            None => template.clone(),
        };
        let index = records.len() + 1;
        info!(run = index, config = %config_name(&strategy), why = %why, "next run");
        let t0 = Instant::now();
        // A run cut at the budget's end is stopped with the drop's grace: keep it inside.
        let cut = remaining.saturating_sub(crate::engine::DROP_GRACE + Duration::from_secs(1));
        let run =
            tokio::time::timeout(cut, run_one(&run_template, cfg, &strategy, index, deadline))
                .await;
        let (launch, ready_s, report, stopped) = match run {
            Ok(r) => r?,
            // The budget ended mid-run: the engine was dropped (and stopped) with the future.
            Err(_) => break Ended::Budget,
        };
        let wall = t0.elapsed();
        longest = longest.max(wall);
        let label = format!("tune run {index} {}", launch.config);
        let (obs, measured) = observations_of(&report, &strategy, cache, cfg, &label);
        runs.extend(obs);
        for (i, o) in runs.iter_mut().enumerate() {
            o.row = i + 1;
        }
        obsfile::write(&obs_path, &runs, &comment)?;
        records.push(RunRecord {
            index,
            config: launch.config,
            command: launch.argv,
            flags: launch.flags,
            cache,
            started_s: (t0 - start).as_secs_f64(),
            ready_s,
            wall_s: wall.as_secs_f64(),
            measured,
            stopped,
            why,
        });
    };
    if records.is_empty() && prior_runs == 0 && !obs_path.exists() {
        obsfile::write(&obs_path, &runs, &comment)?;
    }
    let (est, standing) = assess(calibrator, &runs, cfg, &names)?;
    let host_only = calibrator.host_only(cfg.question(&runs))?;
    let candidates = names
        .iter()
        .zip(&est)
        .zip(host_only)
        .map(|((n, e), h)| CandidateRow {
            config: n.clone(),
            estimate: *e,
            host_only: h,
            interval: e.map(|e| e.interval()),
        })
        .collect();
    let choice = match standing.best {
        Some(b) => {
            let e = est[b].expect("the best has an estimate");
            let port = if cfg.port == 0 { 8000 } else { cfg.port };
            let launch = template.launch(&cfg.candidates[b], port, &cfg.ft_exe)?;
            Some(Choice {
                config: names[b].clone(),
                estimate: e,
                interval: e.interval(),
                flags: launch.flags,
                command: launch.argv,
                runner_up: standing.runner_up.map(|r| {
                    let er = est[r].expect("the runner-up has an estimate");
                    (
                        names[r].clone(),
                        e.tok_s - er.tok_s,
                        (e.tok_s - er.tok_s) / er.tok_s,
                    )
                }),
            })
        }
        None => None,
    };
    let break_evens = match standing.best {
        // A decision stands without them: a failure is reported, not fatal.
        Some(b) => calibrator
            .break_evens(cfg.question(&runs), b)
            .unwrap_or_else(|e| BreakEvenSection::NotAvailable {
                why: format!("not computed: {e}"),
            }),
        None => BreakEvenSection::NotAvailable {
            why: "no choice to flip".into(),
        },
    };
    Ok(TuneReport {
        break_evens,
        engine: template.file.name.clone(),
        template: template.path.clone(),
        calibrator: calibrator.name(),
        target: cfg.target,
        runs: records,
        prior_runs,
        candidates,
        choice,
        ended: if ended == Ended::Settled || standing.settled {
            Ended::Settled
        } else {
            ended
        },
        standing,
        wall_s: start.elapsed().as_secs_f64(),
        budget_s: cfg.budget.as_secs_f64(),
        observations: obs_path,
    })
}

/// Run `fut` until it ends or Ctrl-C / SIGTERM arrives; on a signal `fut` is dropped, which
/// stops its engine (the guard), and the result is [`TuneError::Interrupted`].
pub async fn until_signal<T>(fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|source| TuneError::Io {
        path: "(SIGTERM handler)".into(),
        source,
    })?;
    tokio::select! {
        r = fut => r,
        _ = tokio::signal::ctrl_c() => Err(TuneError::Interrupted { signal: "SIGINT".into() }),
        _ = term.recv() => Err(TuneError::Interrupted { signal: "SIGTERM".into() }),
    }
}
