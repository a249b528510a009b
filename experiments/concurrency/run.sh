#!/usr/bin/env bash
# concurrency: decode tok/s per stream and in total for each strategy from 1 to 16 streams,
# the analytic model and the simulator side by side; on the GPU machine also the runtime.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the runtime half even
# where a GPU is usable (it runs by default where `ft --version` finds a CUDA device),
# FT_GPU=1 to run it even without one (with FT_DEVICE=host: the host-emulated device).
# Needs bash, jq and python3 (standard library only).
#
# Simulator half: the field report's host and model (rtx4090-2x-xeon4310, qwen3.8-flash-next)
# with the report's cache (sized so that offload misses 38% at 2 streams, then fixed for all
# stream counts), and in the full run also this project's GPU machine (h200-xeon-emr) with a
# 16 GiB expert cache. `ft simulate --sweep` runs every strategy with `--with-model`: the
# model columns are the same prediction `ft predict` prints (its routing seed aligned with
# the simulation's).
# Runtime half (GPU machine), bounded to fit one remote call beside the other experiments
# (scripts/device-run.sh): `ft run --layers L` of each strategy at each stream count on the
# same geometry with L of its 48 MoE layers (per-layer numbers do not depend on L; all 48
# need 68 GB of pinned RAM and ~30 s of set-up per run) and the 16 GiB cache scaled to L
# layers (the same share of the experts, so the same miss rate), beside `ft simulate` and
# the model of this machine's profile (`ft probe` of that L-layer model, about 20 s; the
# h200-xeon-emr preset where the probe fails) on the same cache, context and steps. Env:
#   FT_DEVICE        ft run's device (default cuda; host: the host-emulated device)
#   FT_LAYERS        MoE layers of the runtime half (default 2)
#   FT_GPU_QUICK     1 (default): streams 1,2,4,16, 32 steps after 64 warm-up (12 runs,
#                    about 35 s on the H200 machine); 0: streams 1,2,3,4,6,8,12,16, 64 after
#                    128 (24 runs, about 75 s)
#   FT_GPU_STEPS, FT_GPU_WARMUP  override the runtime half's steps
#   FT_GPU_BUDGET_S  no runtime run starts later than this many seconds after the script
#                    started (default 150); a cut is logged in env.txt and the runs done are
#                    analysed
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
MODEL=qwen3.8-flash-next
GPU_HOST=h200-xeon-emr
GPU_CACHE_GB=16
if [[ "$QUICK" == 1 ]]; then
    STREAMS=1,2,4,16 STEPS=24 WARMUP=32
    HOSTS=(rtx4090-2x-xeon4310)
else
    STREAMS=1,2,3,4,6,8,12,16 STEPS=128 WARMUP=256
    HOSTS=(rtx4090-2x-xeon4310 "$GPU_HOST")
fi

# The runtime half's bounds (see the header).
DEVICE="${FT_DEVICE:-cuda}"
GPU_LAYERS="${FT_LAYERS:-2}"
GPU_QUICK="${FT_GPU_QUICK:-1}"
GPU_BUDGET_S="${FT_GPU_BUDGET_S:-150}"
if [[ "$GPU_QUICK" == 1 ]]; then
    GPU_STREAMS=1,2,4,16 GPU_STEPS="${FT_GPU_STEPS:-32}" GPU_WARMUP="${FT_GPU_WARMUP:-64}"
else
    GPU_STREAMS=1,2,3,4,6,8,12,16 GPU_STEPS="${FT_GPU_STEPS:-64}" GPU_WARMUP="${FT_GPU_WARMUP:-128}"
fi
# ft run's default context, given to the simulator too, with requests as long as the
# warm-up and measured steps: its context grows over them without a reset, as ft run's does.
GPU_CONTEXT=1024

gpu_usable() {
    case "${FT_GPU:-auto}" in
    0) return 1 ;;
    1) return 0 ;;
    *) "$FT" --version | grep -Eq '^cuda driver: found \([1-9]' ;;
    esac
}

if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
write_env_txt "$OUT/env.txt" "concurrency ($(run_size))" "$0 $*" \
    "model: $MODEL; hosts: ${HOSTS[*]}; streams: $STREAMS; steps $STEPS after $WARMUP warm-up"
if gpu_usable; then
    echo "runtime half: device $DEVICE, $GPU_LAYERS of 48 layers, streams $GPU_STREAMS, $GPU_STEPS steps after $GPU_WARMUP warm-up, context $GPU_CONTEXT; no run starts after ${GPU_BUDGET_S} s" >> "$OUT/env.txt"
fi

rm -f "$OUT"/raw/sim.*.csv
for host in "${HOSTS[@]}"; do
    echo "concurrency: simulating $host" >&2
    cache=()
    [[ "$host" == "$GPU_HOST" ]] && cache=(--cache-gb "$GPU_CACHE_GB")
    "$FT" simulate --host "$host" --model "$MODEL" "${cache[@]}" --sweep "streams=$STREAMS" \
        --strategy offload,hybrid,cpu --with-model --steps "$STEPS" --warmup "$WARMUP" \
        --out "$OUT/raw/sim.$host.csv"
done
if [[ "$QUICK" != 1 ]]; then
    # The decision line `ft predict` logs at the field report's two streams.
    slots=$(awk -F, 'NR == 2 { print $6 }' "$OUT/raw/sim.rtx4090-2x-xeon4310.csv")
    "$FT" predict --host rtx4090-2x-xeon4310 --model "$MODEL" --streams 2 --cache-slots "$slots" \
        --context 1327 --json | jq -r '.decision.log_line' > "$OUT/predict-2-streams.txt"
fi

# Runtime half: only where a GPU is usable (or FT_GPU=1) and `ft run` has the flags it needs.
rm -f "$OUT/raw/runtime.csv" "$OUT/raw/runtime-sim.csv" "$OUT"/raw/run.*.json "$OUT"/raw/run.*.log "$OUT/runtime.csv" "$OUT/runtime-skipped.txt"
if gpu_usable; then
    if "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction'; then
        # The 16 GiB cache of the whole model as the same share of GPU_LAYERS layers' experts.
        runtime_model_and_cache "$FT" "$OUT" "$MODEL" "$GPU_LAYERS" "$GPU_HOST" "$GPU_CACHE_GB"
        runtime_host "$FT" "$OUT" "$DEVICE" "$GPU_HOST" "${FT_PROBE_BUDGET_S:-20}"
        echo "concurrency: simulating $SIM_HOST for the runtime half" >&2
        "$FT" simulate --host "$SIM_HOST" --model "$OUT/models/runtime.toml" --cache-slots "$GPU_SLOTS" \
            --sweep "streams=$GPU_STREAMS" --strategy offload,hybrid,cpu --with-model \
            --context "$GPU_CONTEXT" --output-tokens "$(( GPU_WARMUP + GPU_STEPS ))" \
            --steps "$GPU_STEPS" --warmup "$GPU_WARMUP" --out "$OUT/raw/runtime-sim.csv"
        echo "strategy,streams,json" > "$OUT/raw/runtime.csv"
        IFS=, read -ra bs <<< "$GPU_STREAMS"
        n_runs=$(( ${#bs[@]} * 3 )) done_runs=0
        for b in "${bs[@]}"; do
            for s in offload hybrid cpu; do
                if (( SECONDS > GPU_BUDGET_S )); then
                    echo "runtime half: budget (${GPU_BUDGET_S} s) spent after $done_runs of $n_runs runs; stopped before $s at $b stream(s)" | tee -a "$OUT/env.txt" >&2
                    break 2
                fi
                echo "concurrency: ft run $s at $b stream(s)" >&2
                fetch=()
                [[ "$s" == hybrid ]] && fetch=(--fetch-fraction auto --host "$SIM_HOST")
                runtime_run "$FT" "$OUT" concurrency "$s.$b" "$s,$b,run.$s.$b.json" \
                    --device "$DEVICE" --model "$MODEL" --layers "$GPU_LAYERS" --strategy "$s" "${fetch[@]}" \
                    --streams "$b" --cache-slots "$GPU_SLOTS" --context "$GPU_CONTEXT" \
                    --steps "$GPU_STEPS" --warmup "$GPU_WARMUP"
                done_runs=$(( done_runs + 1 ))
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
for host in "${HOSTS[@]}"; do
    "$FT" plot "$OUT/concurrency.csv" -o "$OUT/total-$host.svg" --kind line --x streams --log-x \
        --y sim_tok_s_total,model_tok_s_total --series strategy --where "host=$host" \
        --title "Total decode tok/s, $host, $MODEL (solid: simulator, dashed: model)" \
        --ylabel "tok/s over all streams" > /dev/null
    "$FT" plot "$OUT/concurrency.csv" -o "$OUT/per-stream-$host.svg" --kind line --x streams --log-x \
        --y sim_tok_s_per_stream,model_tok_s_per_stream --series strategy --where "host=$host" \
        --log-y --title "Decode tok/s per stream, $host, $MODEL (solid: simulator, dashed: model)" \
        --ylabel "tok/s per stream" > /dev/null
done
if [[ -s "$OUT/runtime.csv" ]]; then
    "$FT" plot "$OUT/runtime.csv" -o "$OUT/total-runtime.svg" --kind line --x streams --log-x \
        --y measured_tok_s_total,sim_tok_s_total --series strategy \
        --label measured_tok_s_total="ft run" --label sim_tok_s_total=simulator \
        --ylabel "tok/s over all streams" \
        --title "Total decode tok/s on the GPU machine (solid: ft run, dashed: simulator)" > /dev/null
fi
echo "concurrency: results in $OUT" >&2
