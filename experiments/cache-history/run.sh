#!/usr/bin/env bash
# cache-history: hybrid against offload from a cold and from a warm expert cache, and each
# strategy's miss rate step by step (only fetched experts enter hybrid's cache).
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the runtime half even
# where a GPU is usable, FT_GPU=1 to run it even without one (with FT_DEVICE=host: the
# host-emulated device). Needs bash, jq and python3 (standard library only).
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
# Runtime half (GPU machine): `ft run` from a cold cache and after the warm-up (its per-step
# records give the trajectory), with the simulator of this machine's profile (`ft probe` of
# the L-layer model; the h200-xeon-emr preset where it fails) beside it; bounded to fit
# one remote call beside the other experiments (scripts/device-run.sh): `ft run --layers L`
# runs the same geometry with L of its 48 layers (per-layer numbers, and the trajectory in
# steps, do not depend on L: a step's lookups and the cache both scale with L) on
# h200-xeon-emr's 16 GiB cache scaled to the same share of L layers' experts; the simulator
# runs that same L-layer model, cache and context (no request resets). Env:
#   FT_DEVICE        ft run's device (default cuda; host: the host-emulated device)
#   FT_LAYERS        MoE layers of the runtime half (default 2)
#   FT_GPU_QUICK     1 (default): cold runs of 512 steps, warm ones after 2048 warm-up steps
#                    (8 runs, about 35 s on the H200 machine); 0: 1024 and 4096 (about 55 s)
#   FT_GPU_LONGEST   override the runtime half's longest run (steps; the windows are the
#                    powers of two up to it, the warm-up 4x it)
#   FT_GPU_BUDGET_S  no runtime run starts later than this many seconds after the script
#                    started (default 150); a cut is logged in env.txt
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/runtime-half.sh
source "$HERE/../lib/runtime-half.sh"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
resolve_ft
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
# The runtime half's bounds (see the header).
DEVICE="${FT_DEVICE:-cuda}"
GPU_LAYERS="${FT_LAYERS:-2}"
GPU_BUDGET_S="${FT_GPU_BUDGET_S:-150}"
if [[ "${FT_GPU_QUICK:-1}" == 1 ]]; then GPU_LONGEST="${FT_GPU_LONGEST:-512}"; else GPU_LONGEST="${FT_GPU_LONGEST:-1024}"; fi
GPU_STEPS=1 n=2
while (( n <= GPU_LONGEST )); do GPU_STEPS="$GPU_STEPS,$n" n=$(( 2 * n )); done
[[ "${GPU_STEPS##*,}" == "$GPU_LONGEST" ]] || GPU_STEPS="$GPU_STEPS,$GPU_LONGEST"
GPU_WARM=$(( 4 * GPU_LONGEST ))
GPU_CONTEXT=1024   # ft run's default, given to the simulator beside it too
# One seed for both: the simulator and the engine then draw the same routes, and their miss-rate
# trajectories compare window by window rather than as two samples of the same process.
GPU_SEED="${FT_GPU_SEED:-0}"
gpu_usable() {
    case "${FT_GPU:-auto}" in
    0) return 1 ;;
    1) return 0 ;;
    *) "$FT" --version | grep -Eq '^cuda driver: found \([1-9]' ;;
    esac
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
write_env_txt "$OUT/env.txt" "cache-history ($(run_size))" "$0 $*" \
    "host: $HOST; model: $MODEL; hybrid fetch fraction $FETCH; cold runs of $STEPS steps; warm-up $WARM steps"
if gpu_usable; then
    echo "runtime half: device $DEVICE, $GPU_LAYERS of 48 layers; windows ending at $GPU_STEPS; warm-up $GPU_WARM steps; context $GPU_CONTEXT; no run starts after ${GPU_BUDGET_S} s" >> "$OUT/env.txt"
fi

sim_half() { # HOST NAME MODEL STEPS WARM FLAGS...
    local host="$1" name="$2" model="$3" steps="$4" warm="$5"
    shift 5
    "$FT" simulate --host "$host" --model "$model" "$@" --sweep streams=1,2 --sweep "steps=$steps" \
        --strategy offload,hybrid --fetch-fraction "$FETCH" --warmup 0 --out "$OUT/raw/cold.$name.csv"
    "$FT" simulate --host "$host" --model "$model" "$@" --sweep streams=1,2 --sweep "steps=$steps" \
        --strategy offload,hybrid --fetch-fraction "$FETCH" --warmup "$warm" --out "$OUT/raw/warm.$name.csv"
}
# The field report's cache, sized once (offload misses 38% at 2 streams after the default
# warm-up).
slots=$("$FT" simulate --host "$HOST" --model "$MODEL" --streams 2 --strategy offload \
    --steps "$CAL_STEPS" --warmup "$CAL_WARMUP" --json | jq -r '.cache.slots')
echo "cache-history: simulating $HOST ($slots slots)" >&2
sim_half "$HOST" field "$MODEL" "$STEPS" "$WARM" --cache-slots "$slots"

rm -f "$OUT/raw/runtime.csv" "$OUT"/raw/*.gpu.csv "$OUT"/raw/run.*.json "$OUT"/raw/run.*.log \
    "$OUT/trajectory.gpu.csv" "$OUT"/*-gpu-*.svg "$OUT"/measured-*.svg "$OUT/runtime-skipped.txt"
if gpu_usable; then
    if "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction'; then
        # The 16 GiB cache of the whole model as the same share of GPU_LAYERS layers' experts.
        runtime_model_and_cache "$FT" "$OUT" "$MODEL" "$GPU_LAYERS" "$GPU_HOST" "$GPU_CACHE_GB"
        runtime_host "$FT" "$OUT" "$DEVICE" "$GPU_HOST" "${FT_PROBE_BUDGET_S:-20}"
        echo "cache-history: simulating $SIM_HOST for the runtime half" >&2
        sim_half "$SIM_HOST" gpu "$OUT/models/runtime.toml" "$GPU_STEPS" "$GPU_WARM" --cache-slots "$GPU_SLOTS" \
            --context "$GPU_CONTEXT" --output-tokens "$(( GPU_WARM + GPU_LONGEST ))" --seed "$GPU_SEED"
        # `ft run` records every step (its hits and misses, its wall time), so one cold run
        # per strategy gives the runtime's trajectory directly; the warm run measures the
        # steady state after the same warm-up as the simulator's.
        # Cold runs first (the trajectory), then the warm ones, so a budget cut keeps the former.
        echo "phase,strategy,streams,json" > "$OUT/raw/runtime.csv"
        done_runs=0
        for phase in cold warm; do
            w=0
            [[ "$phase" == warm ]] && w="$GPU_WARM"
            for b in 1 2; do
                for s in offload hybrid; do
                    if (( SECONDS > GPU_BUDGET_S )); then
                        echo "runtime half: budget (${GPU_BUDGET_S} s) spent after $done_runs of 8 runs; stopped before $phase $s at $b stream(s)" | tee -a "$OUT/env.txt" >&2
                        break 3
                    fi
                    fetch=()
                    [[ "$s" == hybrid ]] && fetch=(--fetch-fraction "$FETCH")
                    echo "cache-history: ft run $s, $b stream(s), $phase" >&2
                    runtime_run "$FT" "$OUT" cache-history "$phase.$s.$b" "$phase,$s,$b,run.$phase.$s.$b.json" \
                        --device "$DEVICE" --model "$MODEL" --layers "$GPU_LAYERS" --strategy "$s" "${fetch[@]}" \
                        --streams "$b" --cache-slots "$GPU_SLOTS" --context "$GPU_CONTEXT" \
                        --steps "$GPU_LONGEST" --warmup "$w" --seed "$GPU_SEED"
                    done_runs=$(( done_runs + 1 ))
                done
            done
        done
        echo "runtime half: $done_runs runs done at ${SECONDS} s" >> "$OUT/env.txt"
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
            --label cold_window_miss_rate="cold start" --label warm_window_miss_rate="warm cache" \
            --where "streams=$b" --title "Miss rate step by step, $b stream(s), $host (solid: cold start, dashed: warm)" \
            --xlabel "decode step (end of the window)" --ylabel "share of distinct experts missed" > /dev/null
        "$FT" plot "$OUT/trajectory.$name.csv" -o "$OUT/tok-s-$name-$b-streams.svg" --kind line \
            --x step --log-x --y cold_window_tok_s,warm_window_tok_s --series strategy \
            --label cold_window_tok_s="cold start" --label warm_window_tok_s="warm cache" \
            --where "streams=$b" --title "Decode tok/s per stream step by step, $b stream(s), $host (solid: cold, dashed: warm)" \
            --xlabel "decode step (end of the window)" --ylabel "tok/s per stream in the window" > /dev/null
    done
done
if [[ -f "$OUT/trajectory.gpu.csv" ]] && head -1 "$OUT/trajectory.gpu.csv" | grep -q measured_cold_window_miss_rate; then
    for b in 1 2; do
        "$FT" plot "$OUT/trajectory.gpu.csv" -o "$OUT/measured-miss-rate-$b-streams.svg" --kind line \
            --x step --log-x --y measured_cold_window_miss_rate,cold_window_miss_rate --series strategy \
            --label measured_cold_window_miss_rate="ft run" --label cold_window_miss_rate=simulator \
            --where "streams=$b" --title "Miss rate from a cold cache, $b stream(s), GPU machine (solid: ft run, dashed: simulator)" \
            --xlabel "decode step (end of the window)" --ylabel "share of distinct experts missed" > /dev/null \
            || echo "cache-history: ft plot of the measured trajectory failed; the CSV is complete" >&2
    done
fi
echo "cache-history: results in $OUT" >&2
