//! What `ft serve` decides before it serves: the strategy, from the performance model's
//! prediction at `expected_streams` (the fastest feasible one under `auto`, a forced one
//! with its `auto` parameter taken from the prediction), the cache it is served with, the
//! engine's configuration, and the same decision again at the CPU side's speed measured on
//! the engine's bank at start (a shared host's CPU side moves by up to 3x within minutes,
//! and a profile holds one probe's moment).
//!
//! Where the parameters come from (a profile, a host spec, this machine's cached or probed
//! profile) is `ft_runtime::profile_select`; the serving itself is [`crate::scheduler`] and
//! [`crate::http`].

use ft_model::cache::{CacheOptions, CacheSize};
use ft_model::perf::predict::default_cache_slots;
use ft_model::perf::PredictConfig;
use ft_model::profile::CpuCheck;
use ft_model::profile_select::PerfSource;
use ft_model::report::CheckedSpeed;
use ft_model::resolve::StrategyRequest;
use ft_model::{CpuLayers, FetchFraction, ModelSpec, Strategy, StrategyKind};
use ft_runtime::engine::{EngineConfig, EngineSettings};
use tracing::info;

use crate::backend::engine::EngineBackend;
use crate::backend::StepBackend;
use crate::error::{Result, ServeError};
use crate::perf_adapter::PerfPredictor;
use crate::predict::{Decision, Predictor};

/// Context length the start-up prediction is made at, tokens: the field report's protocol
/// (prompts of about 1.2K tokens, 256 output tokens) sits between 1.2K and 1.45K.
pub const PREDICT_CONTEXT_TOKENS: usize = 1280;

/// Tokio worker threads for HTTP (the decode loop has its own thread; the CPU pool its own).
pub const HTTP_WORKERS: usize = 2;

/// CPU pool workers when none are given: the cores less the decode thread and the HTTP
/// workers. The pool spins between layers; a worker that shares its core with another busy
/// thread is descheduled mid-layer and the whole layer waits for it (on the H200's 16
/// cores, 15 workers beside the server's threads made hybrid's tok/s swing by 2x between
/// identical services).
pub fn default_pool_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_sub(1 + HTTP_WORKERS).max(1)
}

/// What the start-up decision is asked.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The strategy asked for (`--moe-strategy`): auto, or a strategy.
    pub strategy: StrategyRequest,
    /// Hybrid's fetch fraction where the strategy names none (`--fetch-fraction`).
    pub fetch: FetchFraction,
    /// Concurrent streams the decision is made for.
    pub expected_streams: usize,
    /// Longest context served, tokens.
    pub context_limit: usize,
    /// The GPU expert cache, GiB (default: the performance model's rule).
    pub cache_gb: Option<f64>,
    /// The cache's policy, topology and admission.
    pub cache_options: CacheOptions,
    /// Routing process preset.
    pub routing: String,
}

/// The decision at start, and what serving it needs.
pub struct Start {
    /// The strategy given (hybrid's fraction from `fetch` where it names none); `None` for
    /// auto.
    pub requested: Option<Strategy>,
    /// The prediction's configuration (the self-check predicts with it too).
    pub predict_config: PredictConfig,
    /// Cache slots of the engine.
    pub slots: usize,
    /// The predictor the decision came from.
    pub predictor: PerfPredictor,
    /// The decision.
    pub decision: Decision,
    /// The strategy served.
    pub strategy: Strategy,
    /// The decision in one line (logged and printed).
    pub line: String,
}

impl Start {
    /// Predict every strategy for `model` from `source` and decide. What would flip the
    /// choice (the break-evens) is logged beside it, never a reason not to serve.
    pub fn decide(model: &ModelSpec, source: &PerfSource, req: &StartRequest) -> Result<Start> {
        // The strategy asked for, hybrid's fraction from `fetch` where it names none.
        let requested = match req.strategy {
            StrategyRequest::Auto => None,
            StrategyRequest::Given(Strategy::Hybrid {
                fetch: FetchFraction::Auto,
            }) => Some(Strategy::Hybrid { fetch: req.fetch }),
            StrategyRequest::Given(s) => Some(s),
        };
        let context = PREDICT_CONTEXT_TOKENS.min(req.context_limit);
        let cache = req.cache_gb.map(CacheSize::GiB);
        let predict_config = PredictConfig {
            streams: req.expected_streams,
            context,
            cache,
            cache_options: req.cache_options.clone(),
            routing: req.routing.clone(),
            hybrid_fetch: match requested {
                Some(Strategy::Hybrid { fetch }) => fetch,
                _ => FetchFraction::Auto,
            },
            // Layer split is predicted (its N searched or taken) where it was asked for.
            layer_split: requested.and_then(|s| s.cpu_layers()),
            ..PredictConfig::default()
        };
        let perf = &source.perf;
        let slots = match cache {
            Some(c) => c.slots(model.expert_bytes(), model.geometry.total_experts())?,
            None => default_cache_slots(model, &perf.params, req.expected_streams, context),
        };
        let slots = predict_config
            .cache_options
            .fit_slots(slots, model.geometry.moe_layers)?;
        let predictor = PerfPredictor::new(
            model.clone(),
            perf.clone(),
            predict_config.clone(),
            source.samples.clone(),
        );
        let t0 = std::time::Instant::now();
        let decision = predictor
            .predict(req.expected_streams)
            .map_err(|e| ServeError::context("predicting the strategies at start", e))?;
        info!(
            "prediction took {:.2} s ({})",
            t0.elapsed().as_secs_f64(),
            source.label
        );
        let strategy = choose(requested, &decision);
        let line = decision.log_line(requested.map(|_| &strategy));
        info!("decision: {line}");
        let flips = ft_model::perf::predict(model, perf, &predict_config).and_then(|p| {
            let d = ft_model::perf::decide(&p);
            ft_model::perf::breakeven::break_evens(model, perf, &predict_config, &p, d.kind)
        });
        match flips {
            Ok(b) => info!("break-evens: {}", b.one_line()),
            Err(e) => tracing::warn!("break-evens: not computed: {e}"),
        }
        Ok(Start {
            requested,
            predict_config,
            slots,
            predictor,
            decision,
            strategy,
            line,
        })
    }

    /// Whether the model chooses (`auto`) rather than the strategy being forced.
    pub fn auto(&self) -> bool {
        self.requested.is_none()
    }

    /// The engine's configuration for the decided strategy: `max_streams` rows (at least a
    /// prefill chunk's), both sides' activations quantized to int8 where the format has that
    /// path, as the reference engine does (an expert's output is the same wherever it ran;
    /// bf16 experts run in f32).
    pub fn engine_config(
        &self,
        model: &ModelSpec,
        settings: EngineSettings,
        rows: usize,
        max_context: usize,
        threads: usize,
        seed: u64,
    ) -> EngineConfig {
        EngineConfig {
            strategy: self.strategy,
            cache_slots: self.slots,
            cache_options: self.predict_config.cache_options.clone(),
            max_streams: rows,
            max_context,
            seed,
            gpu_path: ft_kernels::ActivationPath::preferred(model.format),
            cpu_path: ft_kernels::ActivationPath::preferred(model.format),
            settings,
            threads,
            ..EngineConfig::default()
        }
    }

    /// Decide again with the CPU side at the speed the CPU check on `engine`'s bank measures
    /// now against `source`'s check of the same work (`PerfModel::at_cpu_speed`); switch
    /// `engine` where the choice changes (not between layer splits and the others: their
    /// resident slots are fixed at start). `source.label` then says where the speed came
    /// from. Leaves everything as it is where the profile holds no check of this work.
    pub fn recheck_cpu(
        &mut self,
        model: &ModelSpec,
        source: &mut PerfSource,
        engine: &mut EngineBackend,
        expected_streams: usize,
    ) -> Result<()> {
        let Some(checked) = cpu_speed_at_start(engine, &source.cpu_checks)? else {
            return Ok(());
        };
        let scaled = checked
            .scale(&source.perf, "at start")
            .map_err(|e| ServeError::context("scaling the CPU side by the check at start", e))?;
        source.label = scaled.source.clone();
        info!("{}", source.label);
        self.predictor = PerfPredictor::new(
            model.clone(),
            scaled,
            self.predict_config.clone(),
            source.samples.clone(),
        );
        self.decision = self
            .predictor
            .predict(expected_streams)
            .map_err(|e| ServeError::context("predicting the strategies after the CPU check", e))?;
        let now_choice = choose(self.requested, &self.decision);
        let strategy = self.strategy;
        let other_slots =
            now_choice.kind().takes_cpu_layers() || strategy.kind().takes_cpu_layers();
        if now_choice != strategy && other_slots {
            // Layer split's resident layers are the engine's own slots: another N needs
            // another engine.
            tracing::warn!("the CPU check would change the strategy from {strategy} to {now_choice}; keeping {strategy} (layer split's resident slots are fixed at start)");
        } else if now_choice != strategy {
            info!("the CPU check changes the strategy from {strategy} to {now_choice}");
            engine.set_strategy(now_choice).map_err(|e| {
                ServeError::context("switching to the strategy the CPU check chose", e)
            })?;
            self.strategy = now_choice;
        }
        self.line = self
            .decision
            .log_line(self.requested.map(|_| &self.strategy));
        info!("decision: {}", self.line);
        Ok(())
    }
}

/// The strategy served for `decision`: its choice under auto, else the forced one.
fn choose(requested: Option<Strategy>, decision: &Decision) -> Strategy {
    match requested {
        None => decision.choice,
        Some(s) => forced(s, decision),
    }
}

/// A forced strategy with its `auto` parameter (hybrid's F, layer split's N) taken from the
/// decision's estimate of it.
pub fn forced(strategy: Strategy, decision: &Decision) -> Strategy {
    let estimated = |k: StrategyKind| decision.estimate(k).map(|e| e.strategy);
    match strategy {
        Strategy::Hybrid {
            fetch: FetchFraction::Auto,
        } => estimated(StrategyKind::Hybrid).unwrap_or(Strategy::Hybrid {
            fetch: FetchFraction::Fixed(0.5),
        }),
        // Without an estimate the engine refuses the unresolved N, naming the flag.
        Strategy::LayerSplit {
            cpu_layers: CpuLayers::Auto,
        }
        | Strategy::LayerSplitCached {
            cpu_layers: CpuLayers::Auto,
        } => estimated(strategy.kind()).unwrap_or(strategy),
        Strategy::Offload
        | Strategy::Resident
        | Strategy::Cpu
        | Strategy::Hybrid {
            fetch: FetchFraction::Fixed(_),
        }
        | Strategy::LayerSplit {
            cpu_layers: CpuLayers::Fixed(_),
        }
        | Strategy::LayerSplitCached {
            cpu_layers: CpuLayers::Fixed(_),
        } => strategy,
    }
}

/// The CPU check at start: the CPU side's own work timed on the engine's bank
/// (`ft_runtime::cpu_check`) against the profile's check of the same work. Returns the
/// speed (how many times faster the CPU side runs now than when probed) with both checks,
/// which [`CheckedSpeed::scale`] scales a model by, or `None` where the profile holds no check of this work (a host spec, an older profile,
/// a thread count the probe did not check; logged).
pub fn cpu_speed_at_start(
    engine: &mut EngineBackend,
    checks: &[CpuCheck],
) -> Result<Option<CheckedSpeed>> {
    if checks.is_empty() {
        info!("the profile holds no CPU check: the CPU side is predicted as probed");
        return Ok(None);
    }
    let now = engine
        .cpu_check(ft_runtime::cpu_check::CHECK_BUDGET)
        .map_err(|e| ServeError::context("the CPU check at start", e))?;
    let checked = CheckedSpeed::against(checks, now).map_err(|e| {
        ServeError::context("setting the CPU check at start against the profile's", e)
    })?;
    if checked.is_none() {
        info!(
            threads = now.threads,
            "the profile holds no CPU check of this work (other threads or expert size): the CPU side is predicted as probed"
        );
    }
    Ok(checked)
}
