//! Load generation against any OpenAI-compatible server.
//!
//! Two clients:
//!
//! - [`replay`]: the field report's A/B protocol, per service: unscored warm-up requests,
//!   then for each concurrency N, N concurrent streaming requests with distinct prompts of
//!   about `prompt_tokens` tokens, `max_tokens` output tokens, temperature 0. Each stream's
//!   decode tok/s is its generated tokens after the first over the time from the first to the
//!   last token (so prefill is not in it), time to first token is from sending the request;
//!   errors are counted, not fatal.
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
    /// Finish reason.
    pub finish_reason: Option<String>,
    /// The generated text.
    #[serde(skip)]
    pub text: String,
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
    /// Mean decode tok/s per stream over the streams without error.
    pub mean_decode_tok_s: f64,
    /// Sum of the streams' decode tok/s.
    pub total_decode_tok_s: f64,
    /// Mean time to first token, s.
    pub mean_ttft_s: f64,
    /// Streams with an error.
    pub errors: usize,
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
    error: Option<String>,
    ids: std::collections::BTreeSet<String>,
}

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
    concurrency: usize,
    stream: usize,
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
        (Some(f), Some(l)) => {
            let span = (l - f).as_secs_f64();
            let rate = if span > 0.0 && tokens > 1 {
                (tokens - 1) as f64 / span
            } else {
                0.0
            };
            ((f - sent).as_secs_f64(), rate)
        }
        _ => (0.0, 0.0),
    };
    StreamResult {
        concurrency,
        stream,
        prompt_tokens: r.usage.map(|u| u.0),
        completion_tokens: tokens,
        ttft_s,
        decode_tok_s,
        total_s,
        finish_reason: r.finish,
        text: r.text,
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
        warmup.push(measured(&http, cfg, &model, 0, w, p).await);
    }
    let mut runs = Vec::new();
    for (ri, &n) in cfg.concurrency.iter().enumerate() {
        let futs = (0..n).map(|s| {
            let p = prompt_text(cfg.seed, s, ri, chars);
            measured(&http, cfg, &model, n, s, p)
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
        runs.push(RunResult {
            concurrency: n,
            mean_decode_tok_s: mean(&|s| s.decode_tok_s),
            total_decode_tok_s: ok.iter().map(|s| s.decode_tok_s).sum(),
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
    fn stress_only_targets_loopback() {
        assert!(check_loopback("http://127.0.0.1:1").is_ok());
        assert!(check_loopback("http://localhost:1").is_ok());
        assert!(check_loopback("http://[::1]:1").is_ok());
        assert!(check_loopback("http://10.0.0.1:1").is_err());
        assert!(check_loopback("http://example.com").is_err());
    }
}
