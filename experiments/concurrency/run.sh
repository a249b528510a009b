#!/usr/bin/env bash
# concurrency: decode tok/s per stream and in total for each strategy from 1 to 16 streams,
# the analytic model and the simulator side by side; on the GPU machine also the runtime.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the runtime half even
# where a GPU is usable (it runs by default where `ft --version` finds a CUDA device).
# Needs bash, jq and python3 (standard library only).
#
# Simulator half: the field report's host and model (rtx4090-2x-xeon4310, qwen3.8-flash-next)
# with the report's cache (sized so that offload misses 38% at 2 streams, then fixed for all
# stream counts), and in the full run also this project's GPU machine (h200-xeon-emr) with a
# 16 GiB expert cache (what the runtime half uses there). `ft simulate --sweep` runs every
# strategy with `--with-model`: the model columns are the same prediction `ft predict` prints
# (its routing seed aligned with the simulation's).
# Runtime half (GPU machine): `ft run` of each strategy at each stream count on the same
# model with the same 16 GiB cache.
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

gpu_usable() {
    [[ "${FT_GPU:-auto}" != 0 ]] && "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'
}
# The runtime half is compared with the simulator of the GPU machine's host: simulate it too.
if gpu_usable && [[ " ${HOSTS[*]} " != *" $GPU_HOST "* ]]; then
    HOSTS+=("$GPU_HOST")
fi

if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
{
    echo "experiment: concurrency ($([[ "$QUICK" == 1 ]] && echo quick || echo full))"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores visible)"
    "$FT" --version
    echo "model: $MODEL; hosts: ${HOSTS[*]}; streams: $STREAMS; steps $STEPS after $WARMUP warm-up"
} > "$OUT/env.txt"

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

# Runtime half: only where a GPU is usable and `ft run` has the flags it needs.
rm -f "$OUT/raw/runtime.csv"
if gpu_usable; then
    if "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction'; then
        echo "strategy,streams,json" > "$OUT/raw/runtime.csv"
        IFS=, read -ra bs <<< "$STREAMS"
        for s in offload hybrid cpu; do
            for b in "${bs[@]}"; do
                echo "concurrency: ft run $s at $b stream(s)" >&2
                fetch=()
                [[ "$s" == hybrid ]] && fetch=(--fetch-fraction auto --host "$GPU_HOST")
                "$FT" run --model "$MODEL" --strategy "$s" "${fetch[@]}" --streams "$b" \
                    --cache-gb "$GPU_CACHE_GB" --steps "$STEPS" --warmup "$WARMUP" --json \
                    > "$OUT/raw/run.$s.$b.json"
                echo "$s,$b,run.$s.$b.json" >> "$OUT/raw/runtime.csv"
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
for host in "${HOSTS[@]}"; do
    "$FT" plot "$OUT/concurrency.csv" -o "$OUT/total-$host.svg" --kind line --x streams --log-x \
        --y sim_tok_s_total,model_tok_s_total --series strategy --where "host=$host" \
        --title "Total decode tok/s, $host, $MODEL (solid: simulator, dashed: model)" \
        --ylabel "tok/s over all streams" > /dev/null
    "$FT" plot "$OUT/concurrency.csv" -o "$OUT/per-stream-$host.svg" --kind line --x streams --log-x \
        --y sim_tok_s_per_stream,model_tok_s_per_stream --series strategy --where "host=$host" \
        --log-y --legend upper-right --title "Decode tok/s per stream, $host, $MODEL (solid: simulator, dashed: model)" \
        --ylabel "tok/s per stream" > /dev/null
done
if [[ -s "$OUT/runtime.csv" ]]; then
    "$FT" plot "$OUT/runtime.csv" -o "$OUT/total-runtime.svg" --kind line --x streams --log-x \
        --y measured_tok_s_total,sim_tok_s_total --series strategy \
        --title "Total decode tok/s on the GPU machine (solid: ft run, dashed: simulator)" > /dev/null
fi
echo "concurrency: results in $OUT" >&2
