//! The server end to end on loopback, over the reference backend (a real, tiny MoE model).

use std::time::Duration;

use ft_model::{FetchFraction, Strategy, StrategyKind};
use ft_serve::backend::paced::Paced;
use ft_serve::backend::reference::{ReferenceConfig, ReferenceMoe};
use ft_serve::backend::StepBackend;
use ft_serve::http::Running;
use ft_serve::loadgen::{self, StressConfig};
use ft_serve::monitor::CheckConfig;
use ft_serve::predict::{Corrected, TablePredictor, TableRow};
use ft_serve::scheduler::{SchedulerConfig, SelfCheck};
use futures::StreamExt;
use serde_json::{json, Value};

fn reference(strategy: Strategy) -> ReferenceMoe {
    ReferenceMoe::new(ReferenceConfig::tiny(11), strategy).unwrap()
}

fn config(backend: &dyn StepBackend, max_streams: usize, max_queue: usize) -> SchedulerConfig {
    let mut c = SchedulerConfig::for_backend(&backend.info());
    c.max_streams = max_streams;
    c.max_queue = max_queue;
    c.context_limit = 512;
    c.prefill_chunk = 16;
    c
}

fn no_check() -> SelfCheck {
    SelfCheck {
        predictor: None,
        auto: false,
    }
}

async fn start(backend: Box<dyn StepBackend>, cfg: SchedulerConfig, check: SelfCheck) -> Running {
    Running::start(backend, cfg, check, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn post(url: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn post_raw(url: &str, path: &str, body: &'static str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// Read an SSE response: the JSON chunks and how many `[DONE]` lines.
async fn sse(url: &str, path: &str, body: Value) -> (Vec<Value>, usize) {
    let text = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut chunks = Vec::new();
    let mut done = 0;
    for line in text.lines() {
        if let Some(d) = line.strip_prefix("data: ") {
            if d == "[DONE]" {
                done += 1;
            } else {
                assert_eq!(done, 0, "data after [DONE]: {d}");
                chunks.push(serde_json::from_str(d).unwrap());
            }
        }
    }
    (chunks, done)
}

/// `/metrics`, parsed by a Prometheus text parser.
struct Scraped(prometheus_parse::Scrape);

async fn scrape(url: &str) -> Scraped {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    Scraped(prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap())
}

impl Scraped {
    fn sample(&self, name: &str, labels: &[(&str, &str)]) -> &prometheus_parse::Sample {
        self.0
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("{name} {labels:?} in {:?}", self.0.samples))
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match &self.sample(name, labels).value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{name}: {other:?}"),
        }
    }

    /// A histogram's observation count (its +Inf bucket), checked against its buckets.
    fn histogram_count(&self, name: &str) -> f64 {
        match &self.sample(name, &[]).value {
            prometheus_parse::Value::Histogram(h) => {
                assert!(
                    h.windows(2).all(|w| w[0].count <= w[1].count),
                    "{name}: buckets are cumulative: {h:?}"
                );
                let inf = h.iter().find(|b| b.less_than == f64::INFINITY);
                inf.map_or_else(|| h.last().map_or(0.0, |b| b.count), |b| b.count)
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_streaming_and_batching() {
    let b = Box::new(reference(Strategy::Offload));
    let cfg = config(b.as_ref(), 8, 8);
    let srv = start(b, cfg, no_check()).await;
    let url = srv.url();
    let http = reqwest::Client::new();

    let h: Value = http
        .get(format!("{url}/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "ok");
    let m: Value = http
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["data"][0]["id"], "ft-tiny-moe");

    // Whole and streamed answers agree, token for token.
    let (s, whole) = post(&url, "/v1/completions", completion("Hello", 24)).await;
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["usage"]["completion_tokens"], 24);
    assert_eq!(whole["usage"]["prompt_tokens"], 6, "BOS + 5 bytes");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    let mut body = completion("Hello", 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (chunks, done) = sse(&url, "/v1/completions", body).await;
    assert_eq!(done, 1);
    let token_chunks: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    assert_eq!(token_chunks.len(), 24, "one chunk per token");
    assert!(token_chunks[..23]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    let last = &chunks[chunks.len() - 1];
    assert_eq!(last["usage"]["completion_tokens"], 24);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );

    // Chat, streamed: role first, content deltas, finish.
    let (chunks, done) = sse(
        &url,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
               "stream": true, "ignore_eos": true}),
    )
    .await;
    assert_eq!(done, 1);
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // Many concurrent requests give exactly what each gives alone (continuous batching
    // does not change a stream's numerics), and seeded sampling is reproducible.
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("prompt number {i} {}", "x".repeat(i * 7)))
        .collect();
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(
            post(&url, "/v1/completions", completion(p, 20)).await.1["choices"][0]["text"].clone(),
        );
    }
    let together = futures::future::join_all(
        prompts
            .iter()
            .map(|p| post(&url, "/v1/completions", completion(p, 20))),
    )
    .await;
    for (a, (s, t)) in alone.iter().zip(&together) {
        assert_eq!(*s, 200);
        assert_eq!(a, &t["choices"][0]["text"]);
    }
    let sampled = json!({"prompt": "abc", "max_tokens": 16, "temperature": 0.8, "seed": 5, "ignore_eos": true});
    let a = post(&url, "/v1/completions", sampled.clone()).await.1;
    let b = post(&url, "/v1/completions", sampled).await.1;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    // /metrics, parsed, agrees with the requests above: 17 answered (1 + 1 + 1 + 6 + 6 + 2)
    // with 24, 24, 5, 12 x 20 and 2 x 16 tokens, and 2 GETs before the scrape.
    let requests = 17.0;
    let tokens = [24, 24, 5].into_iter().chain([20; 12]).chain([16; 2]);
    let (generated, gaps) = tokens.fold((0, 0), |(g, i), t| (g + t, i + t - 1));
    let m = scrape(&url).await;
    assert_eq!(m.value("ft_generated_tokens_total", &[]), generated as f64);
    assert_eq!(
        m.value("ft_requests_total", &[("outcome", "completed")]),
        requests
    );
    assert_eq!(
        m.value("ft_http_responses_total", &[("status", "200")]),
        requests + 2.0
    );
    assert_eq!(
        m.histogram_count("ft_time_to_first_token_seconds"),
        requests
    );
    assert_eq!(m.histogram_count("ft_request_duration_seconds"), requests);
    assert_eq!(
        m.histogram_count("ft_inter_token_latency_seconds"),
        gaps as f64
    );
    assert!(m.histogram_count("ft_decode_step_duration_seconds") > 0.0);
    let (hits, misses) = (
        m.value("ft_expert_hits_total", &[]),
        m.value("ft_expert_misses_total", &[]),
    );
    assert!(hits > 0.0 && misses > 0.0, "{hits} {misses}");
    assert_eq!(
        m.value("ft_expert_fetched_total", &[]),
        misses,
        "offload fetches every miss"
    );
    assert_eq!(m.value("ft_expert_cpu_total", &[]), 0.0);
    assert!(m.value("ft_gathered_bytes_total", &[]) > 0.0);
    assert_eq!(m.value("ft_strategy", &[("strategy", "offload")]), 1.0);
    assert_eq!(m.value("ft_fetch_fraction", &[]), 1.0);
    assert_eq!(m.value("ft_info", &[("strategy", "offload")]), 1.0);
    assert_eq!(m.value("ft_active_streams", &[]), 0.0, "idle");
    let summary = srv.stop().await.unwrap();
    assert!(summary.steps > 0 && summary.switches.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors() {
    // One slot, no queue, slow steps: a second request is refused with 429.
    let inner = reference(Strategy::Offload);
    let b = Box::new(Paced::new(
        inner,
        Box::new(|_, _, _| Duration::from_millis(5)),
    ));
    let cfg = config(b.as_ref(), 1, 0);
    let srv = start(b, cfg, no_check()).await;
    let url = srv.url();
    let cases: Vec<(u16, (u16, Value))> = vec![
        (
            400,
            post_raw(&url, "/v1/completions", "{\"prompt\": \"x\",").await,
        ),
        (
            400,
            post_raw(&url, "/v1/completions", "{\"prompt\": \"x\", \"bogus\": 1}").await,
        ),
        (
            400,
            post_raw(&url, "/v1/chat/completions", "{\"messages\": \"x\"}").await,
        ),
        (
            400,
            post(&url, "/v1/completions", completion(&"a".repeat(600), 4)).await,
        ),
        (
            400,
            post(&url, "/v1/completions", completion("abc", 600)).await,
        ),
        (
            400,
            post(
                &url,
                "/v1/completions",
                json!({"prompt": "x", "temperature": -1}),
            )
            .await,
        ),
        (
            404,
            post(
                &url,
                "/v1/completions",
                json!({"prompt": "x", "model": "gpt-9"}),
            )
            .await,
        ),
    ];
    for (want, (got, body)) in &cases {
        assert_eq!(want, got, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert!(body["error"]["type"].is_string(), "{body}");
    }
    // A body over the limit is refused from its Content-Length, before it is read: the head
    // alone gets the 413 (a client still writing the body may instead see the connection
    // closed under it, which is the refusal too, but not one a test can read).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            ft_serve::http::BODY_LIMIT_BYTES + 10
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut response))
            .await
            .expect("the 413 comes before any body byte")
            .unwrap();
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 413"), "{response}");
        let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
        let e: Value = serde_json::from_str(body.trim()).expect("a JSON error body");
        assert!(e["error"]["message"].is_string(), "{e}");
    }

    let busy_url = url.clone();
    let first =
        tokio::spawn(
            async move { post(&busy_url, "/v1/completions", completion("slow", 60)).await },
        );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (s, body) = post(&url, "/v1/completions", completion("second", 4)).await;
    assert_eq!(s, 429, "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let (s, _) = first.await.unwrap();
    assert_eq!(s, 200);
    let (s, _) = post(&url, "/v1/completions", completion("third", 4)).await;
    assert_eq!(s, 200, "the slot is free again");
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_frees_its_slot_and_shutdown_drains() {
    let inner = reference(Strategy::Offload);
    let b = Box::new(Paced::new(
        inner,
        Box::new(|_, _, _| Duration::from_millis(3)),
    ));
    let cfg = config(b.as_ref(), 1, 0);
    let srv = start(b, cfg, no_check()).await;
    let url = srv.url();
    let mut body = completion("going away", 400);
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut s = r.bytes_stream();
    let _ = s.next().await.unwrap().unwrap();
    assert_eq!(srv.handle.in_flight(), 1);
    drop(s);
    // Freed at the next step (3 ms), long before the 400 tokens would end.
    let mut freed = false;
    for _ in 0..100 {
        if srv.handle.in_flight() == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the slot of a disconnected client is freed");
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ft_requests_total{outcome=\"cancelled\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("ft_active_streams 0"), "{metrics}");

    // Graceful shutdown: a request in flight completes whole.
    let mut body = completion("finish me", 50);
    body["stream"] = json!(true);
    let u = url.clone();
    let inflight = tokio::spawn(async move { sse(&u, "/v1/completions", body).await });
    tokio::time::sleep(Duration::from_millis(40)).await;
    let summary = srv.stop().await.unwrap();
    let (chunks, done) = inflight.await.unwrap();
    assert_eq!(done, 1);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(
        chunks
            .iter()
            .filter(|c| c["choices"][0]["finish_reason"].is_null())
            .count(),
        49
    );
    assert!(summary.steps >= 50);
    assert!(
        reqwest::get(format!("{url}/health")).await.is_err(),
        "no longer accepting"
    );
}

/// Under auto, a backend whose offload is 4x slower than predicted makes the server refit
/// and switch to hybrid between steps; every response completes and is identical to a run
/// without switching (the reference backend's numerics do not depend on the strategy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_switches_between_steps_without_corrupting_requests() {
    let hybrid = Strategy::Hybrid {
        fetch: FetchFraction::Fixed(0.5),
    };
    let table = TablePredictor {
        rows: vec![
            TableRow {
                strategy: Strategy::Offload,
                tok_s_1: 1000.0,
                slowdown: 0.0,
                rel_interval: 0.2,
                miss_rate: None,
            },
            TableRow {
                strategy: hybrid,
                tok_s_1: 500.0,
                slowdown: 0.0,
                rel_interval: 0.2,
                miss_rate: None,
            },
        ],
    };
    // Realised: offload 4 ms a step (250 tok/s), hybrid 2 ms (500 tok/s).
    let paced = Paced::new(
        reference(Strategy::Offload),
        Box::new(|s, _, _| match s.kind() {
            StrategyKind::Offload => Duration::from_millis(4),
            _ => Duration::from_millis(2),
        }),
    );
    let history = paced.history();
    let b = Box::new(paced);
    let mut cfg = config(b.as_ref(), 8, 8);
    cfg.check = CheckConfig {
        window_steps: 8,
        sustain: 2,
        enabled: true,
    };
    let check = SelfCheck {
        predictor: Some(Box::new(Corrected::new(table))),
        auto: true,
    };
    let srv = start(b, cfg, check).await;
    let url = srv.url();
    let prompts: Vec<String> = (0..4).map(|i| format!("stream {i}")).collect();
    let run = |url: String| {
        let prompts = prompts.clone();
        async move {
            futures::future::join_all(prompts.iter().map(|p| {
                let mut body = completion(p, 80);
                body["stream"] = json!(true);
                let url = url.clone();
                async move { sse(&url, "/v1/completions", body).await }
            }))
            .await
        }
    };
    let switched = run(url.clone()).await;
    let summary = srv.stop().await.unwrap();
    assert_eq!(summary.switches.len(), 1, "{:?}", summary.switches);
    let sw = &summary.switches[0];
    assert_eq!(
        (sw.from.kind(), sw.to.kind()),
        (StrategyKind::Offload, StrategyKind::Hybrid)
    );
    assert!(sw.reason.contains("tok/s"), "{}", sw.reason);
    let h = history.lock().unwrap().clone();
    let k = sw.before_step as usize;
    assert!(k > 0 && k < h.len());
    assert!(h[..k].iter().all(|s| s.kind() == StrategyKind::Offload));
    assert!(h[k..].iter().all(|s| s.kind() == StrategyKind::Hybrid));

    // The same requests without any switch.
    let b = Box::new(reference(Strategy::Offload));
    let cfg = config(b.as_ref(), 8, 8);
    let srv = start(b, cfg, no_check()).await;
    let plain = run(srv.url()).await;
    srv.stop().await.unwrap();
    for ((c1, d1), (c2, d2)) in switched.iter().zip(&plain) {
        assert_eq!((*d1, *d2), (1, 1));
        let text = |c: &Vec<Value>| {
            c.iter()
                .filter_map(|c| c["choices"][0]["text"].as_str())
                .collect::<String>()
        };
        assert_eq!(text(c1), text(c2));
        assert_eq!(
            c1.len(),
            80,
            "one chunk per token, the last with the finish reason"
        );
    }
}

/// A bounded loopback load test: many clients, some disconnecting mid-stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_on_loopback_loses_nothing() {
    let b = Box::new(reference(Strategy::Offload));
    let cfg = config(b.as_ref(), 8, 64);
    let srv = start(b, cfg, no_check()).await;
    let report = loadgen::stress(&StressConfig {
        url: srv.url(),
        clients: 24,
        requests: 96,
        prompts: 6,
        disconnect_fraction: 0.25,
        prompt_chars: 40,
        max_tokens: 24,
        duration_limit_s: 30.0,
        seed: 3,
    })
    .await
    .unwrap();
    assert!(report.passed(), "{}", report.table());
    assert_eq!(report.sent, 96);
    assert!(
        report.disconnected > 0 && report.completed > 0,
        "{}",
        report.table()
    );
    srv.stop().await.unwrap();
}
