#!/usr/bin/env bash
# cache-history: hybrid against offload from a cold and from a warm expert cache, and each
# strategy's miss rate step by step (only fetched experts enter hybrid's cache).
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the runtime half even
# where a GPU is usable. Needs bash, jq and python3 (standard library only).
#
# Simulator half: the field report's host, model and cache (offload misses 38% at 2 streams
# when warm), offload and hybrid at the report's automatic fetch fraction (27.7%), 1 and 2
# streams. `ft simulate` reports means over its measured steps and has no per-step output,
# so the trajectory is rebuilt from runs of N = 1, 2, 3, 4, 6, ... steps from a cold cache
# (`--warmup 0 --sweep steps=...`; the same seed gives every run the same first steps):
# between two runs of N1 < N2 steps, the window's step time is (N2 t2 - N1 t1) / (N2 - N1)
# exactly, and its miss rate (N2 m2 - N1 m1) / (N2 - N1), exact at 1 stream (every step
# looks up top-k distinct experts per layer) and weighted by steps, not lookups, at 2.
# Warm: the same runs after 4x the longest cold run of warm-up steps.
# Runtime half (GPU machine): `ft run` from a cold cache and after the warm-up, on
# h200-xeon-emr's 16 GiB cache (its per-step records give the trajectory), with the
# simulator of that host beside it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw"
if [[ -z "${FT:-}" ]]; then
    features=()
    command -v nvidia-smi > /dev/null && features=(--features cuda)
    (cd "$HERE/../.." && cargo build --release --quiet "${features[@]}")
    FT="$HERE/../../target/release/ft"
fi
QUICK="${FT_QUICK:-0}"
HOST=rtx4090-2x-xeon4310
MODEL=qwen3.8-flash-next
GPU_HOST=h200-xeon-emr
GPU_CACHE_GB=16
# The field report's automatic fetch fraction (the reference engine's contended split).
FETCH=0.277
if [[ "$QUICK" == 1 ]]; then
    STEPS=1,2,4,8,16,32,64,128,256,512 CAL_STEPS=24 CAL_WARMUP=32
else
    STEPS=1,2,3,4,6,8,12,16,24,32,48,64,96,128,192,256,384,512,768,1024,1536,2048
    CAL_STEPS=256 CAL_WARMUP=64
fi
LONGEST="${STEPS##*,}"
WARM=$((4 * LONGEST))
gpu_usable() {
    [[ "${FT_GPU:-auto}" != 0 ]] && "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
{
    echo "experiment: cache-history ($([[ "$QUICK" == 1 ]] && echo quick || echo full))"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores visible)"
    "$FT" --version
    echo "host: $HOST; model: $MODEL; hybrid fetch fraction $FETCH; cold runs of $STEPS steps; warm-up $WARM steps"
} > "$OUT/env.txt"

sim_half() { # HOST NAME CACHE_FLAGS...
    local host="$1" name="$2"
    shift 2
    "$FT" simulate --host "$host" --model "$MODEL" "$@" --sweep streams=1,2 --sweep "steps=$STEPS" \
        --strategy offload,hybrid --fetch-fraction "$FETCH" --warmup 0 --out "$OUT/raw/cold.$name.csv"
    "$FT" simulate --host "$host" --model "$MODEL" "$@" --sweep streams=1,2 --sweep "steps=$STEPS" \
        --strategy offload,hybrid --fetch-fraction "$FETCH" --warmup "$WARM" --out "$OUT/raw/warm.$name.csv"
}
# The field report's cache, sized once (offload misses 38% at 2 streams after the default
# warm-up).
slots=$("$FT" simulate --host "$HOST" --model "$MODEL" --streams 2 --strategy offload \
    --steps "$CAL_STEPS" --warmup "$CAL_WARMUP" --json | jq -r '.cache.slots')
echo "cache-history: simulating $HOST ($slots slots)" >&2
sim_half "$HOST" field --cache-slots "$slots"

rm -f "$OUT/raw/runtime.csv"
if gpu_usable; then
    if "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction'; then
        sim_half "$GPU_HOST" gpu --cache-gb "$GPU_CACHE_GB"
        # `ft run` records every step (its hits and misses, its wall time), so one cold run
        # per strategy gives the runtime's trajectory directly; the warm run measures the
        # steady state after the same warm-up as the simulator's.
        echo "phase,strategy,streams,json" > "$OUT/raw/runtime.csv"
        for s in offload hybrid; do
            fetch=()
            [[ "$s" == hybrid ]] && fetch=(--fetch-fraction "$FETCH")
            for b in 1 2; do
                for phase in cold warm; do
                    w=0
                    [[ "$phase" == warm ]] && w="$WARM"
                    echo "cache-history: ft run $s, $b stream(s), $phase" >&2
                    "$FT" run --model "$MODEL" --strategy "$s" "${fetch[@]}" --streams "$b" \
                        --cache-gb "$GPU_CACHE_GB" --steps "$LONGEST" --warmup "$w" --json \
                        > "$OUT/raw/run.$phase.$s.$b.json"
                    echo "$phase,$s,$b,run.$phase.$s.$b.json" >> "$OUT/raw/runtime.csv"
                done
            done
        done
    else
        echo "runtime half skipped: this ft has no 'ft run --fetch-fraction'" | tee "$OUT/runtime-skipped.txt" >&2
    fi
else
    echo "runtime half skipped: no usable CUDA device (or FT_GPU=0)" > "$OUT/runtime-skipped.txt"
fi

python3 "$HERE/analyze.py" "$OUT"
fi
for name in field gpu; do
    [[ -f "$OUT/trajectory.$name.csv" ]] || continue
    host=$HOST
    [[ "$name" == gpu ]] && host=$GPU_HOST
    for b in 1 2; do
        "$FT" plot "$OUT/trajectory.$name.csv" -o "$OUT/miss-rate-$name-$b-streams.svg" --kind line \
            --x step --log-x --y cold_window_miss_rate,warm_window_miss_rate --series strategy \
            --where "streams=$b" --legend upper-right --title "Miss rate step by step, $b stream(s), $host (solid: cold start, dashed: warm)" \
            --xlabel "decode step (end of the window)" --ylabel "share of distinct experts missed" > /dev/null
        "$FT" plot "$OUT/trajectory.$name.csv" -o "$OUT/tok-s-$name-$b-streams.svg" --kind line \
            --x step --log-x --y cold_window_tok_s,warm_window_tok_s --series strategy \
            --where "streams=$b" --legend lower-right --title "Decode tok/s per stream step by step, $b stream(s), $host (solid: cold, dashed: warm)" \
            --xlabel "decode step (end of the window)" --ylabel "tok/s per stream in the window" > /dev/null
    done
done
echo "cache-history: results in $OUT" >&2
