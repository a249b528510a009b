//! The HTTP face of the server: axum routes over a [`SchedulerHandle`], served by hyper
//! connection by connection so that no client can hold the server open.
//!
//! - `POST /v1/completions`, `POST /v1/chat/completions`: parsed strictly (see [`crate::api`]),
//!   handed to the decode loop; answered whole, or as server-sent events with one chunk per
//!   generated token (its text may be empty while a UTF-8 character is incomplete; the last
//!   token's chunk carries the finish reason), a usage chunk when
//!   `stream_options.include_usage`, and `data: [DONE]`.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text, [`crate::metrics`]).
//!
//! What protects the server ([`HttpConfig`], each a flag of `ft serve`): a client must send
//! its request headers within the header timeout (hyper's; it also closes a kept-alive
//! connection that sends nothing for that long) and its body within the body timeout (408),
//! a body larger than the limit is refused from its `Content-Length` before a byte of it is
//! read (413; a chunked one as soon as it passes the limit), and on the shutdown signal the
//! server stops accepting, lets the requests in flight finish, and closes whatever is still
//! open at the shutdown deadline. Every 4xx/5xx carries an OpenAI-shaped JSON error (the
//! router's own 404s, 405s and rejections included) and every response is counted in
//! `/metrics` by status, as is every request hyper refuses before routing (a malformed
//! request line or header; hyper's own empty error body is replaced by a JSON one,
//! [`JsonErrorIo`]).
//!
//! A client that disconnects drops its response stream, and with it the request's event
//! receiver; the decode loop notices before its next step and frees the slot.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::stream::{self, Stream, StreamExt};
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{debug, info, warn};

use crate::api::{
    parse_body, ApiError, ChatRequest, CompletionRequest, Endpoint, Limits, ResponseId, Usage,
    Validated, IGNORED_HEADER,
};
use crate::error::{Result, ServeError};
use crate::metrics::Metrics;
use crate::scheduler::{FinishReason, GenerateRequest, SchedulerHandle, SubmitError, TokenEvent};
use crate::tokenizer::TextStream;

/// Default largest request body, bytes (1 MiB: a prompt at any context limit this server
/// takes fits many times over).
pub const BODY_LIMIT_BYTES: u64 = 1 << 20;
/// Default time a client has to send its request headers, s: a few hundred bytes of headers
/// take well under a second even on a congested link, while a slowloris client sending a
/// byte every 5 s gets two bytes in.
pub const HEADER_TIMEOUT_S: f64 = 10.0;
/// Default time a client has to send its whole body once the headers are in, s: the largest
/// body ([`BODY_LIMIT_BYTES`]) at 1 Mbit/s takes about 8 s.
pub const BODY_TIMEOUT_S: f64 = 30.0;
/// Default time the server waits for requests in flight after the shutdown signal before it
/// closes the connections still open, s: under the 30 s an orchestrator (Kubernetes'
/// default grace period) waits before it kills the process.
pub const SHUTDOWN_DEADLINE_S: f64 = 25.0;
/// Longest any of the timeouts may be set to, s (a day: beyond that a typo, not a choice).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;
/// Bytes of a router's own error body (a rejection's text) kept as the JSON error message.
const MAX_REWRITTEN_BODY_BYTES: usize = 4096;

/// Timeouts and limits of the HTTP layer (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HttpConfig {
    /// Time to send the request headers; also how long a kept-alive connection may idle.
    pub header_timeout: Duration,
    /// Time to send the body once the headers are in.
    pub body_timeout: Duration,
    /// Largest request body, bytes.
    pub max_body_bytes: u64,
    /// Time from the shutdown signal to closing the connections still open.
    pub shutdown_deadline: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_timeout: Duration::from_secs_f64(HEADER_TIMEOUT_S),
            body_timeout: Duration::from_secs_f64(BODY_TIMEOUT_S),
            max_body_bytes: BODY_LIMIT_BYTES,
            shutdown_deadline: Duration::from_secs_f64(SHUTDOWN_DEADLINE_S),
        }
    }
}

impl HttpConfig {
    /// From the flags' values in seconds and bytes, each checked (finite, positive, at most
    /// [`MAX_TIMEOUT_S`]; a body limit of at least one byte), the error naming the flag.
    pub fn from_flags(
        header_timeout_s: f64,
        body_timeout_s: f64,
        max_body_bytes: u64,
        shutdown_deadline_s: f64,
    ) -> Result<Self> {
        let secs = |flag: &str, v: f64| -> Result<Duration> {
            if v.is_finite() && v > 0.0 && v <= MAX_TIMEOUT_S {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(ServeError::invalid(
                    flag,
                    format!("{v} s is not in (0, {MAX_TIMEOUT_S}] s"),
                ))
            }
        };
        if max_body_bytes == 0 {
            return Err(ServeError::invalid(
                "--max-body-bytes",
                "must be at least 1",
            ));
        }
        Ok(HttpConfig {
            header_timeout: secs("--header-timeout-s", header_timeout_s)?,
            body_timeout: secs("--body-timeout-s", body_timeout_s)?,
            max_body_bytes,
            shutdown_deadline: secs("--shutdown-deadline-s", shutdown_deadline_s)?,
        })
    }
}

/// When the request's headers were in (the start of its latency histograms).
#[derive(Debug, Clone, Copy)]
struct Arrival(Instant);

/// Shared state of the handlers.
pub struct AppState {
    handle: SchedulerHandle,
    created: u64,
    next: AtomicU64,
    seed_base: u64,
    /// Random per process, so response ids are unique across restarts.
    id_prefix: String,
    http: HttpConfig,
}

impl AppState {
    /// State over a running decode loop; `seed_base` seeds requests that give no seed.
    pub fn new(handle: SchedulerHandle, seed_base: u64, http: HttpConfig) -> Arc<Self> {
        Arc::new(AppState {
            handle,
            created: unix_now(),
            next: AtomicU64::new(1),
            seed_base,
            id_prefix: format!("{:016x}", rand::random::<u64>()),
            http,
        })
    }

    fn limits(&self) -> Limits {
        Limits {
            context: self.handle.context_limit(),
            vocab: self.handle.info().vocab,
        }
    }

    fn model(&self) -> &str {
        &self.handle.info().model
    }

    fn metrics(&self) -> &Metrics {
        self.handle.metrics()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The routes, with the body reader and the error shaping and counting around them.
pub fn router(state: Arc<AppState>) -> Router {
    let body_limit = usize::try_from(state.http.max_body_bytes).unwrap_or(usize::MAX);
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), read_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            shape_and_count,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::invalid(
        StatusCode::NOT_FOUND,
        "no such route; this server has /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics",
        None,
        Some("not_found"),
    )
}

/// An error the HTTP layer answers itself, closing the connection (the body may be unread).
fn closing(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Read the whole body before routing: refused from its `Content-Length` when over the limit
/// (nothing read), refused as soon as a chunked one passes it, and cut off at the body
/// timeout.
async fn read_body(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let limit = s.http.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = |what: String| {
        closing(ApiError::invalid(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{what}; the limit is {limit} bytes (--max-body-bytes)"),
            None,
            Some("request_too_large"),
        ))
    };
    if let Some(n) = declared.filter(|&n| n > limit) {
        return too_large(format!("the request body is {n} bytes (Content-Length)"));
    }
    let (parts, mut body) = req.into_parts();
    let read = async {
        let mut buf: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0) as usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Err(format!("reading the request body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if (buf.len() + data.len()) as u64 > limit {
                    return Err(Ok(buf.len() + data.len()));
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok::<_, std::result::Result<usize, String>>(buf)
    };
    match tokio::time::timeout(s.http.body_timeout, read).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(Ok(n))) => too_large(format!("the request body passed {n} bytes")),
        Ok(Err(Err(m))) => closing(ApiError::invalid(
            StatusCode::BAD_REQUEST,
            m,
            None,
            Some("invalid_body"),
        )),
        Err(_) => closing(ApiError::invalid(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {:.1} s (--body-timeout-s)",
                s.http.body_timeout.as_secs_f64()
            ),
            None,
            Some("request_timeout"),
        )),
    }
}

/// Decrements a gauge when dropped (a request's handler may be dropped mid-way).
struct GaugeGuard(prometheus::IntGauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The outermost layer: stamps the arrival, gives every 4xx/5xx that is not already JSON an
/// OpenAI-shaped body (axum's 405s, rejections), and counts every response by status.
async fn shape_and_count(State(s): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Arrival(Instant::now()));
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    // The scrape is not counted as in flight, so an idle server's gauge reads zero in it.
    let _in_flight = (path != "/metrics").then(|| {
        s.metrics().http_in_flight.inc();
        GaugeGuard(s.metrics().http_in_flight.clone())
    });
    let mut r = next.run(req).await;
    let status = r.status();
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if (status.is_client_error() || status.is_server_error()) && !is_json {
        r = json_error(r, &method, &path).await;
    }
    s.metrics().response(r.status().as_u16());
    r
}

/// `r`'s status and headers with an OpenAI error body made of what it said.
async fn json_error(r: Response, method: &Method, path: &str) -> Response {
    let (mut parts, body) = r.into_parts();
    let status = parts.status;
    let said = match http_body_util::Limited::new(body, MAX_REWRITTEN_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    let reason = status.canonical_reason().unwrap_or("error");
    let (message, code) = if status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        (
            format!("method {method} is not allowed on {path} (allowed: {allow})"),
            "method_not_allowed",
        )
    } else if said.is_empty() {
        (format!("{reason} ({method} {path})"), "http_error")
    } else {
        (format!("{reason}: {said}"), "http_error")
    };
    let mut e = ApiError::invalid(status, message, None, Some(code));
    if status.is_server_error() {
        e.kind = "server_error";
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(e.body().to_string()))
}

async fn health(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"status": "ok", "model": s.model(), "in_flight": s.handle.in_flight()}))
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.model(), "object": "model", "created": s.created, "owned_by": "ft",
        "max_model_len": s.handle.context_limit(),
    }]}))
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, Metrics::content_type())],
        s.metrics().render(),
    )
        .into_response()
}

async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(Arrival(arrived)): Extension<Arrival>,
    body: Bytes,
) -> Response {
    let n = s.next.fetch_add(1, Ordering::Relaxed);
    let v = parse_body::<CompletionRequest>(&body)
        .and_then(|r| r.validate(s.model(), s.limits(), s.seed_base.wrapping_add(n)));
    let id = format!("cmpl-{}{n:x}", s.id_prefix);
    respond(&s, v, Endpoint::Completions, id, arrived).await
}

async fn chat(
    State(s): State<Arc<AppState>>,
    Extension(Arrival(arrived)): Extension<Arrival>,
    body: Bytes,
) -> Response {
    let n = s.next.fetch_add(1, Ordering::Relaxed);
    let v = parse_body::<ChatRequest>(&body)
        .and_then(|r| r.validate(s.model(), s.limits(), s.seed_base.wrapping_add(n)));
    let id = format!("chatcmpl-{}{n:x}", s.id_prefix);
    respond(&s, v, Endpoint::Chat, id, arrived).await
}

fn reject(s: &AppState, e: ApiError) -> Response {
    s.metrics().requests_ended("rejected", 1);
    e.into_response()
}

/// Names the accepted-and-ignored fields in the response headers.
fn warn_ignored(mut r: Response, ignored: &[&str]) -> Response {
    if ignored.is_empty() {
        return r;
    }
    let list = ignored.join(", ");
    debug!("accepted and ignored: {list}");
    if let Ok(v) = HeaderValue::from_str(&list) {
        r.headers_mut().insert(IGNORED_HEADER, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "299 ft \"accepted and ignored (not implemented): {list}\""
    )) {
        r.headers_mut().insert(header::WARNING, v);
    }
    r
}

async fn respond(
    s: &Arc<AppState>,
    v: std::result::Result<Validated, ApiError>,
    endpoint: Endpoint,
    id: String,
    arrived: Instant,
) -> Response {
    let v = match v {
        Ok(v) => v,
        Err(e) => return reject(s, e),
    };
    let submitted = s.handle.submit(GenerateRequest {
        prompt: v.prompt.clone(),
        max_tokens: v.max_tokens,
        sampling: v.sampling,
    });
    let rx = match submitted {
        Ok((_, rx)) => rx,
        Err(SubmitError::Busy { in_flight }) => {
            let mut e = ApiError::invalid(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "too many concurrent requests ({in_flight} in flight: every stream slot and queue place is taken); retry later"
                ),
                None,
                Some("too_many_requests"),
            );
            e.kind = "rate_limit_error";
            return reject(s, e);
        }
        Err(SubmitError::TooLong { needed, limit }) => {
            return reject(
                s,
                ApiError::invalid(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "prompt + max_tokens = {needed} tokens is over the context limit {limit}"
                    ),
                    Some("max_tokens"),
                    Some("max_tokens_exceeded"),
                ),
            )
        }
        Err(SubmitError::Stopped) => {
            let mut e = ApiError::invalid(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
                None,
                Some("shutting_down"),
            );
            e.kind = "server_error";
            return reject(s, e);
        }
    };
    let rid = ResponseId {
        id,
        created: unix_now(),
        model: s.model().to_string(),
        endpoint,
    };
    let clock = TokenClock {
        state: Arc::clone(s),
        arrived,
        last: None,
    };
    let r = if v.stream {
        Sse::new(sse_stream(
            rx,
            rid,
            v.stops,
            v.include_usage,
            v.prompt.len(),
            clock,
        ))
        .into_response()
    } else {
        whole(rx, rid, v.stops, v.prompt.len(), clock).await
    };
    warn_ignored(r, &v.ignored)
}

/// Times a request's tokens as the HTTP layer receives them: time to first token,
/// inter-token latency and, at the end, the request's duration.
struct TokenClock {
    state: Arc<AppState>,
    arrived: Instant,
    last: Option<Instant>,
}

impl TokenClock {
    fn token(&mut self) {
        let now = Instant::now();
        let m = self.state.metrics();
        match self.last {
            None => m.first_token((now - self.arrived).as_secs_f64()),
            Some(t) => m.inter_token((now - t).as_secs_f64()),
        }
        self.last = Some(now);
    }

    fn done(&self) {
        self.state
            .metrics()
            .request_done(self.arrived.elapsed().as_secs_f64());
    }
}

fn server_error(message: String) -> ApiError {
    let mut e = ApiError::invalid(
        StatusCode::INTERNAL_SERVER_ERROR,
        message,
        None,
        Some("backend_error"),
    );
    e.kind = "server_error";
    e
}

/// Collect a whole answer.
async fn whole(
    mut rx: UnboundedReceiver<TokenEvent>,
    rid: ResponseId,
    stops: Vec<String>,
    prompt_tokens: usize,
    mut clock: TokenClock,
) -> Response {
    let mut ts = TextStream::new(&stops);
    let mut text = String::new();
    let mut tokens = 0usize;
    let finish = loop {
        match rx.recv().await {
            Some(TokenEvent::Token { token, finish }) => {
                clock.token();
                tokens += 1;
                let p = ts.push(token);
                text += &p.text;
                if p.stopped {
                    break FinishReason::Stop;
                }
                if let Some(f) = finish {
                    text += &ts.finish();
                    break f.reason;
                }
            }
            Some(TokenEvent::Failed(m)) => return server_error(m).into_response(),
            None => {
                return server_error("the decode loop dropped the request".into()).into_response()
            }
        }
    };
    drop(rx);
    clock.done();
    Json(rid.full(&text, finish.name(), Usage::new(prompt_tokens, tokens))).into_response()
}

struct SseState {
    rx: Option<UnboundedReceiver<TokenEvent>>,
    rid: ResponseId,
    ts: TextStream,
    first: bool,
    tokens: usize,
    prompt_tokens: usize,
    include_usage: bool,
    /// Events left to send after the end (finish chunk, usage, `[DONE]`).
    tail: Vec<Event>,
    clock: TokenClock,
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

impl SseState {
    fn end(&mut self, reason: FinishReason, text: String) -> Event {
        self.rx = None; // frees the slot if the loop still holds it (a stop sequence)
        self.clock.done();
        let mut tail = Vec::new();
        if self.include_usage {
            tail.push(data(
                &self
                    .rid
                    .usage_chunk(Usage::new(self.prompt_tokens, self.tokens)),
            ));
        }
        tail.push(Event::default().data("[DONE]"));
        tail.reverse();
        self.tail = tail;
        let first = std::mem::replace(&mut self.first, false);
        data(&self.rid.chunk(&text, first, Some(reason.name())))
    }
}

fn sse_stream(
    rx: UnboundedReceiver<TokenEvent>,
    rid: ResponseId,
    stops: Vec<String>,
    include_usage: bool,
    prompt_tokens: usize,
    clock: TokenClock,
) -> impl Stream<Item = std::result::Result<Event, std::convert::Infallible>> {
    let st = SseState {
        rx: Some(rx),
        rid,
        ts: TextStream::new(&stops),
        first: true,
        tokens: 0,
        prompt_tokens,
        include_usage,
        tail: Vec::new(),
        clock,
    };
    stream::unfold(st, |mut st| async move {
        if let Some(e) = st.tail.pop() {
            return Some((e, st));
        }
        let rx = st.rx.as_mut()?;
        let ev = match rx.recv().await {
            Some(TokenEvent::Token { token, finish }) => {
                st.clock.token();
                st.tokens += 1;
                let p = st.ts.push(token);
                if p.stopped {
                    st.end(FinishReason::Stop, p.text)
                } else if let Some(f) = finish {
                    let text = p.text + &st.ts.finish();
                    st.end(f.reason, text)
                } else {
                    let first = std::mem::replace(&mut st.first, false);
                    data(&st.rid.chunk(&p.text, first, None))
                }
            }
            Some(TokenEvent::Failed(m)) => {
                st.rx = None;
                st.tail = vec![Event::default().data("[DONE]")];
                data(&server_error(m).body())
            }
            None => {
                st.rx = None;
                st.tail = vec![Event::default().data("[DONE]")];
                data(&server_error("the decode loop dropped the request".into()).body())
            }
        };
        Some((ev, st))
    })
    .map(Ok)
}

/// A connection's IO that gives hyper's own error responses an OpenAI-shaped JSON body.
///
/// hyper answers a request it cannot parse (a malformed request line or header, a head over
/// its size limit) itself, before any handler runs, with an empty body and no hook to change
/// it. Such a response is written as a head alone ending in `content-length: 0` with a 4xx
/// status and no content type, which no response of the router is (its errors are JSON with
/// a body), so this wrapper recognises it in the write and writes the same head with a JSON
/// body instead, and counts it by its status. Writes are not vectored, so hyper hands each
/// response head over in one buffer.
struct JsonErrorIo<T> {
    inner: T,
    metrics: Arc<Metrics>,
    /// A rewritten response being written: its bytes, how many are written, and the length of
    /// hyper's buffer it stands for (reported once all are written).
    pending: Option<(Vec<u8>, usize, usize)>,
}

/// The status and JSON-bodied replacement of `buf` if it is one of hyper's own empty error
/// responses.
fn rewrite_error_head(buf: &[u8]) -> Option<(u16, Vec<u8>)> {
    const EMPTY: &str = "\r\ncontent-length: 0\r\n";
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if end != buf.len() {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?;
    let code: u16 = head.split(' ').nth(1)?.parse().ok()?;
    if !(400..600).contains(&code)
        || !head.contains(EMPTY)
        || head.to_ascii_lowercase().contains("content-type")
    {
        return None;
    }
    let status = StatusCode::from_u16(code).ok()?;
    let message = match code {
        431 => "the request head is larger than this server accepts",
        414 => "the request URI is longer than this server accepts",
        _ => "the request could not be parsed as HTTP/1.1 (a malformed request line or header)",
    };
    let body = ApiError::invalid(status, message, None, Some("malformed_request"))
        .body()
        .to_string();
    let head = head.replacen(
        EMPTY,
        &format!(
            "\r\ncontent-length: {}\r\ncontent-type: application/json\r\n",
            body.len()
        ),
        1,
    );
    Some((code, [head.as_bytes(), body.as_bytes()].concat()))
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for JsonErrorIo<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for JsonErrorIo<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.pending.is_none() {
            match rewrite_error_head(buf) {
                Some((status, bytes)) => {
                    this.metrics.response(status);
                    this.pending = Some((bytes, 0, buf.len()));
                }
                None => return std::pin::Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        let Some((bytes, written, stands_for)) = this.pending.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        while *written < bytes.len() {
            match std::pin::Pin::new(&mut this.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *written += n,
                other => return other,
            }
        }
        let n = *stands_for;
        this.pending = None;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serve on `listener` until `shutdown` resolves, then stop accepting, wait for the requests
/// in flight at most `http.shutdown_deadline`, close the connections still open, and stop
/// the decode loop.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: SchedulerHandle,
    seed_base: u64,
    http: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let app = router(AppState::new(handle.clone(), seed_base, http));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(http.header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (sock, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors or a connection reset before accept: not fatal;
                        // wait a moment so a persistent error does not spin.
                        warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = sock.set_nodelay(true);
                let svc = hyper_util::service::TowerToHyperService::new(app.clone());
                let metrics = Arc::clone(handle.metrics());
                let io = JsonErrorIo {
                    inner: TokioIo::new(sock),
                    metrics: Arc::clone(&metrics),
                    pending: None,
                };
                let conn = graceful.watch(builder.serve_connection(io, svc));
                metrics.connections.inc();
                conns.spawn(async move {
                    let _open = GaugeGuard(metrics.connections.clone());
                    if let Err(e) = conn.await {
                        if e.is_timeout() {
                            metrics.header_timeouts.inc();
                        }
                        debug!(%peer, "connection ended: {e}");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    let open = handle.metrics().connections.get();
    info!(
        open,
        in_flight = handle.in_flight(),
        "stopped accepting; waiting for the requests in flight (at most {:.1} s)",
        http.shutdown_deadline.as_secs_f64()
    );
    tokio::select! {
        _ = graceful.shutdown() => info!("requests in flight are done"),
        _ = tokio::time::sleep(http.shutdown_deadline) => {
            warn!(
                "shutdown deadline of {:.1} s passed: closing {} connection(s) still open",
                http.shutdown_deadline.as_secs_f64(),
                handle.metrics().connections.get()
            );
        }
    }
    conns.shutdown().await;
    handle.shutdown();
    Ok(())
}

/// A future that resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn termination_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => info!("SIGINT: draining"),
        _ = term => info!("SIGTERM: draining"),
    }
}

/// A server running on a tokio runtime already there (tests, embedding).
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// The decode loop's handle.
    pub handle: SchedulerHandle,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<()>>,
    scheduler: std::thread::JoinHandle<crate::scheduler::SchedulerSummary>,
}

impl Running {
    /// Start the decode loop over `backend` and serve on `addr` (port 0: any free port) with
    /// the default timeouts and limits.
    pub async fn start(
        backend: Box<dyn crate::backend::StepBackend>,
        cfg: crate::scheduler::SchedulerConfig,
        check: crate::scheduler::SelfCheck,
        addr: SocketAddr,
    ) -> Result<Running> {
        Self::start_with(backend, cfg, check, addr, HttpConfig::default()).await
    }

    /// [`Running::start`] with the HTTP layer's timeouts and limits.
    pub async fn start_with(
        backend: Box<dyn crate::backend::StepBackend>,
        cfg: crate::scheduler::SchedulerConfig,
        check: crate::scheduler::SelfCheck,
        addr: SocketAddr,
        http: HttpConfig,
    ) -> Result<Running> {
        let (handle, scheduler) = crate::scheduler::spawn(backend, cfg, check)?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Io {
                what: format!("binding {addr}"),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Io {
            what: "reading the bound address".into(),
            source,
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, handle.clone(), 0, http, async move {
            let _ = stopped.await;
        }));
        Ok(Running {
            addr,
            handle,
            stop,
            task,
            scheduler,
        })
    }

    /// Base URL, `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Graceful shutdown: stop accepting, drain, stop the decode loop; its summary.
    pub async fn stop(self) -> Result<crate::scheduler::SchedulerSummary> {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(r) => r?,
            Err(e) => {
                return Err(ServeError::invalid("server task", e.to_string()));
            }
        }
        let scheduler = self.scheduler;
        tokio::task::spawn_blocking(move || scheduler.join())
            .await
            .map_err(|e| ServeError::invalid("decode thread", e.to_string()))?
            .map_err(|_| ServeError::SchedulerGone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_own_error_heads_get_a_json_body_and_nothing_else_changes() {
        let head = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 07 Dec 2026 02:00:00 GMT\r\n\r\n";
        let (status, out) = rewrite_error_head(head).unwrap();
        assert_eq!(status, 400);
        let out = String::from_utf8(out).unwrap();
        let (h, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(h.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{h}");
        assert!(
            h.contains("content-type: application/json") && h.contains("date: "),
            "{h}"
        );
        assert!(
            h.contains(&format!("content-length: {}", body.len())),
            "{h}"
        );
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "malformed_request");
        let big = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        let (status, out) = rewrite_error_head(big).unwrap();
        assert_eq!(status, 431);
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("larger than this server accepts"));
        // The router's responses are left alone: successes, JSON errors, heads with a body.
        for other in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n",
            b"data: x\r\n\r\n",
        ] {
            assert_eq!(rewrite_error_head(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
