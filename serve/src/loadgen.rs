//! Load generation against any OpenAI-compatible server.
//!
//! Two clients:
//!
//! - [`replay`]: the field report's A/B protocol, per service: unscored warm-up requests,
//!   then for each concurrency N, N concurrent streaming requests with distinct prompts of
//!   about `prompt_tokens` tokens, `max_tokens` output tokens, temperature 0. Each stream's
//!   decode tok/s is its generated tokens after the first over the time from the first to the
//!   last token (`(n_out - 1) / (t_last - t_first)`, so its own prefill is not in it), its
//!   end-to-end tok/s is its tokens over the whole request, and time to first token is from
//!   sending the request; errors are counted, not fatal. At several streams a stream's
//!   first-to-last span can still hold another stream's prefill (a server that prefills one
//!   request stalls the others' decode), so the run's decode rate is taken over the *steady
//!   window* ([`steady_window`]): from the last stream's first token to the first stream's
//!   last token, where every stream decodes; each stream's rate there is its token arrivals
//!   inside the window over their span. Where that window is too short to measure (a stream
//!   finished before another began), the run falls back to the mean of the per-request rates
//!   and says so ([`DecodeBasis`]).
//! - [`stress`]: many concurrent clients on a few distinct prompts, some disconnecting
//!   mid-stream, bounded in request count and time; every completed response is checked
//!   against the others for the same prompt and against a non-streamed answer (greedy
//!   decoding is deterministic), and the server is checked to still answer afterwards with
//!   no request left in flight.
//!
//! Token counts come from the usage chunk (`stream_options.include_usage`) where the server
//! sends one, else from the chunks that carry text.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{Result, ServeError};

/// Words the synthetic prompts are made of (plain English, so a BPE tokenizer gives about
/// one token per word and a byte tokenizer one per byte).
const WORDS: &[&str] = &[
    "the",
    "model",
    "decodes",
    "tokens",
    "while",
    "experts",
    "live",
    "in",
    "host",
    "memory",
    "and",
    "each",
    "layer",
    "routes",
    "to",
    "a",
    "few",
    "of",
    "them",
    "so",
    "cache",
    "misses",
    "cross",
    "link",
    "or",
    "run",
    "on",
    "cpu",
    "with",
    "bandwidth",
    "latency",
    "that",
    "bound",
    "step",
    "time",
    "under",
    "load",
    "from",
    "many",
    "streams",
    "at",
    "once",
];

/// Text of about `chars` characters, distinct for every `(seed, stream, request)`.
pub fn prompt_text(seed: u64, stream: usize, request: usize, chars: usize) -> String {
    let mut s = format!("Stream {stream}, request {request}: ");
    let mut z = seed ^ ((stream as u64) << 32) ^ request as u64;
    while s.len() < chars {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        s += WORDS[(x % WORDS.len() as u64) as usize];
        s.push(' ');
    }
    s.truncate(chars);
    s
}

/// Which endpoint to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointKind {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// The protocol's knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayConfig {
    /// Base URL, e.g. `http://127.0.0.1:8000`.
    pub url: String,
    /// Model id; `None` takes the first of `/v1/models`.
    pub model: Option<String>,
    /// Concurrencies to run, in order (the report's: 1 and 2).
    pub concurrency: Vec<usize>,
    /// Unscored warm-up requests before the first scored one (the report's: 2; 0 for a
    /// fresh service).
    pub warmup: usize,
    /// Target prompt length, tokens.
    pub prompt_tokens: usize,
    /// Characters per prompt token of the server's tokenizer (1 for `ft serve`'s bytes,
    /// about 4 for English with a BPE tokenizer).
    pub chars_per_token: f64,
    /// Output tokens per request.
    pub max_tokens: usize,
    /// Send `ignore_eos` so that every request generates exactly `max_tokens`.
    pub ignore_eos: bool,
    /// Endpoint.
    pub endpoint: EndpointKind,
    /// Seed of the prompts.
    pub seed: u64,
    /// Per-request timeout, seconds.
    pub timeout_s: f64,
}

impl Default for ReplayConfig {
    /// The field report's protocol against `ft serve` on port 8000.
    fn default() -> Self {
        ReplayConfig {
            url: "http://127.0.0.1:8000".into(),
            model: None,
            concurrency: vec![1, 2],
            warmup: 2,
            prompt_tokens: 1200,
            chars_per_token: 1.0,
            max_tokens: 256,
            ignore_eos: true,
            endpoint: EndpointKind::Completions,
            seed: 2024,
            timeout_s: 600.0,
        }
    }
}

/// One streamed request's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamResult {
    /// Concurrency of the run it belonged to (0 for a warm-up).
    pub concurrency: usize,
    /// Stream index within the run.
    pub stream: usize,
    /// Prompt tokens as the server counted them, where it said.
    pub prompt_tokens: Option<usize>,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Time to first token, s.
    pub ttft_s: f64,
    /// Decode tok/s: tokens after the first over first-to-last token time.
    pub decode_tok_s: f64,
    /// Request time, s.
    pub total_s: f64,
    /// End-to-end tok/s: generated tokens over the request time (prefill included).
    #[serde(default)]
    pub e2e_tok_s: f64,
    /// Finish reason.
    pub finish_reason: Option<String>,
    /// The generated text.
    #[serde(skip)]
    pub text: String,
    /// Arrival of each chunk with text, s from the start of its run (the window's clock).
    #[serde(skip)]
    pub arrivals_s: Vec<f64>,
    /// Generated tokens per chunk with text (1 unless the server batches tokens in chunks).
    #[serde(skip)]
    pub tokens_per_chunk: f64,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// One concurrency level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Concurrent streams.
    pub concurrency: usize,
    /// Per stream.
    pub streams: Vec<StreamResult>,
    /// Mean of the per-request decode tok/s over the streams without error.
    pub mean_decode_tok_s: f64,
    /// Sum of the streams' per-request decode tok/s.
    pub total_decode_tok_s: f64,
    /// The run's decode tok/s per stream: the steady window's where it measures, else the
    /// mean per-request rate ([`RunResult::decode_basis`] says which).
    #[serde(default)]
    pub decode_tok_s: f64,
    /// How `decode_tok_s` was taken.
    #[serde(default)]
    pub decode_basis: DecodeBasis,
    /// The steady window, where it measures.
    #[serde(default)]
    pub window: Option<SteadyWindow>,
    /// Mean end-to-end tok/s per stream (output tokens over the whole request).
    #[serde(default)]
    pub mean_e2e_tok_s: f64,
    /// Mean time to first token, s.
    pub mean_ttft_s: f64,
    /// Streams with an error.
    pub errors: usize,
}

/// How a run's decode rate was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DecodeBasis {
    /// Over the steady window, where every stream decodes ([`steady_window`]).
    SteadyWindow,
    /// The mean of the per-request rates (the window was too short to measure).
    #[default]
    PerRequest,
}

/// The span where every stream of a run decodes, and each stream's rate in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SteadyWindow {
    /// Start (the last stream's first token), s from the run's start.
    pub start_s: f64,
    /// End (the first stream's last token), s from the run's start.
    pub end_s: f64,
    /// Each stream's decode tok/s inside the window.
    pub per_stream_tok_s: Vec<f64>,
    /// Their mean.
    pub mean_tok_s: f64,
}

/// One stream's token arrivals, for [`steady_window`].
#[derive(Debug, Clone, Copy)]
pub struct Arrivals<'a> {
    /// Arrival times of the chunks with text, s on the run's clock, ascending.
    pub times_s: &'a [f64],
    /// Tokens per chunk.
    pub tokens_per_chunk: f64,
}

/// The decode rate over the span where every stream decodes (see the module docs): the
/// window runs from the latest first arrival to the earliest last arrival; each stream's
/// rate is `(k - 1) * tokens_per_chunk / (t_k - t_1)` over its `k` arrivals inside it.
/// `None` where some stream has fewer than [`MIN_WINDOW_ARRIVALS`] arrivals there (the
/// window is too short to measure) or there are no streams.
pub fn steady_window(streams: &[Arrivals<'_>]) -> Option<SteadyWindow> {
    let start = streams
        .iter()
        .map(|s| s.times_s.first().copied())
        .try_fold(f64::NEG_INFINITY, |m, t| t.map(|t| m.max(t)))?;
    let end = streams
        .iter()
        .map(|s| s.times_s.last().copied())
        .try_fold(f64::INFINITY, |m, t| t.map(|t| m.min(t)))?;
    if streams.is_empty() || end <= start {
        return None;
    }
    let mut rates = Vec::with_capacity(streams.len());
    for s in streams {
        let inside: Vec<f64> = s
            .times_s
            .iter()
            .copied()
            .filter(|&t| t >= start && t <= end)
            .collect();
        let (first, last) = (inside.first()?, inside.last()?);
        if inside.len() < MIN_WINDOW_ARRIVALS || last <= first {
            return None;
        }
        rates.push((inside.len() - 1) as f64 * s.tokens_per_chunk / (last - first));
    }
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    Some(SteadyWindow {
        start_s: start,
        end_s: end,
        per_stream_tok_s: rates,
        mean_tok_s: mean,
    })
}

/// Per-request decode tok/s: `(n_out - 1) / (t_last - t_first)`; 0 where fewer than two
/// tokens or no time passed between the first and the last.
pub fn request_decode_tok_s(tokens: usize, first_s: f64, last_s: f64) -> f64 {
    let span = last_s - first_s;
    if span > 0.0 && tokens > 1 {
        (tokens - 1) as f64 / span
    } else {
        0.0
    }
}

/// The protocol's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// What was run.
    pub config: ReplayConfig,
    /// The model loaded.
    pub model: String,
    /// Warm-up requests (unscored).
    pub warmup: Vec<StreamResult>,
    /// Scored runs.
    pub runs: Vec<RunResult>,
}

impl ReplayReport {
    /// The human table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} ({}), prompts ~{} tokens, {} output tokens, temperature 0, {} warm-up\n",
            self.config.url,
            self.model,
            self.config.prompt_tokens,
            self.config.max_tokens,
            self.warmup.len()
        );
        s += &format!(
            "{:>7} {:>6} {:>8} {:>8} {:>11} {:>9} {:>9}  {}\n",
            "streams", "stream", "prompt", "tokens", "decode tok/s", "ttft s", "total s", "error"
        );
        for r in &self.runs {
            for st in &r.streams {
                s += &format!(
                    "{:>7} {:>6} {:>8} {:>8} {:>11.2} {:>9.3} {:>9.2}  {}\n",
                    r.concurrency,
                    st.stream,
                    st.prompt_tokens.map_or("?".into(), |p| p.to_string()),
                    st.completion_tokens,
                    st.decode_tok_s,
                    st.ttft_s,
                    st.total_s,
                    st.error.as_deref().unwrap_or("")
                );
            }
            s +=
                &format!(
                "{:>7} {:>6} {:>8} {:>8} {:>11.2} {:>9.3} {:>9}  {} error(s); total {:.2} tok/s\n",
                r.concurrency, "mean", "", "", r.mean_decode_tok_s, r.mean_ttft_s, "", r.errors,
                r.total_decode_tok_s
            );
            s += &format!(
                "{:>7} {:>6}  decode {:.2} tok/s per stream ({}), end to end {:.2}\n",
                r.concurrency,
                "run",
                r.decode_tok_s,
                match (&r.decode_basis, &r.window) {
                    (DecodeBasis::SteadyWindow, Some(w)) => format!(
                        "steady window {:.2}-{:.2} s where all streams decode",
                        w.start_s, w.end_s
                    ),
                    _ => "mean per-request rate: no steady window to measure".into(),
                },
                r.mean_e2e_tok_s
            );
        }
        s
    }
}

fn client_error(url: &str, e: impl std::fmt::Display) -> ServeError {
    ServeError::Client {
        url: url.to_string(),
        message: e.to_string(),
    }
}

fn client(timeout_s: f64) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(timeout_s.max(0.001)))
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| client_error("(client)", e))
}

/// The first model id of `GET /v1/models`.
pub async fn first_model(http: &reqwest::Client, url: &str) -> Result<String> {
    let u = format!("{}/v1/models", url.trim_end_matches('/'));
    let v: Value = http
        .get(&u)
        .send()
        .await
        .map_err(|e| client_error(&u, e))?
        .json()
        .await
        .map_err(|e| client_error(&u, e))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| client_error(&u, format!("no model in {v}")))
}

/// A request body for the endpoint.
fn body(
    endpoint: EndpointKind,
    model: &str,
    prompt: &str,
    max_tokens: usize,
    ignore_eos: bool,
    stream: bool,
) -> (String, Value) {
    let mut b = match endpoint {
        EndpointKind::Completions => json!({"model": model, "prompt": prompt}),
        EndpointKind::Chat => {
            json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
        }
    };
    b["max_tokens"] = json!(max_tokens);
    b["temperature"] = json!(0);
    b["stream"] = json!(stream);
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    if ignore_eos {
        b["ignore_eos"] = json!(true);
    }
    let path = match endpoint {
        EndpointKind::Completions => "/v1/completions",
        EndpointKind::Chat => "/v1/chat/completions",
    };
    (path.to_string(), b)
}

/// What a streamed response looked like.
#[derive(Debug, Clone, Default)]
struct Streamed {
    status: u16,
    text: String,
    token_chunks: usize,
    usage: Option<(usize, usize)>,
    finish: Option<String>,
    done: usize,
    after_done: usize,
    first: Option<Instant>,
    last: Option<Instant>,
    /// When each chunk with text arrived (at most [`MAX_ARRIVALS`] kept).
    arrivals: Vec<Instant>,
    error: Option<String>,
    ids: std::collections::BTreeSet<String>,
}

/// Most chunk arrival times kept per request: far beyond any protocol's output length, and a
/// bound on what a server streaming without end can make the client hold (16 B each).
pub const MAX_ARRIVALS: usize = 1 << 20;

/// Fewest token arrivals each stream must have inside the steady window for the window to
/// measure the decode rate: below 8, one late chunk moves the rate by more than 10%.
pub const MIN_WINDOW_ARRIVALS: usize = 8;

/// Send a streaming request; `stop_after` chunks, then drop the connection (a client that
/// goes away). Reads until `[DONE]` otherwise.
async fn stream_request(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    body: &Value,
    stop_after: Option<usize>,
) -> Streamed {
    let u = format!("{}{}", url.trim_end_matches('/'), path);
    let mut out = Streamed::default();
    let resp = match http.post(&u).json(body).send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("send: {e}"));
            return out;
        }
    };
    out.status = resp.status().as_u16();
    if !resp.status().is_success() {
        let text = resp.text().await.unwrap_or_default();
        out.error = Some(format!("HTTP {}: {text}", out.status));
        return out;
    }
    let mut bytes = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunks = 0usize;
    while let Some(piece) = bytes.next().await {
        let piece = match piece {
            Ok(p) => p,
            Err(e) => {
                out.error = Some(format!("reading the stream: {e}"));
                return out;
            }
        };
        buf.extend_from_slice(&piece);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\r', '\n']);
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim_start();
            if data == "[DONE]" {
                out.done += 1;
                continue;
            }
            if out.done > 0 {
                out.after_done += 1;
            }
            let v: Value = match serde_json::from_str(data) {
                Ok(v) => v,
                Err(e) => {
                    out.error = Some(format!("a chunk is not JSON ({e}): {data}"));
                    return out;
                }
            };
            if let Some(err) = v.get("error") {
                out.error = Some(format!("error chunk: {err}"));
                continue;
            }
            if let Some(id) = v["id"].as_str() {
                out.ids.insert(id.to_string());
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                if let (Some(p), Some(c)) =
                    (u["prompt_tokens"].as_u64(), u["completion_tokens"].as_u64())
                {
                    out.usage = Some((p as usize, c as usize));
                }
            }
            let Some(choice) = v["choices"].get(0) else {
                continue;
            };
            let text = choice["text"]
                .as_str()
                .or_else(|| choice["delta"]["content"].as_str())
                .unwrap_or("");
            let finish = choice["finish_reason"].as_str();
            if finish.is_none() || !text.is_empty() {
                let now = Instant::now();
                out.first.get_or_insert(now);
                out.last = Some(now);
                out.token_chunks += 1;
                if out.arrivals.len() < MAX_ARRIVALS {
                    out.arrivals.push(now);
                }
            }
            out.text += text;
            if let Some(f) = finish {
                out.finish = Some(f.to_string());
            }
            chunks += 1;
            if stop_after.is_some_and(|n| chunks >= n) {
                return out; // drops the response: the connection closes
            }
        }
    }
    if out.done == 0 && out.error.is_none() {
        out.error = Some("the stream ended without [DONE]".into());
    }
    out
}

async fn measured(
    http: &reqwest::Client,
    cfg: &ReplayConfig,
    model: &str,
    (concurrency, stream): (usize, usize),
    run_start: Instant,
    prompt: String,
) -> StreamResult {
    let (path, b) = body(
        cfg.endpoint,
        model,
        &prompt,
        cfg.max_tokens,
        cfg.ignore_eos,
        true,
    );
    let sent = Instant::now();
    let r = stream_request(http, &cfg.url, &path, &b, None).await;
    let total_s = sent.elapsed().as_secs_f64();
    let tokens = r.usage.map_or(r.token_chunks, |u| u.1);
    let (ttft_s, decode_tok_s) = match (r.first, r.last) {
        (Some(f), Some(l)) => (
            (f - sent).as_secs_f64(),
            request_decode_tok_s(tokens, 0.0, (l - f).as_secs_f64()),
        ),
        _ => (0.0, 0.0),
    };
    let arrivals_s = r
        .arrivals
        .iter()
        .map(|t| t.saturating_duration_since(run_start).as_secs_f64())
        .collect();
    StreamResult {
        concurrency,
        stream,
        prompt_tokens: r.usage.map(|u| u.0),
        completion_tokens: tokens,
        ttft_s,
        decode_tok_s,
        total_s,
        e2e_tok_s: if total_s > 0.0 {
            tokens as f64 / total_s
        } else {
            0.0
        },
        finish_reason: r.finish,
        text: r.text,
        arrivals_s,
        tokens_per_chunk: if r.token_chunks > 0 {
            tokens as f64 / r.token_chunks as f64
        } else {
            1.0
        },
        error: r.error,
    }
}

/// Run the protocol (see the module docs).
pub async fn replay(cfg: &ReplayConfig) -> Result<ReplayReport> {
    if cfg.concurrency.is_empty() || cfg.concurrency.contains(&0) {
        return Err(ServeError::invalid(
            "--streams",
            "give one or more concurrencies, each at least 1",
        ));
    }
    if cfg.chars_per_token.is_nan() || cfg.chars_per_token <= 0.0 {
        return Err(ServeError::invalid("--chars-per-token", "must be positive"));
    }
    let http = client(cfg.timeout_s)?;
    let model = match &cfg.model {
        Some(m) => m.clone(),
        None => first_model(&http, &cfg.url).await?,
    };
    let chars = (cfg.prompt_tokens as f64 * cfg.chars_per_token).round() as usize;
    let mut warmup = Vec::new();
    for w in 0..cfg.warmup {
        // Warm-up prompts are distinct from the scored ones (request index 1000 + w).
        let p = prompt_text(cfg.seed, 0, 1000 + w, chars);
        warmup.push(measured(&http, cfg, &model, (0, w), Instant::now(), p).await);
    }
    let mut runs = Vec::new();
    for (ri, &n) in cfg.concurrency.iter().enumerate() {
        let run_start = Instant::now();
        let futs = (0..n).map(|s| {
            let p = prompt_text(cfg.seed, s, ri, chars);
            measured(&http, cfg, &model, (n, s), run_start, p)
        });
        let streams = futures::future::join_all(futs).await;
        let ok: Vec<&StreamResult> = streams.iter().filter(|s| s.error.is_none()).collect();
        let mean = |f: &dyn Fn(&StreamResult) -> f64| {
            if ok.is_empty() {
                0.0
            } else {
                ok.iter().map(|s| f(s)).sum::<f64>() / ok.len() as f64
            }
        };
        let arrivals: Vec<Arrivals<'_>> = ok
            .iter()
            .map(|s| Arrivals {
                times_s: &s.arrivals_s,
                tokens_per_chunk: s.tokens_per_chunk,
            })
            .collect();
        // Every stream failing leaves no window; a window needs every stream's arrivals.
        let window = if ok.len() == streams.len() {
            steady_window(&arrivals)
        } else {
            None
        };
        let per_request = mean(&|s| s.decode_tok_s);
        runs.push(RunResult {
            concurrency: n,
            mean_decode_tok_s: per_request,
            total_decode_tok_s: ok.iter().map(|s| s.decode_tok_s).sum(),
            decode_tok_s: window.as_ref().map_or(per_request, |w| w.mean_tok_s),
            decode_basis: if window.is_some() {
                DecodeBasis::SteadyWindow
            } else {
                DecodeBasis::PerRequest
            },
            window,
            mean_e2e_tok_s: mean(&|s| s.e2e_tok_s),
            mean_ttft_s: mean(&|s| s.ttft_s),
            errors: streams.len() - ok.len(),
            streams,
        });
    }
    Ok(ReplayReport {
        config: cfg.clone(),
        model,
        warmup,
        runs,
    })
}

/// The stress test's knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StressConfig {
    /// Base URL (loopback only: see [`check_loopback`]).
    pub url: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Requests in all (the bound on count).
    pub requests: usize,
    /// Distinct prompts the requests cycle through.
    pub prompts: usize,
    /// Share of requests whose client disconnects mid-stream.
    pub disconnect_fraction: f64,
    /// Prompt length, characters.
    pub prompt_chars: usize,
    /// Output tokens per request.
    pub max_tokens: usize,
    /// Wall-clock bound, s: no request is started after it.
    pub duration_limit_s: f64,
    /// Seed (prompts, which requests disconnect).
    pub seed: u64,
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            url: "http://127.0.0.1:8000".into(),
            clients: 32,
            requests: 256,
            prompts: 8,
            disconnect_fraction: 0.25,
            prompt_chars: 64,
            max_tokens: 32,
            duration_limit_s: 60.0,
            seed: 7,
        }
    }
}

/// What the stress test saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StressReport {
    /// Requests sent.
    pub sent: usize,
    /// Streams read to `[DONE]`.
    pub completed: usize,
    /// Streams the client dropped on purpose.
    pub disconnected: usize,
    /// Refused with an HTTP status (status -> count).
    pub rejected: BTreeMap<u16, usize>,
    /// Completed streams whose text differs from the reference for their prompt.
    pub mismatched: usize,
    /// Completed streams with a wrong token count, a second `[DONE]`, data after it, or
    /// chunks of two ids.
    pub malformed: usize,
    /// Other failures (transport errors, error chunks, streams cut short), with a message.
    pub errors: Vec<String>,
    /// Generated tokens over all completed streams.
    pub tokens: usize,
    /// Wall time, s.
    pub elapsed_s: f64,
    /// Aggregate tok/s of the completed streams.
    pub tok_s: f64,
    /// `/health` answered 200 afterwards.
    pub healthy_after: bool,
    /// Requests in flight at the server afterwards (from `/health`), after waiting for the
    /// disconnected ones to be noticed.
    pub in_flight_after: Option<u64>,
}

impl StressReport {
    /// No lost, duplicated or corrupted response, and the server is fine afterwards.
    pub fn passed(&self) -> bool {
        self.mismatched == 0
            && self.malformed == 0
            && self.errors.is_empty()
            && self.healthy_after
            && self.in_flight_after == Some(0)
            && self.completed + self.disconnected + self.rejected.values().sum::<usize>()
                == self.sent
    }

    /// The human table.
    pub fn table(&self) -> String {
        format!(
            "sent {}  completed {}  disconnected {}  rejected {:?}  mismatched {}  malformed {}  errors {}\n\
             tokens {}  elapsed {:.2} s  {:.1} tok/s  healthy after: {}  in flight after: {}\n\
             verdict: {}\n",
            self.sent,
            self.completed,
            self.disconnected,
            self.rejected,
            self.mismatched,
            self.malformed,
            self.errors.len(),
            self.tokens,
            self.elapsed_s,
            self.tok_s,
            self.healthy_after,
            self.in_flight_after.map_or("?".into(), |n| n.to_string()),
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// Refuse any target but the loopback range (the stress test floods its target).
pub fn check_loopback(url: &str) -> Result<()> {
    let u = reqwest::Url::parse(url).map_err(|e| client_error(url, e))?;
    let ok = match u.host_str() {
        Some("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback()),
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ServeError::invalid(
            "--url",
            format!("{url}: the stress test only targets loopback addresses (127.0.0.0/8, ::1, localhost)"),
        ))
    }
}

/// Run the stress test (see the module docs).
pub async fn stress(cfg: &StressConfig) -> Result<StressReport> {
    check_loopback(&cfg.url)?;
    if cfg.clients == 0 || cfg.prompts == 0 || cfg.max_tokens == 0 {
        return Err(ServeError::invalid(
            "stress",
            "clients, prompts and max_tokens must be at least 1",
        ));
    }
    let http = client(cfg.duration_limit_s.max(1.0) * 2.0)?;
    let model = first_model(&http, &cfg.url).await?;
    // The reference: one non-streamed answer per prompt, before the storm.
    let mut reference = Vec::with_capacity(cfg.prompts);
    for p in 0..cfg.prompts {
        let prompt = prompt_text(cfg.seed, p, 0, cfg.prompt_chars);
        let (path, b) = body(
            EndpointKind::Completions,
            &model,
            &prompt,
            cfg.max_tokens,
            true,
            false,
        );
        let u = format!("{}{}", cfg.url.trim_end_matches('/'), path);
        let v: Value = http
            .post(&u)
            .json(&b)
            .send()
            .await
            .map_err(|e| client_error(&u, e))?
            .json()
            .await
            .map_err(|e| client_error(&u, e))?;
        let text = v["choices"][0]["text"]
            .as_str()
            .ok_or_else(|| client_error(&u, format!("no text in {v}")))?;
        reference.push((prompt, text.to_string()));
    }
    let reference = Arc::new(reference);
    let next = Arc::new(AtomicUsize::new(0));
    let report = Arc::new(Mutex::new(StressReport::default()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(cfg.duration_limit_s);
    let tasks: Vec<_> = (0..cfg.clients)
        .map(|_| {
            let (http, next, report, reference) = (
                http.clone(),
                Arc::clone(&next),
                Arc::clone(&report),
                Arc::clone(&reference),
            );
            let (cfg, model) = (cfg.clone(), model.clone());
            tokio::spawn(async move {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= cfg.requests || Instant::now() >= deadline {
                        break;
                    }
                    let p = k % cfg.prompts;
                    // Which requests disconnect, and after how many chunks: a hash of k.
                    let h = (k as u64 ^ cfg.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
                    let unit = h as f64 / (1u64 << 53) as f64;
                    let stop_after = (unit < cfg.disconnect_fraction)
                        .then(|| 1 + (h as usize % cfg.max_tokens.max(2)) / 2);
                    let (path, b) = body(
                        EndpointKind::Completions,
                        &model,
                        &reference[p].0,
                        cfg.max_tokens,
                        true,
                        true,
                    );
                    let r = stream_request(&http, &cfg.url, &path, &b, stop_after).await;
                    let mut rep = report.lock().unwrap_or_else(|e| e.into_inner());
                    rep.sent += 1;
                    if r.status != 0 && !(200..300).contains(&r.status) {
                        *rep.rejected.entry(r.status).or_default() += 1;
                    } else if let Some(e) = r.error {
                        rep.errors.push(format!("request {k}: {e}"));
                    } else if stop_after.is_some() && r.done == 0 {
                        rep.disconnected += 1;
                    } else {
                        rep.completed += 1;
                        let tokens = r.usage.map_or(r.token_chunks, |u| u.1);
                        rep.tokens += tokens;
                        if r.text != reference[p].1 {
                            rep.mismatched += 1;
                        }
                        if tokens != cfg.max_tokens
                            || r.token_chunks != cfg.max_tokens
                            || r.done != 1
                            || r.after_done != 0
                            || r.ids.len() != 1
                        {
                            rep.malformed += 1;
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Afterwards: the server answers, and the dropped streams' slots are freed (they are
    // noticed at the server's next step; poll for a bounded while).
    let health = format!("{}/health", cfg.url.trim_end_matches('/'));
    let mut healthy = false;
    let mut in_flight = None;
    for _ in 0..50 {
        if let Ok(r) = http.get(&health).send().await {
            healthy = r.status().is_success();
            if let Ok(v) = r.json::<Value>().await {
                in_flight = v["in_flight"].as_u64();
            }
        }
        if healthy && in_flight == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rep = report.lock().unwrap_or_else(|e| e.into_inner()).clone();
    rep.elapsed_s = elapsed;
    rep.tok_s = if elapsed > 0.0 {
        rep.tokens as f64 / elapsed
    } else {
        0.0
    };
    rep.healthy_after = healthy;
    rep.in_flight_after = in_flight;
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_distinct_and_sized() {
        let a = prompt_text(1, 0, 0, 1200);
        let b = prompt_text(1, 1, 0, 1200);
        assert_eq!(a.len(), 1200);
        assert_ne!(a, b);
        assert_eq!(a, prompt_text(1, 0, 0, 1200));
    }

    #[test]
    fn request_decode_rate_is_tokens_after_the_first_over_first_to_last() {
        // 5 tokens at 1.0, 1.1, 1.2, 1.3, 1.4 s: 4 intervals of 0.1 s.
        assert!((request_decode_tok_s(5, 1.0, 1.4) - 10.0).abs() < 1e-9);
        assert_eq!(request_decode_tok_s(1, 1.0, 1.0), 0.0);
        assert_eq!(request_decode_tok_s(5, 1.0, 1.0), 0.0);
    }

    /// `n` arrivals every `dt` s from `t0`.
    fn ticks(t0: f64, dt: f64, n: usize) -> Vec<f64> {
        (0..n).map(|i| t0 + dt * i as f64).collect()
    }

    #[test]
    fn steady_window_is_where_every_stream_decodes() {
        // Stream 0 prefills first and decodes at 20 tok/s alone, then, once stream 1 has
        // prefilled (a stall of 0.5 s in stream 0), both decode at 10 tok/s.
        let mut a = ticks(0.5, 0.05, 20); // 0.50 .. 1.45 alone
        a.extend(ticks(2.0, 0.1, 31)); // 2.0 .. 5.0 together
        let b = ticks(2.05, 0.1, 40); // first token at 2.05, .. 5.95
        let w = steady_window(&[
            Arrivals {
                times_s: &a,
                tokens_per_chunk: 1.0,
            },
            Arrivals {
                times_s: &b,
                tokens_per_chunk: 1.0,
            },
        ])
        .unwrap();
        assert!((w.start_s - 2.05).abs() < 1e-12 && (w.end_s - 5.0).abs() < 1e-12);
        for r in &w.per_stream_tok_s {
            assert!((r - 10.0).abs() < 1e-6, "{w:?}");
        }
        assert!((w.mean_tok_s - 10.0).abs() < 1e-6);
        // The per-request rate of stream 0 mixes its solo decode and the stall in.
        let solo = request_decode_tok_s(a.len(), a[0], *a.last().unwrap());
        assert!((solo - 50.0 / 4.5).abs() < 1e-9 && (solo - 10.0).abs() > 1.0);
        // Chunks of two tokens double the rate.
        let w2 = steady_window(&[Arrivals {
            times_s: &b,
            tokens_per_chunk: 2.0,
        }])
        .unwrap();
        assert!((w2.mean_tok_s - 20.0).abs() < 1e-6);
    }

    fn one(times_s: &[f64]) -> Arrivals<'_> {
        Arrivals {
            times_s,
            tokens_per_chunk: 1.0,
        }
    }

    #[test]
    fn no_steady_window_where_streams_do_not_overlap_enough() {
        let a = ticks(0.0, 0.1, 20); // .. 1.9
        let b = ticks(1.5, 0.1, 20); // 1.5 ..: 5 arrivals of a inside
        assert!(steady_window(&[one(&a), one(&b)]).is_none());
        let c = ticks(3.0, 0.1, 20); // after a ended
        assert!(steady_window(&[one(&a), one(&c)]).is_none());
        assert!(steady_window(&[one(&a), one(&[])]).is_none());
        assert!(steady_window(&[]).is_none());
        // One stream: its own first-to-last, the per-request rate.
        let w = steady_window(&[one(&a)]).unwrap();
        assert!((w.mean_tok_s - request_decode_tok_s(20, 0.0, 1.9)).abs() < 1e-9);
    }

    #[test]
    fn stress_only_targets_loopback() {
        assert!(check_loopback("http://127.0.0.1:1").is_ok());
        assert!(check_loopback("http://localhost:1").is_ok());
        assert!(check_loopback("http://[::1]:1").is_ok());
        assert!(check_loopback("http://10.0.0.1:1").is_err());
        assert!(check_loopback("http://example.com").is_err());
    }
}
