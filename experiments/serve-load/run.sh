#!/usr/bin/env bash
# Loopback load test of `ft serve`: many concurrent streaming clients, some disconnecting
# mid-stream, bounded in request count and time (it stops by itself). Checks that no
# response is lost, duplicated or corrupted (greedy decoding is deterministic, so every
# completed stream must equal the non-streamed answer for its prompt), that the server
# still answers afterwards with no request left in flight and its resident memory does not
# grow after a warm-up, that slowloris clients are cut off at the documented timeouts, and
# that SIGTERM with slowloris clients connected and streams in flight exits 0 within the
# shutdown deadline with every stream complete. 127.0.0.1 only.
#
# Usage: run.sh OUTDIR (the committed results: run.sh experiments/serve-load/results), e.g.
#   FT=target/release/ft experiments/serve-load/run.sh /tmp/serve-load
# Env: FT (default target/release/ft), CLIENTS (64) and REQUESTS (640) of the storm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
FT="${FT:-$root/target/release/ft}"
# shellcheck source=../lib/env-txt.sh
source "$here/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
CLIENTS="${CLIENTS:-64}"
REQUESTS="${REQUESTS:-640}"
DEADLINE_S=25
mkdir -p "$OUT"
cat > "$OUT/tiny.toml" <<'TOML'
name = "tiny-serve"
format = "bf16"

[geometry]
hidden = 256
intermediate = 128
experts = 32
top_k = 4
moe_layers = 4
TOML
write_env_txt "$OUT/machine.txt" serve-load "$0 $*" "clients=$CLIENTS requests=$REQUESTS"

"$FT" -v serve --model "$OUT/tiny.toml" --device host --moe-strategy offload --port 0 \
  --max-streams 8 --max-queue 64 --context-limit 1024 --header-timeout-s 10 --body-timeout-s 30 \
  --shutdown-deadline-s "$DEADLINE_S" > "$OUT/serve.stdout" 2> "$OUT/serve.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q listening "$OUT/serve.stdout" 2>/dev/null && break
  kill -0 "$pid" || { cat "$OUT/serve.log" >&2; exit 1; }
  sleep 0.1
done
url="$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve.stdout" | head -1)"
port="${url##*:}"
echo "server at $url" >&2
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
echo "phase rss_kb" > "$OUT/rss.txt"
echo "start $(rss_kb)" >> "$OUT/rss.txt"

# 0. Warm-up: the same storm, smaller, so that allocator pools and caches reach their size.
status=0
"$FT" loadgen --url "$url" --stress-clients "$CLIENTS" --stress-requests $((REQUESTS / 4)) \
  --stress-prompts 8 --disconnect-fraction 0.2 --prompt-tokens 200 --max-tokens 48 \
  --duration-limit-s 120 --json > "$OUT/warmup.json" || status=$?
echo "warmup $(rss_kb)" >> "$OUT/rss.txt"
# 1. The storm: clients on 8 distinct prompts, a fifth of them dropping their connection.
"$FT" loadgen --url "$url" --stress-clients "$CLIENTS" --stress-requests "$REQUESTS" \
  --stress-prompts 8 --disconnect-fraction 0.2 --prompt-tokens 200 --max-tokens 48 \
  --duration-limit-s 180 --json > "$OUT/stress.json" || status=$?
echo "stress $(rss_kb)" >> "$OUT/rss.txt"
# 2. Over-capacity: more clients than slots + queue places must get 429s, never hangs.
"$FT" loadgen --url "$url" --stress-clients 96 --stress-requests 192 --stress-prompts 4 \
  --disconnect-fraction 0 --prompt-tokens 64 --max-tokens 32 --duration-limit-s 60 --json \
  > "$OUT/overload.json" || status=$?
echo "overload $(rss_kb)" >> "$OUT/rss.txt"
# 3. Afterwards the protocol still runs cleanly.
"$FT" loadgen --url "$url" --streams 1,4 --warmup 1 --prompt-tokens 256 --max-tokens 64 --json \
  > "$OUT/after.json" || status=$?
echo "after $(rss_kb)" >> "$OUT/rss.txt"
# 4. Slowloris: 8 partial heads and 8 partial bodies, a byte every 5 s: the heads must be
#    closed at the header timeout (10 s), the bodies answered 408 at the body timeout (30 s).
python3 "$here/slowloris.py" loris 127.0.0.1 "$port" "$OUT/slowloris.json" --head 8 --body 8 \
  --every 5 --limit 60 || status=$?
curl -s "$url/metrics" > "$OUT/metrics.txt" 2>/dev/null || true
# 5. SIGTERM with 16 new slowloris clients connected and 4 long streams in flight: exit 0
#    within the shutdown deadline, every stream complete.
python3 "$here/slowloris.py" loris 127.0.0.1 "$port" "$OUT/sigterm-loris.json" --head 8 --body 8 \
  --every 5 --limit 60 > /dev/null &
loris_pid=$!
python3 "$here/slowloris.py" stream 127.0.0.1 "$port" "$OUT/sigterm-streams.json" --n 4 \
  --max-tokens 900 > /dev/null &
streams_pid=$!
for _ in $(seq 1 100); do
  [ "$(curl -s "$url/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["in_flight"])')" -ge 4 ] && break
  sleep 0.05
done
sleep 1
t0=$(date +%s.%N)
kill -TERM "$pid"
code=0; wait "$pid" || code=$?
t1=$(date +%s.%N)
wait "$streams_pid" || status=$?
wait "$loris_pid" || true
python3 -c "import sys; print(f'serve exit code after SIGTERM: {sys.argv[1]}, exited {float(sys.argv[3]) - float(sys.argv[2]):.2f} s after it (deadline {sys.argv[4]} s)')" \
  "$code" "$t0" "$t1" "$DEADLINE_S" > "$OUT/shutdown.txt"
[ "$code" -eq 0 ] || status=1
trap - EXIT
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, sys, os
out = sys.argv[1]
for name in ("warmup", "stress", "overload"):
    r = json.load(open(os.path.join(out, name + ".json")))["report"]
    print(f"{name}: sent {r['sent']}, completed {r['completed']}, disconnected {r['disconnected']}, "
          f"rejected {r['rejected']}, mismatched {r['mismatched']}, malformed {r['malformed']}, "
          f"errors {len(r['errors'])}, {r['tokens']} tokens in {r['elapsed_s']:.2f} s = {r['tok_s']:.0f} tok/s, "
          f"healthy after {r['healthy_after']}, in flight after {r['in_flight_after']}")
a = json.load(open(os.path.join(out, "after.json")))
for run in a["runs"]:
    print(f"after: {run['concurrency']} stream(s): {run['mean_decode_tok_s']:.1f} tok/s per stream, "
          f"ttft {run['mean_ttft_s']:.3f} s, errors {run['errors']}")
rss = dict(l.split() for l in open(os.path.join(out, "rss.txt")).read().splitlines()[1:])
warm, end = int(rss["warmup"]), int(rss["after"])
growth = (end - warm) / warm * 100
print(f"rss: start {int(rss['start']) / 1024:.1f} MiB, after warm-up {warm / 1024:.1f} MiB, "
      f"after the storm {int(rss['stress']) / 1024:.1f} MiB, at the end {end / 1024:.1f} MiB: "
      f"{growth:+.2f}% after warm-up")
s = json.load(open(os.path.join(out, "slowloris.json")))
for k in ("head", "body"):
    print(f"slowloris {k}: {s[k]['closed']} of {s[k]['connections']} closed, the last after "
          f"{s[k]['closed_after_s_max']:.1f} s, statuses {s[k]['statuses']}")
t = json.load(open(os.path.join(out, "sigterm-streams.json")))
print(f"streams in flight at SIGTERM: {t['complete']} of {len(t['connections'])} complete")
print(open(os.path.join(out, "shutdown.txt")).read().strip())
if growth >= 5 or t["complete"] != len(t["connections"]):
    sys.exit(1)
PY
exit "$status"
