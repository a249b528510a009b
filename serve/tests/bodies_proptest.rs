//! Property test of the HTTP request bodies: any body, JSON or not, gets a valid response or
//! a 4xx with an OpenAI-shaped JSON error, never a panic, a 5xx or a hang. The router is
//! driven in process with tower's `oneshot` over the reference backend.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use ft_model::Strategy as MoeStrategy;
use ft_serve::backend::reference::{ReferenceConfig, ReferenceMoe};
use ft_serve::backend::StepBackend;
use ft_serve::http::{router, AppState, HttpConfig};
use ft_serve::scheduler::{self, SchedulerConfig, SelfCheck};
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tower::ServiceExt;

/// Fields the two endpoints know, plus a few they do not.
const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stream",
    "stream_options",
    "stop",
    "n",
    "user",
    "ignore_eos",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "response_format",
    "store",
    "metadata",
    "service_tier",
    "logprobs",
    "top_logprobs",
    "echo",
    "best_of",
    "suffix",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "modalities",
    "reasoning_effort",
    "functions",
    "bogus",
];

/// Longest context of the test server, tokens (small so that any accepted request is quick).
const CONTEXT: usize = 48;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u32..80).prop_map(Value::from),
        (-5.0f64..5.0).prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        Just(json!("text")),
        Just(json!({"type": "text"})),
        Just(json!({"include_usage": true})),
        Just(json!([{"role": "user", "content": "hi"}])),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid request of either endpoint with some of its fields replaced by anything.
fn mutated_request() -> impl Strategy<Value = (bool, Value)> {
    (
        any::<bool>(),
        prop::collection::vec((prop::sample::select(FIELDS), json_value()), 0..4),
        any::<bool>(),
    )
        .prop_map(|(chat, edits, stream)| {
            let mut body: Map<String, Value> = if chat {
                json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
            } else {
                json!({"prompt": "hello", "max_tokens": 3})
            }
            .as_object()
            .cloned()
            .unwrap_or_default();
            body.insert("stream".into(), Value::Bool(stream));
            for (k, v) in edits {
                body.insert(k.to_string(), v);
            }
            (chat, Value::Object(body))
        })
}

/// A router over a running decode loop (the loop's thread lives as long as the test).
fn app(rt: &tokio::runtime::Runtime) -> Router {
    let b = ReferenceMoe::new(ReferenceConfig::tiny(3), MoeStrategy::Offload).unwrap();
    let mut cfg = SchedulerConfig::for_backend(&b.info());
    cfg.max_streams = 4;
    cfg.max_queue = 64;
    cfg.context_limit = CONTEXT;
    let check = SelfCheck {
        predictor: None,
        auto: false,
    };
    let (handle, _join) = scheduler::spawn(Box::new(b), cfg, check).unwrap();
    let _guard = rt.enter();
    router(AppState::new(handle, 0, HttpConfig::default()))
}

/// Send `body` and check the answer: 200 with a complete answer, or a 4xx with a JSON error.
fn check(rt: &tokio::runtime::Runtime, app: &Router, chat: bool, body: Vec<u8>) {
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let req = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.clone()))
        .unwrap();
    let (status, bytes) = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), async {
            let r = app.clone().oneshot(req).await.unwrap();
            let status = r.status();
            let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, bytes)
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no answer within 20 s to {}",
                String::from_utf8_lossy(&body)
            )
        })
    });
    let text = String::from_utf8_lossy(&bytes);
    let shown = String::from_utf8_lossy(&body);
    if status == StatusCode::OK {
        if let Some(events) = text.strip_prefix("data: ") {
            assert!(
                events.trim_end().ends_with("data: [DONE]"),
                "{shown} -> {text}"
            );
        } else {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(
                v["choices"][0]["finish_reason"].is_string(),
                "{shown} -> {v}"
            );
        }
    } else {
        assert!(
            status.is_client_error(),
            "{shown} -> {status} (only 200 or 4xx) {text}"
        );
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{shown} -> {v}"
        );
        assert!(v["error"]["type"].is_string(), "{shown} -> {v}");
    }
}

/// One runtime and one server for every case of both properties.
fn server() -> &'static (tokio::runtime::Runtime, Router) {
    static SERVER: OnceLock<(tokio::runtime::Runtime, Router)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let app = app(&rt);
        (rt, app)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn any_request_json_is_served_or_refused_with_json(req in mutated_request()) {
        let (rt, app) = server();
        check(rt, app, req.0, serde_json::to_vec(&req.1).unwrap());
    }

    #[test]
    fn any_json_or_bytes_are_refused_with_json(
        chat in any::<bool>(),
        body in prop_oneof![
            json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
            prop::collection::vec(any::<u8>(), 0..64),
        ],
    ) {
        let (rt, app) = server();
        check(rt, app, chat, body);
    }
}
