//! `ft tune`: probe a served OpenAI-compatible engine, configuration by configuration, and
//! decide its strategy from the runs (`ft_tune`; `docs/tune.md`). A table on stdout, or
//! `--json`; the engines' logs and the observations CSV under `--out`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ft_model::observe::Measure;
use ft_model::perf::PerfModel;
use ft_model::profile::Profile;
use ft_model::ModelSpec;
use ft_tune::calib::{Calibrator, Measured, Target, DEFAULT_REL_NOISE};
use ft_tune::setup;
use ft_tune::template::Template;
use ft_tune::tuning::{self, TuneConfig, DEFAULT_MAX_RUNS};

/// `--measure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MeasureArg {
    /// A client's output tokens over the whole request, prefill included (the field report's).
    ClientE2e,
    /// Tokens after the first over first-to-last token time, as the client sees them.
    Decode,
}

/// Arguments of `ft tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The engine's command template (TOML; docs/templates/ has ft-serve, freetoken and
    /// llama-server).
    #[arg(long, value_name = "FILE")]
    pub template: PathBuf,
    /// A placeholder's value, `name=value` (repeatable); overrides the template's [vars].
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub sets: Vec<String>,
    /// The engine's model ({model}).
    #[arg(long)]
    pub model: Option<String>,
    /// The engine's CPU threads ({threads}; recorded in the runs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The engine's GPU expert cache, GiB ({cache_gb}; recorded in the runs): the first is
    /// the decision's; each other size is run once to tell how speed moves with the cache.
    #[arg(long, value_delimiter = ',', conflicts_with = "cache_residency")]
    pub cache_gb: Vec<f64>,
    /// The engine's expert cache as the share of all experts it holds (recorded in the runs).
    #[arg(long, value_delimiter = ',')]
    pub cache_residency: Vec<f64>,
    /// The engine's cache options (recorded in the runs of cached strategies, and the
    /// calibrated model's cache).
    #[command(flatten)]
    pub cache_options: crate::cache_args::CacheArgs,
    /// Strategies to choose between (default: every one the template maps).
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Hybrid's fetch fractions to try (where the template's flags set it).
    #[arg(long, value_delimiter = ',', default_value = "0.5")]
    pub fetch_fractions: Vec<f64>,
    /// Layer splits' N (MoE layers on the CPU) to try.
    #[arg(long, value_delimiter = ',')]
    pub cpu_layers: Vec<usize>,
    /// Concurrent streams: the first is the decision's; every run measures 1 and each.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub streams: Vec<usize>,
    /// Prompt length, tokens.
    #[arg(long, default_value_t = 1200)]
    pub prompt_tokens: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 256)]
    pub output_tokens: usize,
    /// Unscored warm-up requests per run.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// What tok/s the decision is about.
    #[arg(long, value_enum, default_value = "client-e2e")]
    pub measure: MeasureArg,
    /// The engine's port (0: a free one per run).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Wall budget of the whole tune, s.
    #[arg(long, default_value_t = 300.0)]
    pub budget_s: f64,
    /// Most runs.
    #[arg(long, default_value_t = DEFAULT_MAX_RUNS)]
    pub max_runs: usize,
    /// Folder of the observations, the engines' logs and the report.
    #[arg(long, default_value = "ft-tune")]
    pub out: PathBuf,
    /// Start from the runs already in --out's observations.csv.
    #[arg(long)]
    pub resume: bool,
    /// Per-request timeout, s.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout_s: f64,
    /// Seed of the prompts.
    #[arg(long, default_value_t = 2024)]
    pub seed: u64,
    /// Model id sent in requests (default: the first of /v1/models).
    #[arg(long)]
    pub served_model: Option<String>,
    /// Host inputs for the calibrated model: a host preset or host TOML (`ft host init`).
    /// Without it or --profile, each configuration is judged by its own runs alone.
    #[arg(long, conflicts_with = "profile")]
    pub host: Option<String>,
    /// A profile (JSON: `ft probe`'s, or `ft calibrate --out`'s) as the host model.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// The served model's geometry for the calibrated model: a preset, a model TOML, a
    /// config.json or a GGUF file (default: --model).
    #[arg(long)]
    pub geometry: Option<String>,
    /// Relative run-to-run noise assumed for a configuration run once.
    #[arg(long, default_value_t = DEFAULT_REL_NOISE)]
    pub rel_noise: f64,
    /// JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Longest budget, s (a day: beyond it a tune is a benchmark campaign).
const MAX_BUDGET_S: f64 = 86_400.0;

/// Context the engine is started with, from the protocol's lengths: room for a BPE
/// tokenizer's miscount of the synthetic prompt (a quarter) and the chat template's tokens.
fn context_for(prompt: usize, output: usize) -> usize {
    (prompt + output) * 5 / 4 + 64
}

fn parse_sets(sets: &[String]) -> Result<Vec<(String, String)>> {
    sets.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.to_string()))
                .filter(|(k, _)| !k.is_empty())
                .with_context(|| format!("invalid --set {s:?}: write NAME=VALUE"))
        })
        .collect()
}

fn validate(args: &Args) -> Result<()> {
    let tokens = ft_model::observe::MAX_OBSERVED_TOKENS;
    if args.output_tokens == 0 || args.output_tokens > tokens || args.prompt_tokens > tokens {
        bail!("invalid --prompt-tokens/--output-tokens: output in [1, {tokens}], prompt at most {tokens}");
    }
    if !(args.budget_s.is_finite() && args.budget_s > 0.0 && args.budget_s <= MAX_BUDGET_S) {
        bail!(
            "invalid --budget-s: {} is outside (0, {MAX_BUDGET_S}]",
            args.budget_s
        );
    }
    if !(args.request_timeout_s.is_finite() && args.request_timeout_s > 0.0) {
        bail!("invalid --request-timeout-s: must be positive");
    }
    if !(args.rel_noise.is_finite() && args.rel_noise > 0.0 && args.rel_noise < 1.0) {
        bail!("invalid --rel-noise: {} is outside (0, 1)", args.rel_noise);
    }
    if args.max_runs == 0 {
        bail!("invalid --max-runs: at least 1");
    }
    Ok(())
}

/// The calibrated model where host inputs are given, else the runs alone.
fn calibrator(args: &Args, cache: &ft_model::CacheOptions) -> Result<Box<dyn Calibrator>> {
    let measured = Measured {
        rel_noise: args.rel_noise,
    };
    let base = match (&args.host, &args.profile) {
        (None, None) => return Ok(Box::new(measured)),
        (Some(h), _) => {
            let spec = ft_sim::hosts::resolve_spec(h).with_context(|| format!("--host {h}"))?;
            PerfModel::from_host(&spec).with_context(|| format!("--host {h}"))?
        }
        (None, Some(p)) => {
            let label = format!("profile {}", p.display());
            Profile::read(p)
                .with_context(|| format!("--profile {}", p.display()))?
                .perf_model(&label)
        }
    };
    let Some(geometry) = args.geometry.as_ref().or(args.model.as_ref()) else {
        bail!("invalid --geometry: the calibrated model needs the served model's geometry (--geometry, or a --model ft can read)");
    };
    let model = ModelSpec::resolve(geometry).with_context(|| {
        format!("--geometry {geometry} (the served model's geometry: a preset, a model TOML, a config.json or a GGUF file)")
    })?;
    let mut m = ft_tune::model_calib::Model::new(model, base, args.rel_noise);
    m.config.sampling.cache = cache.clone();
    Ok(Box::new(m))
}

/// Run `ft tune`.
pub fn run(args: Args) -> Result<()> {
    validate(&args)?;
    let sets = parse_sets(&args.sets)?;
    let context = context_for(args.prompt_tokens, args.output_tokens);
    let concurrencies = setup::concurrencies(&args.streams)?;
    let max_streams = concurrencies.iter().copied().max().unwrap_or(1);
    let flags = [
        ("model", args.model.clone()),
        ("threads", args.threads.map(|t| t.to_string())),
        ("cache_gb", args.cache_gb.first().map(|g| g.to_string())),
        ("max_streams", Some(max_streams.to_string())),
        ("context", Some(context.to_string())),
        ("total_context", Some((context * max_streams).to_string())),
    ];
    let template = Template::load(&args.template, &sets, &flags)?;
    let candidates = setup::candidates(
        &template,
        &args.strategies,
        &args.fetch_fractions,
        &args.cpu_layers,
    )?;
    let (cache, extra_caches) =
        setup::cache_sizes(&template, &args.cache_gb, &args.cache_residency)?;
    let cache_options = args
        .cache_options
        .options(None)
        .context("the engine's cache options")?;
    let prior = if args.resume {
        let p = args.out.join("observations.csv");
        if p.exists() {
            ft_model::observe::read_observations(&p)?
        } else {
            Vec::new()
        }
    } else {
        Vec::new()
    };
    let cfg = TuneConfig {
        candidates,
        target: Target {
            streams: args.streams[0],
            prompt_tokens: args.prompt_tokens,
            output_tokens: args.output_tokens,
            measure: match args.measure {
                MeasureArg::ClientE2e => Measure::ClientE2e,
                MeasureArg::Decode => Measure::Decode,
            },
            cache,
        },
        concurrencies,
        extra_caches,
        cache_options: cache_options.clone(),
        warmup: args.warmup,
        threads: args.threads,
        port: args.port,
        budget: Duration::from_secs_f64(args.budget_s),
        max_runs: args.max_runs,
        out_dir: args.out.clone(),
        ft_exe: std::env::current_exe()
            .context("this binary's path ({ft})")?
            .display()
            .to_string(),
        request_timeout_s: args.request_timeout_s,
        seed: args.seed,
        model_id: args.served_model.clone(),
    };
    if !args.resume && args.out.join("observations.csv").exists() {
        bail!(
            "{}: holds an earlier tune's observations; pass --resume to build on them or another --out",
            args.out.display()
        );
    }
    let calibrator = calibrator(&args, &cache_options)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = rt.block_on(tuning::until_signal(tuning::tune(
        &template,
        &cfg,
        calibrator.as_ref(),
        prior,
    )))?;
    let json = serde_json::to_string_pretty(&report)?;
    let report_path = args.out.join("report.json");
    std::fs::write(&report_path, &json)
        .with_context(|| format!("writing {}", report_path.display()))?;
    if args.json {
        outln!("{json}")?;
    } else {
        outln!("{}", report.table())?;
    }
    Ok(())
}
