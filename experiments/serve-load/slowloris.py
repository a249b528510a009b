"""Slow and in-flight clients for the serve-load experiment (127.0.0.1 only, bounded).

  slowloris.py loris HOST PORT OUT [--head N] [--body N] [--every S] [--limit S]
      N connections that send a partial request head, N that send a whole head and then a
      partial body, each one byte every S seconds (default 5); records, per connection, when
      the server closed it and what it answered. Stops when every connection is closed or
      after --limit seconds (default 60).
  slowloris.py stream HOST PORT OUT [--n N] [--max-tokens T]
      N concurrent streamed completions (greedy, ignore_eos): whether each ended with
      [DONE] after T token chunks.
Writes a JSON summary to OUT.
"""
import argparse
import json
import socket
import threading
import time


def loris(host, port, kind, every, limit, results, i):
    t0 = time.monotonic()
    s = socket.create_connection((host, port), timeout=limit)
    if kind == "head":
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    else:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 4000\r\n\r\n{\"prompt\": \"")
    s.settimeout(every)
    got, sent = b"", 0
    closed_after = None
    while time.monotonic() - t0 < limit:
        try:
            chunk = s.recv(4096)
            if not chunk:
                closed_after = time.monotonic() - t0
                break
            got += chunk
            continue
        except socket.timeout:
            pass
        except OSError:
            closed_after = time.monotonic() - t0
            break
        try:
            s.sendall(b"a")
            sent += 1
        except OSError:
            closed_after = time.monotonic() - t0
            break
    s.close()
    status = got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/") else None
    results[i] = {"kind": kind, "closed_after_s": closed_after, "bytes_trickled": sent,
                  "status": status, "json_body": b"\"error\"" in got}


def stream(host, port, max_tokens, results, i):
    body = json.dumps({"prompt": f"in flight {i}", "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    s = socket.create_connection((host, port), timeout=120)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    s.close()
    text = got.decode(errors="replace")
    chunks = text.count('"finish_reason":null') + text.count('"finish_reason":"length"')
    results[i] = {"status": text.split(" ", 2)[1] if text.startswith("HTTP/") else None,
                  "done": "data: [DONE]" in text, "token_chunks": chunks}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["loris", "stream"])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("out")
    p.add_argument("--head", type=int, default=8)
    p.add_argument("--body", type=int, default=8)
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--limit", type=float, default=60.0)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=512)
    a = p.parse_args()
    if a.mode == "loris":
        kinds = ["head"] * a.head + ["body"] * a.body
        results = [None] * len(kinds)
        threads = [threading.Thread(target=loris, args=(a.host, a.port, k, a.every, a.limit, results, i))
                   for i, k in enumerate(kinds)]
    else:
        results = [None] * a.n
        threads = [threading.Thread(target=stream, args=(a.host, a.port, a.max_tokens, results, i))
                   for i in range(a.n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summary = {"mode": a.mode, "connections": results}
    if a.mode == "loris":
        for k in ("head", "body"):
            rs = [r for r in results if r["kind"] == k]
            closed = [r["closed_after_s"] for r in rs if r["closed_after_s"] is not None]
            summary[k] = {"connections": len(rs), "closed": len(closed),
                          "closed_after_s_max": max(closed) if closed else None,
                          "statuses": sorted({str(r["status"]) for r in rs})}
    else:
        summary["complete"] = sum(1 for r in results if r["done"] and r["token_chunks"] == a.max_tokens)
    json.dump(summary, open(a.out, "w"), indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "connections"}))


main()
