#!/usr/bin/env bash
# fetch-fraction: hybrid's decode tok/s across fetch fractions 0 to 1 at 1, 2 and 8 streams,
# with the analytic model's optimum and the bandwidth-split rule's choice marked.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the runtime half even
# where a GPU is usable, FT_GPU=1 to run it even without one (with FT_DEVICE=host: the
# host-emulated device). Needs bash, jq and python3 (standard library only).
#
# Simulator half: the field report's host and model with its cache (offload misses 38% at 2
# streams); `ft simulate --strategy hybrid --sweep fetch-fraction=0,...,1` at 1, 2 and 8
# streams (with --with-model in the full run, for the model's curve), and hybrid with
# `--fetch-fraction auto` for the model's optimum at each stream count. The split rules
# come from the same run's legacy view: the reference engine's p/(p+c) on the contended
# bench pair (the field report's 27.7%), and p/(p+c) on the standalone pair.
# Runtime half (GPU machine): `ft run --strategy hybrid --fetch-fraction F` over a grid at
# 1, 2 and 8 streams, and the simulator of this machine's profile (`ft probe` of the L-layer
# model; the h200-xeon-emr preset where it fails) beside it (its grid, its optimum
# and the split rules); bounded to fit one remote call beside the other experiments
# (scripts/device-run.sh): `ft run --layers L` runs the same geometry with L of its 48
# layers (per-layer numbers do not depend on L) on h200-xeon-emr's 16 GiB cache scaled to
# the same share of L layers' experts, and the simulator runs that same L-layer model,
# cache, context and steps. The fractions run coarse to fine (0, 1, 0.4, then between), each
# at every stream count, so a budget cut leaves a coarser curve, not fewer stream counts. Env:
#   FT_DEVICE        ft run's device (default cuda; host: the host-emulated device)
#   FT_LAYERS        MoE layers of the runtime half (default 2)
#   FT_GPU_QUICK     1 (default): f = 0, 0.2, 0.3, 0.4, 0.5, 0.7, 1 (21 runs, about 60 s on
#                    the H200 machine); 0: f = 0, 0.1, ..., 1 (33 runs, about 90 s)
#   FT_GPU_STEPS, FT_GPU_WARMUP  the runs' steps (default 32 after 64 warm-up)
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
STREAMS=1,2,8
if [[ "$QUICK" == 1 ]]; then
    GRID=0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1 STEPS=24 WARMUP=32 WITH_MODEL=()
else
    GRID=0,0.05,0.1,0.15,0.2,0.25,0.3,0.35,0.4,0.45,0.5,0.55,0.6,0.65,0.7,0.75,0.8,0.85,0.9,0.95,1
    STEPS=128 WARMUP=256 WITH_MODEL=(--with-model)
fi
# The runtime half's bounds (see the header). GPU_ORDER: the grid, coarse to fine.
DEVICE="${FT_DEVICE:-cuda}"
GPU_LAYERS="${FT_LAYERS:-2}"
GPU_STEPS="${FT_GPU_STEPS:-32}" GPU_WARMUP="${FT_GPU_WARMUP:-64}"
GPU_BUDGET_S="${FT_GPU_BUDGET_S:-150}"
if [[ "${FT_GPU_QUICK:-1}" == 1 ]]; then
    GPU_GRID=0,0.2,0.3,0.4,0.5,0.7,1 GPU_ORDER=(0 1 0.4 0.2 0.7 0.3 0.5)
else
    GPU_GRID=0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1 GPU_ORDER=(0 1 0.4 0.2 0.7 0.3 0.5 0.1 0.6 0.8 0.9)
fi
GPU_CONTEXT=1024   # ft run's default, given to the simulator beside it too
gpu_usable() {
    case "${FT_GPU:-auto}" in
    0) return 1 ;;
    1) return 0 ;;
    *) "$FT" --version | grep -Eq '^cuda driver: found \([1-9]' ;;
    esac
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
write_env_txt "$OUT/env.txt" "fetch-fraction ($(run_size))" "$0 $*" \
    "host: $HOST; model: $MODEL; streams: $STREAMS; fetch fractions: $GRID; steps $STEPS after $WARMUP warm-up"
if gpu_usable; then
    echo "runtime half: device $DEVICE, $GPU_LAYERS of 48 layers, streams $STREAMS, fetch fractions $GPU_GRID, $GPU_STEPS steps after $GPU_WARMUP warm-up, context $GPU_CONTEXT; no run starts after ${GPU_BUDGET_S} s" >> "$OUT/env.txt"
fi

sim_half() { # HOST OUTNAME MODEL GRID STEPS WARMUP WITH_MODEL [flags...]: the grid, the optimum and the legacy view
    local host="$1" name="$2" model="$3" grid="$4" steps="$5" warmup="$6" with_model="$7"
    shift 7
    "$FT" simulate --host "$host" --model "$model" "$@" --strategy hybrid --sweep "streams=$STREAMS" \
        --sweep "fetch-fraction=$grid" ${with_model:+"$with_model"} --steps "$steps" --warmup "$warmup" \
        --out "$OUT/raw/grid.$name.csv"
    "$FT" simulate --host "$host" --model "$model" "$@" --strategy offload,hybrid --fetch-fraction auto \
        --streams "$STREAMS" --steps "$steps" --warmup "$warmup" --json > "$OUT/raw/auto.$name.json"
    # Hybrid at exactly the two split rules' fractions: p/(p+c) on the contended bench pair
    # (the reference engine's) and on the standalone pair.
    local contended standalone
    contended=$(jq -r '.[0].legacy.fetch_fraction' "$OUT/raw/auto.$name.json")
    standalone=$(jq -r '.[0].legacy | .pcie_gather_gbs / (.pcie_gather_gbs + .cpu_moe_gbs)' "$OUT/raw/auto.$name.json")
    "$FT" simulate --host "$host" --model "$model" "$@" --strategy hybrid --sweep "streams=$STREAMS" \
        --sweep "fetch-fraction=$contended,$standalone" --steps "$steps" --warmup "$warmup" \
        --out "$OUT/raw/split.$name.csv"
    echo "$host" > "$OUT/host.$name.txt"
}
echo "fetch-fraction: simulating $HOST" >&2
sim_half "$HOST" field "$MODEL" "$GRID" "$STEPS" "$WARMUP" "${WITH_MODEL[*]}"

rm -f "$OUT/raw/runtime.csv" "$OUT"/raw/*.gpu.csv "$OUT/raw/auto.gpu.json" "$OUT"/raw/run.*.json "$OUT"/raw/run.*.log \
    "$OUT/fetch-fraction.gpu.csv" "$OUT/marks.gpu.txt" "$OUT/host.gpu.txt" "$OUT"/tok-s-gpu-*.svg "$OUT/runtime-skipped.txt"
if gpu_usable; then
    if "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction'; then
        # The 16 GiB cache of the whole model as the same share of GPU_LAYERS layers' experts.
        runtime_model_and_cache "$FT" "$OUT" "$MODEL" "$GPU_LAYERS" "$GPU_HOST" "$GPU_CACHE_GB"
        runtime_host "$FT" "$OUT" "$DEVICE" "$GPU_HOST" "${FT_PROBE_BUDGET_S:-20}"
        echo "fetch-fraction: simulating $SIM_HOST for the runtime half" >&2
        sim_half "$SIM_HOST" gpu "$OUT/models/runtime.toml" "$GPU_GRID" "$GPU_STEPS" "$GPU_WARMUP" --with-model \
            --cache-slots "$GPU_SLOTS" --context "$GPU_CONTEXT" --output-tokens "$(( GPU_WARMUP + GPU_STEPS ))"
        echo "streams,fetch_fraction,json" > "$OUT/raw/runtime.csv"
        IFS=, read -ra bs <<< "$STREAMS"
        n_runs=$(( ${#bs[@]} * ${#GPU_ORDER[@]} )) done_runs=0
        for f in "${GPU_ORDER[@]}"; do
            for b in "${bs[@]}"; do
                if (( SECONDS > GPU_BUDGET_S )); then
                    echo "runtime half: budget (${GPU_BUDGET_S} s) spent after $done_runs of $n_runs runs; stopped before f=$f at $b stream(s)" | tee -a "$OUT/env.txt" >&2
                    break 2
                fi
                echo "fetch-fraction: ft run hybrid f=$f at $b stream(s)" >&2
                runtime_run "$FT" "$OUT" fetch-fraction "$b.$f" "$b,$f,run.$b.$f.json" \
                    --device "$DEVICE" --model "$MODEL" --layers "$GPU_LAYERS" --strategy hybrid \
                    --fetch-fraction "$f" --streams "$b" --cache-slots "$GPU_SLOTS" --context "$GPU_CONTEXT" \
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
for name in field gpu; do
    [[ -f "$OUT/fetch-fraction.$name.csv" ]] || continue
    ycols=sim_tok_s_total
    [[ "$QUICK" != 1 ]] && ycols=sim_tok_s_total,model_tok_s_total
    [[ "$name" == gpu ]] && ycols=measured_tok_s_total,sim_tok_s_total
    host=$(cat "$OUT/host.$name.txt")
    # marks.NAME.txt: "STREAMS VALUE:LABEL" per line (the split rules carry every stream count).
    all_marks=()
    for b in ${STREAMS//,/ }; do
        mark_args=()
        while read -r mb m; do
            [[ "$mb" == "$b" ]] && mark_args+=(--mark-x "$m")
        done < "$OUT/marks.$name.txt"
        all_marks+=("${mark_args[@]}")
        "$FT" plot "$OUT/fetch-fraction.$name.csv" -o "$OUT/tok-s-$name-$b-streams.svg" --kind line \
            --x fetch_fraction --y "$ycols" --series streams --where "n_streams=$b" "${mark_args[@]}" \
            --title "Hybrid tok/s against fetch fraction, $b stream(s), $host" \
            --xlabel "fetch fraction (share of each layer's misses gathered)" \
            --ylabel "tok/s over all streams" > /dev/null
    done
done
echo "fetch-fraction: results in $OUT" >&2
