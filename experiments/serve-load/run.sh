#!/usr/bin/env bash
# Loopback load test of `ft serve`: many concurrent streaming clients, some disconnecting
# mid-stream, bounded in request count and time (it stops by itself). Checks that no
# response is lost, duplicated or corrupted (greedy decoding is deterministic, so every
# completed stream must equal the non-streamed answer for its prompt) and that the server
# still answers afterwards with no request left in flight; then drains it with SIGTERM.
# 127.0.0.1 only.
#
# Usage: run.sh OUTDIR (the committed results: run.sh experiments/serve-load/results), e.g.
#   FT=target/release/ft experiments/serve-load/run.sh /tmp/serve-load
# Env: FT (default target/release/ft), CLIENTS (48) and REQUESTS (480) of the storm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
FT="${FT:-$root/target/release/ft}"
# shellcheck source=../lib/env-txt.sh
source "$here/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
CLIENTS="${CLIENTS:-48}"
REQUESTS="${REQUESTS:-480}"
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
  --max-streams 8 --max-queue 64 --context-limit 1024 > "$OUT/serve.stdout" 2> "$OUT/serve.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q listening "$OUT/serve.stdout" 2>/dev/null && break
  kill -0 "$pid" || { cat "$OUT/serve.log" >&2; exit 1; }
  sleep 0.1
done
url="$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve.stdout" | head -1)"
echo "server at $url" >&2

# 1. The storm: clients on 8 distinct prompts, a quarter of them dropping their connection.
status=0
"$FT" loadgen --url "$url" --stress-clients "$CLIENTS" --stress-requests "$REQUESTS" \
  --stress-prompts 8 --disconnect-fraction 0.25 --prompt-tokens 200 --max-tokens 48 \
  --duration-limit-s 120 --json > "$OUT/stress.json" || status=$?
# 2. Over-capacity: more clients than slots + queue places must get 429s, never hangs.
"$FT" loadgen --url "$url" --stress-clients 96 --stress-requests 192 --stress-prompts 4 \
  --disconnect-fraction 0 --prompt-tokens 64 --max-tokens 32 --duration-limit-s 60 --json \
  > "$OUT/overload.json" || status=$?
# 3. Afterwards the protocol still runs cleanly.
"$FT" loadgen --url "$url" --streams 1,4 --warmup 1 --prompt-tokens 256 --max-tokens 64 --json \
  > "$OUT/after.json" || status=$?
curl -s "$url/metrics" > "$OUT/metrics.txt" 2>/dev/null || true
kill -TERM "$pid"
wait "$pid"; echo "serve exit code after SIGTERM: $?" > "$OUT/shutdown.txt"
trap - EXIT
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, sys, os
out = sys.argv[1]
for name in ("stress", "overload"):
    r = json.load(open(os.path.join(out, name + ".json")))["report"]
    print(f"{name}: sent {r['sent']}, completed {r['completed']}, disconnected {r['disconnected']}, "
          f"rejected {r['rejected']}, mismatched {r['mismatched']}, malformed {r['malformed']}, "
          f"errors {len(r['errors'])}, {r['tokens']} tokens in {r['elapsed_s']:.2f} s = {r['tok_s']:.0f} tok/s, "
          f"healthy after {r['healthy_after']}, in flight after {r['in_flight_after']}")
a = json.load(open(os.path.join(out, "after.json")))
for run in a["runs"]:
    print(f"after: {run['concurrency']} stream(s): {run['mean_decode_tok_s']:.1f} tok/s per stream, "
          f"ttft {run['mean_ttft_s']:.3f} s, errors {run['errors']}")
print(open(os.path.join(out, "shutdown.txt")).read().strip())
PY
exit "$status"
