//! The HTTP layer against clients that misbehave: slowloris headers and bodies, an oversized
//! Content-Length, methods and routes the router refuses, and a shutdown with such clients
//! still connected. Timeouts are short (fractions of a second) so the tests stay fast; the
//! flags' defaults are the same code with longer values.

use std::time::{Duration, Instant};

use ft_model::Strategy;
use ft_serve::backend::paced::Paced;
use ft_serve::backend::reference::{ReferenceConfig, ReferenceMoe};
use ft_serve::backend::StepBackend;
use ft_serve::http::{HttpConfig, Running};
use ft_serve::scheduler::{SchedulerConfig, SelfCheck};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A server over the reference model, each step stretched to `step_ms`.
async fn start(http: HttpConfig, step_ms: u64) -> Running {
    let inner = ReferenceMoe::new(ReferenceConfig::tiny(5), Strategy::Offload).unwrap();
    let b = Box::new(Paced::new(
        inner,
        Box::new(move |_, _, _| Duration::from_millis(step_ms)),
    ));
    let mut cfg = SchedulerConfig::for_backend(&b.info());
    cfg.max_streams = 4;
    cfg.max_queue = 4;
    cfg.context_limit = 512;
    let check = SelfCheck {
        predictor: None,
        auto: false,
    };
    Running::start_with(b, cfg, check, "127.0.0.1:0".parse().unwrap(), http)
        .await
        .unwrap()
}

fn http(header_ms: u64, body_ms: u64, deadline_ms: u64) -> HttpConfig {
    HttpConfig {
        header_timeout: Duration::from_millis(header_ms),
        body_timeout: Duration::from_millis(body_ms),
        max_body_bytes: 64 * 1024,
        shutdown_deadline: Duration::from_millis(deadline_ms),
    }
}

/// Read until the server closes the connection (or `limit` passes); what came and when the
/// connection closed.
async fn read_to_close(s: &mut TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (String::from_utf8_lossy(&got).into(), Some(t0.elapsed()))
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into(), None),
        }
    }
}

/// Send `bytes` one at a time every `every`, stopping early when the server closes.
async fn trickle(s: &mut TcpStream, bytes: &[u8], every: Duration) {
    for b in bytes {
        if s.write_all(&[*b]).await.is_err() {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

fn status_and_json(raw: &str) -> (u16, Value) {
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let body = raw.split_once("\r\n\r\n").map_or("", |x| x.1);
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {raw:?}"));
    (status, json)
}

async fn raw_request(url: &str, req: &str) -> String {
    let mut s = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    read_to_close(&mut s, Duration::from_secs(10)).await.0
}

fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{series} in\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_oversized_requests_are_cut_off_with_json_errors() {
    let srv = start(http(400, 600, 2000), 0).await;
    let url = srv.url();
    let addr = srv.addr.to_string();

    // Partial headers, a byte every 150 ms: closed at the header timeout, no response.
    let mut slow_head = TcpStream::connect(&addr).await.unwrap();
    let head_writer = async {
        slow_head
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let t0 = Instant::now();
        let (mut r, mut w) = slow_head.split();
        let trickling = async {
            for _ in 0..40 {
                if w.write_all(b"a").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        };
        let mut buf = [0u8; 64];
        tokio::select! {
            _ = trickling => None,
            n = r.read(&mut buf) => Some((n.map_or(0, |n| n), t0.elapsed())),
        }
    };
    // A complete head, then the body a byte every 150 ms: 408 at the body timeout.
    let mut slow_body = TcpStream::connect(&addr).await.unwrap();
    let body_writer = async {
        slow_body
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{")
            .await
            .unwrap();
        let t0 = Instant::now();
        let (mut r, mut w) = slow_body.split();
        let trickling = trickle_half(&mut w);
        let mut got = Vec::new();
        let reading = async {
            let mut buf = [0u8; 4096];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        };
        tokio::select! {
            _ = async { trickling.await; std::future::pending::<()>().await } => {},
            _ = reading => {},
        }
        (String::from_utf8_lossy(&got).to_string(), t0.elapsed())
    };
    let (head, (body_raw, body_t)) = tokio::join!(head_writer, body_writer);
    let (n, head_t) = head.expect("the server closes a slowloris header");
    assert_eq!(n, 0, "closed without a response");
    assert!(
        head_t >= Duration::from_millis(300) && head_t < Duration::from_millis(3000),
        "header timeout 400 ms, closed after {head_t:?}"
    );
    let (status, e) = status_and_json(&body_raw);
    assert_eq!(status, 408, "{body_raw}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--body-timeout-s"),
        "{e}"
    );
    assert!(
        body_t >= Duration::from_millis(500) && body_t < Duration::from_millis(3500),
        "body timeout 600 ms, answered after {body_t:?}"
    );

    // Content-Length 10^12: refused from the header, nothing read.
    let t0 = Instant::now();
    let raw = raw_request(
        &url,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n{\"prompt\"",
    )
    .await;
    let (status, e) = status_and_json(&raw);
    assert_eq!(status, 413, "{raw}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1000000000000"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
    // A chunked body over the limit: refused once it passes it.
    let chunk = "a".repeat(40 * 1024);
    let raw = raw_request(
        &url,
        &format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len(),
            chunk.len()
        ),
    )
    .await;
    assert_eq!(status_and_json(&raw).0, 413, "{raw}");

    // The router's own refusals are JSON too.
    let raw = raw_request(
        &url,
        "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (status, e) = status_and_json(&raw);
    assert_eq!(status, 405, "{raw}");
    assert!(raw.to_ascii_lowercase().contains("allow: post"), "{raw}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.contains("GET") && m.contains("/v1/completions"), "{m}");
    let raw = raw_request(
        &url,
        "DELETE /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_and_json(&raw).0, 404, "{raw}");
    // A request hyper cannot parse is refused by hyper itself (400), with a JSON body, and
    // counted.
    let raw = raw_request(&url, "BOGUS\0 / HTTP/1.1\r\n\r\n").await;
    let (status, e) = status_and_json(&raw);
    assert_eq!(status, 400, "{raw}");
    assert_eq!(e["error"]["code"], "malformed_request", "{e}");

    // Every response counted; the load gauges read zero once idle.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (status, n) in [(408, 1.0), (413, 2.0), (405, 1.0), (404, 1.0), (400, 1.0)] {
        assert_eq!(
            sample(
                &metrics,
                &format!("ft_http_responses_total{{status=\"{status}\"}}")
            ),
            n,
            "{status}"
        );
    }
    assert_eq!(sample(&metrics, "ft_http_header_timeouts_total"), 1.0);
    for gauge in [
        "ft_active_streams",
        "ft_queued_requests",
        "ft_http_requests_in_flight",
    ] {
        assert_eq!(sample(&metrics, gauge), 0.0, "{gauge}");
    }
    assert_eq!(
        sample(&metrics, "ft_http_connections"),
        1.0,
        "only the scrape's own"
    );
    srv.stop().await.unwrap();
}

async fn trickle_half(w: &mut tokio::net::tcp::WriteHalf<'_>) {
    for _ in 0..100 {
        if w.write_all(b" ").await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// Shutdown with slowloris clients connected (their headers would take far longer than the
/// deadline) and a complete request streaming: the stream finishes whole, the stragglers are
/// closed at the deadline, and the server stops within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_meets_its_deadline_under_slowloris() {
    let deadline = Duration::from_millis(1500);
    let srv = start(http(60_000, 60_000, deadline.as_millis() as u64), 3).await;
    let addr = srv.addr.to_string();
    let mut stragglers = Vec::new();
    for i in 0..4 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        if i % 2 == 0 {
            s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .unwrap();
        } else {
            s.write_all(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
            )
            .await
            .unwrap();
        }
        stragglers.push(tokio::spawn(async move {
            trickle(&mut s, &[b'a'; 1000], Duration::from_millis(200)).await;
        }));
    }
    // A complete streamed request, in flight when the shutdown starts.
    let url = srv.url();
    let streaming = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(
                &serde_json::json!({"prompt": "finish me", "max_tokens": 120, "temperature": 0,
                                      "ignore_eos": true, "stream": true}),
            )
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t0 = Instant::now();
    srv.stop().await.unwrap();
    let took = t0.elapsed();
    assert!(
        took < deadline + Duration::from_millis(2000),
        "stopped after {took:?}, deadline {deadline:?}"
    );
    let body = tokio::time::timeout(Duration::from_secs(5), streaming)
        .await
        .unwrap()
        .unwrap();
    assert!(body.contains("data: [DONE]"), "{body}");
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
    for s in stragglers {
        tokio::time::timeout(Duration::from_secs(5), s)
            .await
            .expect("a straggler's connection is closed")
            .unwrap();
    }
}
