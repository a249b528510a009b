//! `ft loadgen`: the field report's A/B protocol (or a loopback stress test) against any
//! OpenAI-compatible server. Results: a table on stdout, or `--json`.

use anyhow::{Context, Result};
use ft_serve::loadgen::{EndpointKind, ReplayConfig, StressConfig};

/// `--endpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EndpointArg {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// Arguments of `ft loadgen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Model id (default: the first of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Concurrencies, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub streams: Vec<usize>,
    /// Unscored warm-up requests first (0 for a fresh service).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Prompt length, tokens.
    #[arg(long, default_value_t = 1200)]
    pub prompt_tokens: usize,
    /// Characters per token of the server's tokenizer (1 for ft serve; ~4 for BPE).
    #[arg(long, default_value_t = 1.0)]
    pub chars_per_token: f64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Do not send `ignore_eos` (a server may then stop early).
    #[arg(long)]
    pub no_ignore_eos: bool,
    /// Endpoint.
    #[arg(long, value_enum, default_value = "completions")]
    pub endpoint: EndpointArg,
    /// Seed of the prompts.
    #[arg(long, default_value_t = 2024)]
    pub seed: u64,
    /// Per-request timeout, s.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_s: f64,
    /// Run the loopback stress test instead, with this many concurrent clients.
    #[arg(long)]
    pub stress_clients: Option<usize>,
    /// Stress: requests in all.
    #[arg(long, default_value_t = 256)]
    pub stress_requests: usize,
    /// Stress: share of clients that disconnect mid-stream.
    #[arg(long, default_value_t = 0.25)]
    pub disconnect_fraction: f64,
    /// Stress: distinct prompts.
    #[arg(long, default_value_t = 8)]
    pub stress_prompts: usize,
    /// Stress: wall-clock bound, s.
    #[arg(long, default_value_t = 60.0)]
    pub duration_limit_s: f64,
    /// JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Run `ft loadgen`.
pub fn run(args: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if let Some(clients) = args.stress_clients {
        let cfg = StressConfig {
            url: args.url.clone(),
            clients,
            requests: args.stress_requests,
            prompts: args.stress_prompts,
            disconnect_fraction: args.disconnect_fraction,
            prompt_chars: (args.prompt_tokens as f64 * args.chars_per_token).round() as usize,
            max_tokens: args.max_tokens,
            duration_limit_s: args.duration_limit_s,
            seed: args.seed,
        };
        let report = rt.block_on(ft_serve::loadgen::stress(&cfg))?;
        if args.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"config": cfg, "report": report})
                )?
            )?;
        } else {
            print!("{}", report.table());
        }
        if !report.passed() {
            return Err(crate::CheckFailed("the stress test lost, duplicated or corrupted a response, or the server did not recover".into()).into());
        }
        return Ok(());
    }
    let cfg = ReplayConfig {
        url: args.url,
        model: args.model,
        concurrency: args.streams,
        warmup: args.warmup,
        prompt_tokens: args.prompt_tokens,
        chars_per_token: args.chars_per_token,
        max_tokens: args.max_tokens,
        ignore_eos: !args.no_ignore_eos,
        endpoint: match args.endpoint {
            EndpointArg::Completions => EndpointKind::Completions,
            EndpointArg::Chat => EndpointKind::Chat,
        },
        seed: args.seed,
        timeout_s: args.timeout_s,
    };
    let report = rt.block_on(ft_serve::loadgen::replay(&cfg))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        print!("{}", report.table());
    }
    let errors: usize = report.runs.iter().map(|r| r.errors).sum();
    if errors > 0 {
        return Err(crate::CheckFailed(format!("{errors} scored request(s) failed")).into());
    }
    Ok(())
}
