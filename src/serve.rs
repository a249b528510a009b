//! `ft serve`: the MoE model behind an OpenAI-compatible HTTP API.
//!
//! At start the strategy is decided once: with `auto`, the performance model predicts every
//! strategy at `--expected-streams` and the fastest feasible one is used; a forced strategy
//! is used as given. The model's parameters come from `--profile` when given, from `--host`
//! (a host spec: a what-if, not this machine) when given, else from the cached profile whose
//! key matches this machine (GPU, driver, CPU, threads, NUMA), this model and this version,
//! and on a CUDA device without one from `ft probe`, run here (at most its 20 s budget) and
//! stored atomically in the profile cache for the next start. A profile fitted at another
//! thread count than this server's CPU pool (`ft probe --threads 15` for a 13-worker pool) is
//! re-expressed at the pool's count (`Profile::at_threads`), and the source says so. With the
//! engine backend, the CPU side's own work is then timed on the engine's bank (the CPU check,
//! `ft_runtime::cpu_check`, about 0.15 s) and set against the profile's check of the same work,
//! and the prediction is made again with the CPU side at that speed
//! (`PerfParams::with_cpu_speed`): a shared host's CPU side moves by up to 3x within minutes,
//! and a profile holds one probe's moment (`--no-cpu-check` keeps the probed speed). On the
//! host-emulated device (nothing real to probe) a missing profile falls back to the default
//! host spec, and the log says so. Either
//! way one line gives the legacy ratio, its threshold and verdict, every prediction with its
//! interval, the choice (or what auto would have chosen) and the margin; it is logged and
//! printed on stdout beside the address (`--json` prints both as JSON). While serving, the
//! server checks realised speed and miss rate against the prediction, refits and, under
//! `auto`, switches between decode steps (see `ft_serve::scheduler`).
//!
//! Prefill runs through the same step path as decode, as batched chunks of the prompt
//! (`--prefill-chunk` tokens of a stream per step, each token one engine row). SIGTERM or
//! Ctrl-C stops accepting and drains the requests in flight, closing what is still open at
//! `--shutdown-deadline-s`; `--header-timeout-s`, `--body-timeout-s` and `--max-body-bytes`
//!
//! The decision is `ft_serve::setup` (and `ft_runtime::profile_select` for where the
//! parameters come from); this file holds the flags, opening the backend and printing.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ft_model::profile_select::PerfSource;
use ft_model::resolve::StrategyRequest;
use ft_model::routing::RoutingProcess;
use ft_model::{FetchFraction, ModelSpec};
use ft_runtime::engine::{BankSource, EngineSettings};
use ft_runtime::profile_select::{self, Selection};
use ft_runtime::Device;
use ft_serve::backend::engine::EngineBackend;
use ft_serve::backend::reference::{ReferenceConfig, ReferenceMoe};
use ft_serve::backend::StepBackend;
use ft_serve::monitor::CheckConfig;
use ft_serve::predict::Corrected;
use ft_serve::scheduler::{SchedulerConfig, SelfCheck};
use ft_serve::setup::{default_pool_threads, Start, StartRequest, HTTP_WORKERS};
use tracing::info;

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// An NVIDIA GPU (needs a build with `--features cuda`).
    Cuda,
    /// The host-emulated device.
    Host,
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The runtime's decode engine (the served model).
    Engine,
    /// The host reference model (`ft-serve`'s tiny f32 MoE; `--model` names only its id).
    Reference,
}

/// Arguments of `ft serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a preset name or a model TOML file.
    #[arg(long, default_value = "qwen3.8-flash-next")]
    pub model: String,
    /// MoE strategy: auto, offload, hybrid[:F], resident, cpu, layer-split:N or
    /// layer-split-cached:N (`--moe-backend` is the reference engine's name for it).
    #[arg(
        long,
        visible_alias = "strategy",
        alias = "moe-backend",
        default_value = "auto"
    )]
    pub moe_strategy: StrategyRequest,
    /// Hybrid's fetch fraction: a number in [0, 1] or `auto` (the model's optimum).
    #[arg(long, default_value = "auto")]
    pub fetch_fraction: String,
    /// Concurrent streams the start-up decision is made for.
    #[arg(long, default_value_t = 1)]
    pub expected_streams: usize,
    /// GPU expert cache, GiB (2^30 bytes); default: what the GPU holds after dense weights,
    /// KV and the reserve (the performance model's rule).
    #[arg(long)]
    pub cache_gb: Option<f64>,
    /// Device.
    #[arg(long, value_enum, default_value = "host")]
    pub device: DeviceArg,
    /// Port on 127.0.0.1 (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Address to bind (default 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,
    /// Run only the first N MoE layers of the model.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Most streams decoded together.
    #[arg(long, default_value_t = 8)]
    pub max_streams: usize,
    /// Most requests waiting for a stream slot (default: --max-streams); more get 429.
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Longest context (prompt + max_tokens), tokens.
    #[arg(long, default_value_t = 4096)]
    pub context_limit: usize,
    /// Prompt tokens a stream pushes per step.
    #[arg(long, default_value_t = 128)]
    pub prefill_chunk: usize,
    /// Predict from this host spec (a preset or a TOML file) instead of this machine's
    /// profile: a what-if (default: the cached profile of this machine, probed on a GPU when
    /// there is none).
    #[arg(long)]
    pub host: Option<String>,
    /// A fitted profile (JSON) to predict from, instead of the cache lookup.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Routing process preset (the prediction's routing and the served router's popularity).
    #[arg(long, default_value = "typical")]
    pub routing: String,
    /// Expert weights from a safetensors checkpoint (tensor names as in `ft_runtime::bank`'s
    /// docs) instead of synthetic ones; `--model` gives the geometry and format the file
    /// must hold. The embedding and LM head stay synthetic from `--seed`.
    #[arg(long, value_name = "FILE")]
    pub expert_weights: Option<std::path::PathBuf>,
    /// Seed of the weights (experts, embedding, head).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU pool worker threads (default: the cores less the decode thread and the HTTP
    /// workers).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Backend.
    #[arg(long, value_enum, default_value = "engine")]
    pub backend: BackendArg,
    /// Decode steps per self-check window.
    #[arg(long, default_value_t = CheckConfig::default().window_steps)]
    pub check_window: usize,
    /// Divergent windows in a row before the server refits.
    #[arg(long, default_value_t = CheckConfig::default().sustain)]
    pub check_sustain: usize,
    /// Do not check realised against predicted speed.
    #[arg(long)]
    pub no_check: bool,
    /// Print the start-up decision and address as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print the start-up decision and exit without serving (from the profile as probed:
    /// the CPU check at start needs the engine's bank).
    #[arg(long)]
    pub predict_only: bool,
    /// Predict from the CPU speed the profile was probed at, without timing the CPU side at
    /// start (see the module docs).
    #[arg(long)]
    pub no_cpu_check: bool,
    /// The engine's settings (`--engine-config FILE`, `--fetch-chunks N`), as `ft run` and
    /// `ft probe` take them: the profile looked up (or probed at start) is the one probed
    /// with them.
    #[command(flatten)]
    pub engine: crate::engine_args::EngineArgs,
    /// The cache served, predicted and probed with (policy, topology, admission).
    #[command(flatten)]
    pub cache_args: crate::cache_args::CacheArgs,
    /// Seconds a client has to send a request's headers (also how long a kept-alive
    /// connection may idle); slower clients are disconnected.
    #[arg(long, default_value_t = ft_serve::http::HEADER_TIMEOUT_S)]
    pub header_timeout_s: f64,
    /// Seconds a client has to send a request's body once its headers are in (408 after).
    #[arg(long, default_value_t = ft_serve::http::BODY_TIMEOUT_S)]
    pub body_timeout_s: f64,
    /// Largest request body, bytes; a larger Content-Length is refused (413) before reading.
    #[arg(long, default_value_t = ft_serve::http::BODY_LIMIT_BYTES)]
    pub max_body_bytes: u64,
    /// Seconds SIGTERM waits for the requests in flight before closing the connections still
    /// open.
    #[arg(long, default_value_t = ft_serve::http::SHUTDOWN_DEADLINE_S)]
    pub shutdown_deadline_s: f64,
}

/// Where the predictions come from (see the module docs and
/// `ft_runtime::profile_select`); `device` is the engine's device, opened before the
/// prediction (`None` for the reference backend).
fn perf_model(
    args: &Args,
    model: &ModelSpec,
    device: Option<&Device>,
    settings: &EngineSettings,
) -> Result<PerfSource> {
    let sel = Selection {
        profile: args.profile.as_deref(),
        host: args.host.as_deref(),
        threads: args.threads.unwrap_or_else(default_pool_threads) as u32,
        fallback_host: ft_model::hosts::DEFAULT_HOST,
        probe: true,
        cache_options: &args.cache_args.options(None)?,
    };
    Ok(profile_select::select(&sel, model, device, settings)?)
}

/// Run `ft serve`.
pub fn run(args: Args) -> Result<()> {
    if let Some(t) = args.threads {
        ft_model::limits::check_threads("--threads", t as u64)?;
    }
    if args.model.ends_with(".safetensors") {
        bail!(
            "--model {}: a safetensors file holds the expert weights, not the geometry: give \
             the model as a preset or TOML and the file as --expert-weights {}",
            args.model,
            args.model
        );
    }
    if let Some(w) = &args.expert_weights {
        if args.backend != BackendArg::Engine {
            bail!(
                "--expert-weights {}: only the engine backend serves checkpoint experts",
                w.display()
            );
        }
        if !w.is_file() {
            bail!("--expert-weights {}: no such file", w.display());
        }
    }
    let mut model =
        ModelSpec::resolve(&args.model).with_context(|| format!("--model {}", args.model))?;
    if let Some(l) = args.layers {
        model = model.first_layers(l)?;
    }
    if args.expected_streams == 0 || args.expected_streams > args.max_streams {
        bail!(
            "--expected-streams {}: must be in 1..={} (--max-streams)",
            args.expected_streams,
            args.max_streams
        );
    }
    let fetch = FetchFraction::parse("--fetch-fraction", &args.fetch_fraction)?;
    let settings = args.engine.settings()?;
    let http = ft_serve::http::HttpConfig::from_flags(
        args.header_timeout_s,
        args.body_timeout_s,
        args.max_body_bytes,
        args.shutdown_deadline_s,
    )?;
    // The engine's device, opened first: the prediction may probe it.
    let device = match args.backend {
        BackendArg::Engine => {
            let name = match args.device {
                DeviceArg::Cuda => "cuda",
                DeviceArg::Host => "host",
            };
            Some(profile_select::open_device(name).context("--device")?)
        }
        BackendArg::Reference => None,
    };
    let mut source = perf_model(&args, &model, device.as_ref(), &settings)?;
    let request = StartRequest {
        strategy: args.moe_strategy,
        fetch,
        expected_streams: args.expected_streams,
        context_limit: args.context_limit,
        cache_gb: args.cache_gb,
        cache_options: args
            .cache_args
            .options(args.cache_gb.map(|_| "--cache-gb"))?,
        routing: args.routing.clone(),
    };
    let mut start = Start::decide(&model, &source, &request)?;
    let auto = start.auto();
    if args.predict_only {
        let (strategy, line) = (start.strategy, &start.line);
        if args.json {
            outln!(
                "{}",
                serde_json::json!({"strategy": strategy, "auto": auto, "decision_line": line, "source": source.label, "engine": settings, "cache": start.predict_config.cache_options, "decision": start.decision})
            )?;
        } else {
            outln!("decision: {line}")?;
        }
        return Ok(());
    }

    let backend: Box<dyn StepBackend> = match args.backend {
        BackendArg::Reference => {
            let mut cfg = ReferenceConfig::tiny(args.seed);
            cfg.max_context = args.context_limit;
            cfg.cache_options = start.predict_config.cache_options.clone();
            cfg.max_streams = args.max_streams;
            Box::new(ReferenceMoe::new(cfg, start.strategy)?)
        }
        BackendArg::Engine => {
            let device = device
                .as_ref()
                .context("the engine backend opened no device")?;
            let cfg = start.engine_config(
                &model,
                settings,
                args.max_streams.max(args.prefill_chunk),
                args.context_limit,
                args.threads.unwrap_or_else(default_pool_threads),
                args.seed,
            );
            let routing = RoutingProcess::preset(&args.routing)
                .with_context(|| format!("--routing {}", args.routing))?;
            info!(
                "building the engine: {} ({} layers, {} cache slots, {settings}) on {}",
                model.name,
                model.geometry.moe_layers,
                start.slots,
                device.kind().name()
            );
            let bank_source = match &args.expert_weights {
                Some(path) => BankSource::Safetensors(path),
                None => BankSource::Seed(args.seed),
            };
            let mut engine =
                EngineBackend::with_bank_source(device, &model, &cfg, &routing, bank_source)
                    .with_context(|| match &args.expert_weights {
                        Some(p) => {
                            format!("building the engine from --expert-weights {}", p.display())
                        }
                        None => "building the engine".to_string(),
                    })?;
            if args.no_cpu_check {
                info!("--no-cpu-check: the CPU side is predicted at the speed the profile was probed at");
            } else {
                start.recheck_cpu(&model, &mut source, &mut engine, args.expected_streams)?;
            }
            Box::new(engine)
        }
    };
    let Start {
        predictor,
        decision,
        strategy,
        line,
        ..
    } = start;
    let source = source.label;
    let info = backend.info();
    let mut sched = SchedulerConfig::for_backend(&info);
    sched.max_streams = args.max_streams;
    sched.max_queue = args.max_queue.unwrap_or(args.max_streams);
    sched.context_limit = args.context_limit;
    sched.prefill_chunk = args.prefill_chunk;
    sched.check = CheckConfig {
        window_steps: args.check_window,
        sustain: args.check_sustain,
        enabled: !args.no_check,
    };
    let check = SelfCheck {
        predictor: Some(Box::new(Corrected::new(predictor))),
        auto,
    };
    let addr = SocketAddr::new(args.bind, args.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(HTTP_WORKERS)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let summary = rt.block_on(async move {
        let (handle, join) = ft_serve::scheduler::spawn(backend, sched, check)?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let bound = listener.local_addr()?;
        if args.json {
            outln!("{}", serde_json::json!({"listening": format!("http://{bound}"), "model": info.model, "strategy": strategy, "auto": auto, "decision_line": line, "source": source, "engine": settings, "decision": decision}))?;
        } else {
            outln!("decision: {line}")?;
            outln!("listening on http://{bound} (model {}, strategy {strategy}, {})", info.model, info.device)?;
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        ft_serve::http::serve(listener, handle, args.seed, http, ft_serve::http::termination_signal()).await?;
        let summary = tokio::task::spawn_blocking(move || join.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the decode thread panicked"))?;
        anyhow::Ok(summary)
    })?;
    info!(
        "stopped after {} steps, {} strategy switch(es), {} divergence(s)",
        summary.steps,
        summary.switches.len(),
        summary.divergences
    );
    Ok(())
}
