//! The HTTP face of the server: axum routes over a [`SchedulerHandle`].
//!
//! - `POST /v1/completions`, `POST /v1/chat/completions`: parsed strictly (see [`crate::api`]),
//!   handed to the decode loop; answered whole, or as server-sent events with one chunk per
//!   generated token (its text may be empty while a UTF-8 character is incomplete; the last
//!   token's chunk carries the finish reason), a usage chunk when
//!   `stream_options.include_usage`, and `data: [DONE]`.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//!
//! A client that disconnects drops its response stream, and with it the request's event
//! receiver; the decode loop notices before its next step and frees the slot. [`serve`] stops
//! accepting on the shutdown signal and waits for the requests in flight (axum's graceful
//! shutdown), then lets the decode loop drain and stop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::info;

use crate::api::{
    parse_body, ApiError, ChatRequest, CompletionRequest, Endpoint, Limits, ResponseId, Usage,
    Validated,
};
use crate::error::{Result, ServeError};
use crate::scheduler::{FinishReason, GenerateRequest, SchedulerHandle, SubmitError, TokenEvent};
use crate::tokenizer::TextStream;

/// Largest request body accepted, bytes (1 MiB: a prompt at any context limit this server
/// takes fits many times over; larger bodies are refused with 413 before parsing).
pub const BODY_LIMIT_BYTES: usize = 1 << 20;

/// Shared state of the handlers.
pub struct AppState {
    handle: SchedulerHandle,
    created: u64,
    next: AtomicU64,
    seed_base: u64,
}

impl AppState {
    /// State over a running decode loop; `seed_base` seeds requests that give no seed.
    pub fn new(handle: SchedulerHandle, seed_base: u64) -> Arc<Self> {
        Arc::new(AppState {
            handle,
            created: unix_now(),
            next: AtomicU64::new(1),
            seed_base,
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
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
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
    let text = s.handle.metrics().with(|m| m.render());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn body_error(r: BytesRejection) -> ApiError {
    let status = r.status();
    let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
        "request_too_large"
    } else {
        "invalid_body"
    };
    ApiError::invalid(status, r.body_text(), None, Some(code))
}

async fn completions(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let n = s.next.fetch_add(1, Ordering::Relaxed);
    let v = body
        .map_err(body_error)
        .and_then(|b| parse_body::<CompletionRequest>(&b))
        .and_then(|r| r.validate(s.model(), s.limits(), s.seed_base.wrapping_add(n)));
    respond(&s, v, Endpoint::Completions, format!("cmpl-{n}")).await
}

async fn chat(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let n = s.next.fetch_add(1, Ordering::Relaxed);
    let v = body
        .map_err(body_error)
        .and_then(|b| parse_body::<ChatRequest>(&b))
        .and_then(|r| r.validate(s.model(), s.limits(), s.seed_base.wrapping_add(n)));
    respond(&s, v, Endpoint::Chat, format!("chatcmpl-{n}")).await
}

fn reject(s: &AppState, e: ApiError) -> Response {
    s.handle.metrics().with(|m| m.reject(e.status.as_u16()));
    e.into_response()
}

async fn respond(
    s: &Arc<AppState>,
    v: std::result::Result<Validated, ApiError>,
    endpoint: Endpoint,
    id: String,
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
                    StatusCode::UNPROCESSABLE_ENTITY,
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
    if v.stream {
        Sse::new(sse_stream(
            rx,
            rid,
            v.stops,
            v.include_usage,
            v.prompt.len(),
        ))
        .into_response()
    } else {
        whole(rx, rid, v.stops, v.prompt.len()).await
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
) -> Response {
    let mut ts = TextStream::new(&stops);
    let mut text = String::new();
    let mut tokens = 0usize;
    let finish = loop {
        match rx.recv().await {
            Some(TokenEvent::Token { token, finish }) => {
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
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

impl SseState {
    fn end(&mut self, reason: FinishReason, text: String) -> Event {
        self.rx = None; // frees the slot if the loop still holds it (a stop sequence)
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
    };
    stream::unfold(st, |mut st| async move {
        if let Some(e) = st.tail.pop() {
            return Some((e, st));
        }
        let rx = st.rx.as_mut()?;
        let ev = match rx.recv().await {
            Some(TokenEvent::Token { token, finish }) => {
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

/// Serve on `listener` until `shutdown` resolves, then stop accepting, wait for the requests
/// in flight and stop the decode loop.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: SchedulerHandle,
    seed_base: u64,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let addr = listener.local_addr().ok();
    let app = router(AppState::new(handle.clone(), seed_base));
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| ServeError::Io {
            what: format!(
                "serving on {}",
                addr.map_or("?".to_string(), |a: SocketAddr| a.to_string())
            ),
            source,
        });
    info!(
        in_flight = handle.in_flight(),
        "stopped accepting; requests in flight are done"
    );
    handle.shutdown();
    result
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
    /// Start the decode loop over `backend` and serve on `addr` (port 0: any free port).
    pub async fn start(
        backend: Box<dyn crate::backend::StepBackend>,
        cfg: crate::scheduler::SchedulerConfig,
        check: crate::scheduler::SelfCheck,
        addr: SocketAddr,
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
        let task = tokio::spawn(serve(listener, handle.clone(), 0, async move {
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
