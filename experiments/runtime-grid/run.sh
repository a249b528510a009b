#!/usr/bin/env bash
# runtime-grid: the real runtime (`ft run`, CUDA) on qwen3.8-flash-next's geometry, every
# strategy at 1, 2, 4 and 8 streams and three cache sizes, plus hybrid's fixed-cost probe;
# one JSON document per run, then grid.csv and summary.txt (analyze.py).
#
# Usage: run.sh OUTDIR. Env:
#   FT          the ft binary (default: built here with --features cuda where nvidia-smi exists)
#   FT_QUICK=1  reduced size (1 and 8 streams, one cache size, 8 steps)
#   FT_LAYERS   MoE layers to run (default 12 of 48: the same geometry, a 17 GB host bank that
#               fills and pins in seconds; 48 needs 68 GB of pinned RAM per run and about
#               half a minute of set-up per run). Per-layer numbers do not depend on it.
#   FT_CACHE_FRACTIONS  cache sizes as shares of all routed experts (default "0.1 0.25 0.5")
#   FT_HYBRID_F  hybrid's fetch fractions (default "0.25 0.5")
#   FT_THREADS   CPU threads (default: cores - 1; under spin the host thread computes too)
#   FT_REPEAT    interleaved rounds per (streams, cache) point (default 3, 1 with FT_QUICK=1)
#   FT_GPU_BUDGET_S  no new point starts after this many seconds (default 480)
#   FT_DEVICE=host   the host-emulated device: a smoke test of the script anywhere
# Needs bash and python3 (standard library only). Skips cleanly without a CUDA device.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/json" "$OUT/traces" "$OUT/logs"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
resolve_ft
# FT_DEVICE=host: the host-emulated device, a smoke test of the script anywhere (use a small
# FT_LAYERS), never a measurement.
DEVICE="${FT_DEVICE:-cuda}"
if [[ "$DEVICE" != host ]] && ! "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'; then
    echo "runtime-grid: no usable CUDA device here ($("$FT" --version | grep '^cuda driver')): skipped" >&2
    exit 0
fi

MODEL=qwen3.8-flash-next
MODEL_LAYERS=48
EXPERTS=512
LAYERS="${FT_LAYERS:-12}"
THREADS="${FT_THREADS:-$(( $(nproc) - 1 ))}"
HYBRID_F="${FT_HYBRID_F:-0.25 0.5}"
if [[ "${FT_QUICK:-0}" == 1 ]]; then
    STREAMS="1 8" FRACTIONS="${FT_CACHE_FRACTIONS:-0.25}" STEPS=8 WARMUP=4
else
    STREAMS="1 2 4 8" FRACTIONS="${FT_CACHE_FRACTIONS:-0.1 0.25 0.5}" STEPS=32 WARMUP=8
fi
CONTEXT=1024
TOTAL=$(( LAYERS * EXPERTS ))
# Rounds of each interleaved point (each strategy reports its median round), and the wall-clock
# budget after which no new point starts (the analysis covers what ran; the cut is logged).
REPEAT="${FT_REPEAT:-$([[ "${FT_QUICK:-0}" == 1 ]] && echo 1 || echo 3)}"
BUDGET_S="${FT_GPU_BUDGET_S:-480}"
t_start=$SECONDS

write_env_txt "$OUT/env.txt" "runtime-grid ($(run_size))" "$0 $*" \
    "model: $MODEL, $LAYERS of $MODEL_LAYERS layers (--layers: same geometry, fewer layers)" \
    "streams: $STREAMS; cache fractions: $FRACTIONS of $TOTAL experts; hybrid f: $HYBRID_F" \
    "steps: $STEPS after $WARMUP warm-up, $REPEAT interleaved round(s) per point (the median); context $CONTEXT; CPU threads $THREADS (the host's included under spin); budget ${BUDGET_S} s" \
    "kernel development switches: $(env | grep -E '^FT_CUDA_' | sort | tr '\n' ' ')"
cat "$OUT/env.txt" >&2

common=(--device "$DEVICE" --model "$MODEL" --layers "$LAYERS" --steps "$STEPS" --warmup "$WARMUP"
        --context "$CONTEXT" --threads "$THREADS" --json)

# Hybrid's fixed cost per layer (tiny work): spinning with the host computing, spinning with
# the host idle beside the workers (the arrangement before 2026-12-04 night), parked.
for wait in spin spin-beside park; do
    "$FT" run --probe-overhead --device "$DEVICE" --threads "$THREADS" --pool-wait "$wait" --json \
        > "$OUT/json/probe-$wait.json" 2> "$OUT/logs/probe-$wait.log"
done

run() { # name, then ft run arguments: json/<name>.json
    local name="$1"; shift
    echo "runtime-grid: $name" >&2
    if ! "$FT" run "${common[@]}" "$@" > "$OUT/json/$name.json" 2> "$OUT/logs/$name.log"; then
        echo "runtime-grid: $name failed (see logs/$name.log)" >&2
        rm -f "$OUT/json/$name.json"
    fi
}

slots_of() { # cache fraction: cache slots for that share of every routed expert (at least 1)
    python3 -c "print(max(1, int($1 * $TOTAL)))"
}

interleaved() { # point, then ft run arguments: json/<point>-<label>.json, one per variant
    local point="$1"; shift
    echo "runtime-grid: $point" >&2
    if ! "$FT" run "${common[@]}" --repeat "$REPEAT" "$@" --report-prefix "$OUT/json/$point-" \
        > /dev/null 2> "$OUT/logs/$point.log"; then
        echo "runtime-grid: $point failed (see logs/$point.log)" >&2
        rm -f "$OUT/json/$point-"*.json
    fi
}

# Each (streams, cache) point decodes offload and each hybrid in one process, in REPEAT
# rounds from an empty cache with the order rotated (`ft run --interleave`: one host bank
# filled once, a slow stretch of the shared machine on every strategy alike; each reports its
# median round). cpu (LRU, fetch fraction 0) never admits an expert, so it does not depend on
# the cache size: it joins the first point of each stream count. resident holds every expert
# and runs once per stream count in its own process.
variants=(offload)
for f in $HYBRID_F; do variants+=("hybrid$f=hybrid:$f"); done
first_fraction=$(echo "$FRACTIONS" | awk '{print $1}')
for b in $STREAMS; do
    run "b$b-resident" --strategy resident --streams "$b"
    for frac in $FRACTIONS; do
        slots=$(slots_of "$frac")
        list=("${variants[@]}")
        [[ "$frac" == "$first_fraction" ]] && list+=(cpu)
        interleaved "b$b-c$frac" --interleave "$(IFS=,; echo "${list[*]}")" --streams "$b" --cache-slots "$slots"
        if (( SECONDS - t_start > BUDGET_S )); then
            echo "runtime-grid: budget (${BUDGET_S} s) spent after b$b-c$frac" | tee -a "$OUT/env.txt" >&2
            break 2
        fi
    done
done

# Chrome traces of the middle cache size at 2 streams (offload and each hybrid; a plain run
# each: --interleave writes no trace), where the budget leaves time.
mid_fraction=$(echo "$FRACTIONS" | awk '{print $(int((NF + 1) / 2))}')
if [[ " $STREAMS " == *" 2 "* ]] && (( SECONDS - t_start <= BUDGET_S )); then
    slots=$(slots_of "$mid_fraction")
    mkdir -p "$OUT/json/traced" "$OUT/logs/traced"
    for v in "${variants[@]}"; do
        label="${v%%=*}"
        case "$v" in
            offload) strat=(--strategy offload) ;;
            *) strat=(--strategy hybrid --fetch-fraction "${v##*:}") ;;
        esac
        name="traced/b2-c$mid_fraction-$label"
        run "$name" "${strat[@]}" --streams 2 --cache-slots "$slots" --trace-out "$OUT/traces/b2-c$mid_fraction-$label.json"
    done
elif [[ " $STREAMS " == *" 2 "* ]]; then
    echo "runtime-grid: no traces (budget of ${BUDGET_S} s spent)" | tee -a "$OUT/env.txt" >&2
fi

python3 "$HERE/analyze.py" "$OUT"
