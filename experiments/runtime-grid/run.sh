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
#   FT_THREADS   CPU pool workers (default: cores - 1; the host thread takes the last core)
# Needs bash and python3 (standard library only). Skips cleanly without a CUDA device.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/json" "$OUT/traces" "$OUT/logs"
if [[ -z "${FT:-}" ]]; then
    features=()
    command -v nvidia-smi > /dev/null && features=(--features cuda)
    (cd "$HERE/../.." && cargo build --release --quiet "${features[@]}")
    FT="$HERE/../../target/release/ft"
fi
if ! "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'; then
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

{
    echo "experiment: runtime-grid ($([[ "${FT_QUICK:-0}" == 1 ]] && echo quick || echo full))"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores visible)"
    echo "ram: $(awk '/MemTotal/ {printf "%.1f GB", $2 / 1e6}' /proc/meminfo)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader || true
    "$FT" --version
    echo "model: $MODEL, $LAYERS of $MODEL_LAYERS layers (--layers: same geometry, fewer layers)"
    echo "streams: $STREAMS; cache fractions: $FRACTIONS of $TOTAL experts; hybrid f: $HYBRID_F"
    echo "steps: $STEPS after $WARMUP warm-up; context $CONTEXT; CPU threads $THREADS (the host's included under spin)"
    echo "kernel and copy switches: $(env | grep -E '^FT_CUDA_' | sort | tr '\n' ' ')"
} > "$OUT/env.txt"
cat "$OUT/env.txt" >&2

common=(--device cuda --model "$MODEL" --layers "$LAYERS" --steps "$STEPS" --warmup "$WARMUP"
        --context "$CONTEXT" --threads "$THREADS" --json)

# Hybrid's fixed cost per layer (tiny work): spinning with the host computing, spinning with
# the host idle beside the workers (the arrangement before 2026-12-04 night), parked.
for wait in spin spin-beside park; do
    "$FT" run --probe-overhead --device cuda --threads "$THREADS" --pool-wait "$wait" --json \
        > "$OUT/json/probe-$wait.json" 2> "$OUT/logs/probe-$wait.log"
done

run() { # name, then ft run arguments
    local name="$1"; shift
    echo "runtime-grid: $name" >&2
    if ! "$FT" run "${common[@]}" "$@" > "$OUT/json/$name.json" 2> "$OUT/logs/$name.log"; then
        echo "runtime-grid: $name failed (see logs/$name.log)" >&2
        rm -f "$OUT/json/$name.json"
    fi
}

# The middle cache size at 2 streams also writes Chrome traces (offload and each hybrid).
# resident holds every expert and cpu (LRU, fetch fraction 0) never admits one, so neither
# depends on the cache size: they run once per stream count.
mid_fraction=$(echo "$FRACTIONS" | awk '{print $(int((NF + 1) / 2))}')
for b in $STREAMS; do
    run "resident-b$b" --strategy resident --streams "$b"
    run "cpu-b$b" --strategy cpu --streams "$b"
    for frac in $FRACTIONS; do
        slots=$(python3 -c "print(max(1, int($frac * $TOTAL)))")
        names=("offload-b$b-c$frac")
        for f in $HYBRID_F; do names+=("hybrid$f-b$b-c$frac"); done
        for name in "${names[@]}"; do
            trace=()
            [[ "$b" == 2 && "$frac" == "$mid_fraction" ]] && trace=(--trace-out "$OUT/traces/$name.json")
            case "$name" in
                offload*) strat=(--strategy offload) ;;
                hybrid*) f="${name#hybrid}"; f="${f%%-b*}"; strat=(--strategy hybrid --fetch-fraction "$f") ;;
            esac
            run "$name" "${strat[@]}" --streams "$b" --cache-slots "$slots" "${trace[@]}"
        done
    done
done

python3 "$HERE/analyze.py" "$OUT"
