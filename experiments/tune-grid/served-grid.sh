#!/usr/bin/env bash
# The served grid: ft serve --device cuda seen as a black box, one server per strategy (a served
# engine runs one strategy per process), decode tok/s per stream measured by ft loadgen over the
# steady window, in three rounds alternated across the strategies.
#
#   OUT=DIR FT=path/to/cuda/ft BUDGET_S=500 experiments/tune-grid/served-grid.sh CONFIGS.csv
#
# DEVICE=host runs it on the host-emulated device (a check of the script, not a measurement).
# CONFIGS.csv: model,streams,context,residency,cache_gb (a header line first). For each line the
# three servers (offload, hybrid 0.3, hybrid 0.6) start together on their own ports (an idle
# ft serve parks its CPU pool and its scheduler, so the two waiting servers cost nothing),
# each is warmed, then round r = 1..3 runs loadgen against each in an order rotated by r:
# `streams` requests arriving together, prompts of `context` tokens, OUTPUT_TOKENS out, decode
# over the window where every stream decodes. The warm-up (WARMUP=round, the default) is one
# discarded round of the same requests, so that round 1 starts from a cache the traffic has
# filled as rounds 2 and 3 do; WARMUP=short is one 256-token request (round 1 then runs on a
# colder cache than rounds 2 and 3). A configuration whose results exist
# under $OUT/grid is skipped, so a cut call can be resumed.
set -u
: "${OUT:?}" "${FT:?}"
CONFIGS=${1:?CONFIGS.csv}
BUDGET_S=${BUDGET_S:-500}
THREADS=${THREADS:-15}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-96}
PREFILL_CHUNK=${PREFILL_CHUNK:-512}
T0=${T0:-$(date +%s)}
G="$OUT/r/grid"; mkdir -p "$G"
VARIANTS=(offload h30 h60)
args_of() {
  case $1 in offload) echo "--moe-strategy offload";; h30) echo "--moe-strategy hybrid --fetch-fraction 0.3";;
             h60) echo "--moe-strategy hybrid --fetch-fraction 0.6";; esac
}
wait_ready() {  # port, pid, seconds
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    kill -0 "$2" 2>/dev/null || return 1
    curl -sf "http://127.0.0.1:$1/v1/models" > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}
tail -n +2 "$CONFIGS" | while IFS=, read -r model streams context residency cache_gb; do
  [[ -z $model ]] && continue
  name="${model}-s${streams}-c${context}-r${residency}"
  [[ -f "$G/$name/done" ]] && continue
  if (( $(date +%s) - T0 > BUDGET_S )); then echo "budget: stopped before $name" >> "$G/steps.txt"; break; fi
  D="$G/$name"; mkdir -p "$D"
  limit=$(( context + OUTPUT_TOKENS + 256 ))
  declare -A PID PORT
  port=18100
  for v in "${VARIANTS[@]}"; do
    port=$((port + 1)); PORT[$v]=$port
    # shellcheck disable=SC2046
    "$FT" serve --device "${DEVICE:-cuda}" --model "$model" --layers "${LAYERS:-4}" --port "$port" --threads "$THREADS" \
        --cache-gb "$cache_gb" --max-streams 8 --context-limit "$limit" --prefill-chunk "$PREFILL_CHUNK" \
        --host h200-xeon-emr --no-check $(args_of "$v") > "$D/serve-$v.log" 2>&1 &
    PID[$v]=$!
  done
  ok=1
  for v in "${VARIANTS[@]}"; do
    if ! wait_ready "${PORT[$v]}" "${PID[$v]}" 90; then echo "$name $v: not ready" >> "$G/steps.txt"; ok=0; fi
  done
  if (( ok )); then
    for v in "${VARIANTS[@]}"; do
      if [[ ${WARMUP:-round} == short ]]; then
        warm=(--streams 1 --prompt-tokens 256 --max-tokens 64)
      else
        warm=(--streams "$streams" --prompt-tokens "$context" --max-tokens "$OUTPUT_TOKENS")
      fi
      timeout 180 "$FT" loadgen --url "http://127.0.0.1:${PORT[$v]}" --warmup 0 "${warm[@]}" \
          --timeout-s 170 --json > "$D/warm-$v.json" 2> "$D/warm-$v.log"
    done
    for r in 1 2 3; do
      order=("${VARIANTS[@]:$((r - 1))}" "${VARIANTS[@]:0:$((r - 1))}")
      for v in "${order[@]}"; do
        t1=$EPOCHREALTIME
        timeout 180 "$FT" loadgen --url "http://127.0.0.1:${PORT[$v]}" --streams "$streams" --warmup 0 \
            --prompt-tokens "$context" --max-tokens "$OUTPUT_TOKENS" --timeout-s 170 --json \
            > "$D/r$r-$v.json" 2> "$D/r$r-$v.log"
        echo "$name r$r $v rc=$? wall=$(awk "BEGIN{print $EPOCHREALTIME - $t1}")" >> "$G/steps.txt"
      done
    done
    touch "$D/done"
  fi
  for v in "${VARIANTS[@]}"; do kill "${PID[$v]}" 2>/dev/null; done
  for v in "${VARIANTS[@]}"; do wait "${PID[$v]}" 2>/dev/null; done
  unset PID PORT
  [[ -n ${PACK_CMD:-} ]] && eval "$PACK_CMD"
done
