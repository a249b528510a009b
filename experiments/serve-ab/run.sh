#!/usr/bin/env bash
# The field report's A/B protocol with `ft serve` on the qwen3.8-flash-next geometry:
# services started in sequence offload -> hybrid -> hybrid (fresh, not warmed) -> offload,
# each with two unscored warm-up requests except the fresh hybrid one, then ~1.2K-token
# prompts (distinct per stream), 256 output tokens, temperature 0, at 1 and 2 streams.
# Beside the measurements: what auto chose and what the model predicted at 1 and 2 streams.
#
# Runs on the GPU machine (no cargo there): the binary is $FT, else carry/ft, else ./ft,
# built with `cargo build --release --features cuda`.
#
# Usage: run.sh OUTDIR (a new folder; the committed results are results/<date>T<time>Z/).
#
# Environment (all optional):
#   FT        binary                             DEVICE   cuda | host (default cuda)
#   LAYERS    MoE layers to run (default 48)     PORT     first port (default 8000)
#   CACHE_GB  GPU expert cache in GiB (default: what the host spec's GPU holds, i.e. the
#             field report's 24 GB card, so that the miss rates are the report's; with
#             LAYERS < 48, that card's share of the experts, scaled to the layers run)
#   HOST_SPEC host spec to predict from instead of this machine's probed profile (a
#             what-if; default: none, `ft serve` probes the GPU machine at its first start;
#             the cache size above still follows the field report's host)
#   PROMPT_TOKENS (1200)  MAX_TOKENS (256)  WARMUP (2)  STARTUP_S (900, per service)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../lib/env-txt.sh
source "$here/../lib/env-txt.sh"
FT="${FT:-}"
if [[ -z "$FT" ]]; then
  for c in "$root/carry/ft" "$root/ft" "$root/target/release/ft"; do
    if [[ -x "$c" ]]; then FT="$c"; break; fi
  done
fi
[[ -n "$FT" && -x "$FT" ]] || { echo "serve-ab: no ft binary (set FT or put it at carry/ft)" >&2; exit 2; }
DEVICE="${DEVICE:-cuda}"
LAYERS="${LAYERS:-48}"
PORT="${PORT:-8000}"
PROMPT_TOKENS="${PROMPT_TOKENS:-1200}"
MAX_TOKENS="${MAX_TOKENS:-256}"
WARMUP="${WARMUP:-2}"
STARTUP_S="${STARTUP_S:-900}"
MODEL=qwen3.8-flash-next
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT"
# The profile `ft serve` probes at its first start (no cached profile matches a fresh
# machine) lands beside the results, not in the user's cache; later services reuse it.
export FT_CACHE_DIR="${FT_CACHE_DIR:-$OUT/cache}"
# With fewer layers than the model's 48, keep the cache's share of the experts what the
# 24 GB card holds of the whole model (else 12 layers fit entirely and nothing misses): the
# full model's default cache slots at 2 streams, scaled by LAYERS / 48.
if [[ -z "${CACHE_GB:-}" && "$LAYERS" != 48 ]]; then
  slots48=$("$FT" predict --host "${HOST_SPEC:-rtx4090-2x-xeon4310}" --model "$MODEL" --streams 2 --json \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["prediction"]["cache_slots"])')
  CACHE_GB=$(python3 -c "print(round($slots48 * $LAYERS / 48 * 2772480 / 2**30, 3))")
  echo "serve-ab: $LAYERS of 48 layers: cache $CACHE_GB GiB ($slots48 slots of the full model, scaled)" >&2
fi
common=(--model "$MODEL" --layers "$LAYERS" --device "$DEVICE" --max-streams 2 --context-limit 2048)
[[ -n "${CACHE_GB:-}" ]] && common+=(--cache-gb "$CACHE_GB")
[[ -n "${HOST_SPEC:-}" ]] && common+=(--host "$HOST_SPEC")

write_env_txt "$OUT/machine.txt" serve-ab "$0${1:+ $*} (output: $OUT)" \
  "args: ${common[*]} prompt_tokens=$PROMPT_TOKENS max_tokens=$MAX_TOKENS warmup=$WARMUP"

# What auto chooses and what the model predicts, at 1 and 2 streams.
for n in 1 2; do
  "$FT" -v serve "${common[@]}" --moe-strategy auto --expected-streams "$n" --predict-only --json \
    > "$OUT/predict-$n.json" 2> "$OUT/predict-$n.log"
done

run_service() { # index strategy warmup
  local i="$1" strategy="$2" warm="$3" port=$((PORT + $1))
  local tag
  tag="$i-$strategy$([[ $warm == 0 ]] && echo -fresh)"
  "$FT" -v serve "${common[@]}" --moe-strategy "$strategy" --port "$port" --json \
    > "$OUT/service-$tag.start.json" 2> "$OUT/service-$tag.log" &
  local pid=$!
  local t0=$SECONDS
  until grep -q listening "$OUT/service-$tag.start.json" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "service $tag died; see $OUT/service-$tag.log" >&2; exit 1; fi
    if (( SECONDS - t0 > STARTUP_S )); then echo "service $tag did not start in ${STARTUP_S}s" >&2; kill "$pid"; exit 1; fi
    sleep 1
  done
  echo "service $tag up after $((SECONDS - t0)) s" >&2
  "$FT" loadgen --url "http://127.0.0.1:$port" --streams 1,2 --warmup "$warm" \
    --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" --json > "$OUT/service-$tag.loadgen.json" || true
  if command -v curl >/dev/null; then curl -s "http://127.0.0.1:$port/metrics" > "$OUT/service-$tag.metrics.txt" || true; fi
  kill -TERM "$pid"
  wait "$pid" || true
}

run_service 0 offload "$WARMUP"
run_service 1 hybrid "$WARMUP"
run_service 2 hybrid 0
run_service 3 offload "$WARMUP"

python3 "$here/table.py" "$OUT" | tee "$OUT/table.md"
