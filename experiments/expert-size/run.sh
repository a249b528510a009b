#!/usr/bin/env bash
# expert-size: CPU-MoE and gather bandwidth, and the strategy winner, as the expert size falls
# from 12 MB to 1 MB: what measuring at a tuning geometry instead of the served one does.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the GPU-machine half
# even where a GPU is usable, FT_GPU=1 to run it even without one (with FT_DEVICE=host: the
# host-emulated device). Needs bash, jq and python3 (standard library only).
#
# Models: NVFP4 experts of the reference engine's tuning geometry (bench-nvfp4: hidden 3072,
# 128 experts, top-8, 48 layers) with the intermediate size scaled so that one expert weighs
# about 12, 8, 6, 4, 3, 2, 1.5 and 1 MB (written as model TOMLs into OUTDIR/models/); the
# 8 MB one is the tuning geometry itself. Everything else is held: the routing, and a cache
# of a quarter of the experts (1536 slots), so every size sees the same hits and misses and
# only the bytes and the fixed costs change.
# Simulator half, on the field report's host and on this project's GPU machine: `ft explain`
# gives the legacy rule's bench pair (measured at the tuning geometry: the same for every
# size) and the model's bench at the served size; `ft simulate --sweep` runs offload, hybrid
# (the model's fetch fraction) and cpu at 1 and 2 streams with --with-model.
# GPU-machine half, bounded to fit one remote call beside the other experiments
# (scripts/device-run.sh): `ft bench bw --model FILE` measures both bandwidths at each size
# (and at the tuning geometry), and `ft run` decodes each size with offload, hybrid (the
# model's fraction for h200-xeon-emr) and cpu at 1 and 2 streams, on the same geometry
# with L of its 48 layers (per-layer numbers do not depend on L) and the cache scaled to
# the same quarter of the experts (1536 * L / 48 slots); `ft simulate` of h200-xeon-emr on
# those L-layer models, cache, context and steps is beside it. Env:
#   FT_DEVICE        ft run's and ft bench bw's device (default cuda; host: host-emulated)
#   FT_LAYERS        MoE layers of the runtime runs (default 2)
#   FT_GPU_QUICK     1 (default): sizes 12, 4 and 1 MB (3 bench bw + 18 runs, about 60 s
#                    on the H200 machine); 0: the full run's sizes (8 + 48, about 150 s)
#   FT_GPU_STEPS, FT_GPU_WARMUP  the runs' steps (default 32 after 64 warm-up)
#   FT_BENCH_BW_ARGS extra `ft bench bw` flags (default none: a 1 GiB bank, 20 repetitions,
#                    a 500 ms contended window; e.g. "--bank-mib 64 --reps 2" for a smoke test)
#   FT_GPU_BUDGET_S  no GPU-half measurement starts later than this many seconds after the
#                    script started (default 200); a cut is logged in env.txt
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/runtime-half.sh
source "$HERE/../lib/runtime-half.sh"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw" "$OUT/models"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
resolve_ft
QUICK="${FT_QUICK:-0}"
# intermediate:label pairs; expert bytes = 3 * 3072 * I * 9/16 + 2 * (2 I + 3072) in NVFP4.
if [[ "$QUICK" == 1 ]]; then
    SIZES=(2304:12mb 768:4mb 192:1mb) HOSTS=(rtx4090-2x-xeon4310) STEPS=24 WARMUP=32
else
    SIZES=(2304:12mb 1536:8mb 1152:6mb 768:4mb 576:3mb 384:2mb 288:1.5mb 192:1mb)
    HOSTS=(rtx4090-2x-xeon4310 h200-xeon-emr) STEPS=128 WARMUP=256
fi
CACHE_SLOTS=1536
MODEL_LAYERS=48
# The GPU-machine half's bounds (see the header).
DEVICE="${FT_DEVICE:-cuda}"
GPU_LAYERS="${FT_LAYERS:-2}"
GPU_QUICK="${FT_GPU_QUICK:-1}"
GPU_STEPS="${FT_GPU_STEPS:-32}" GPU_WARMUP="${FT_GPU_WARMUP:-64}"
GPU_BUDGET_S="${FT_GPU_BUDGET_S:-200}"
GPU_SLOTS=$(( (CACHE_SLOTS * GPU_LAYERS + MODEL_LAYERS / 2) / MODEL_LAYERS ))
GPU_CONTEXT=1024   # ft run's default, given to the simulator beside it too
if [[ "$GPU_QUICK" == 1 ]]; then GPU_SIZES=(2304:12mb 768:4mb 192:1mb); else GPU_SIZES=("${SIZES[@]}"); fi
gpu_usable() {
    case "${FT_GPU:-auto}" in
    0) return 1 ;;
    1) return 0 ;;
    *) "$FT" --version | grep -Eq '^cuda driver: found \([1-9]' ;;
    esac
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
write_env_txt "$OUT/env.txt" "expert-size ($(run_size))" "$0 $*" \
    "sizes (intermediate:label): ${SIZES[*]}; hosts: ${HOSTS[*]}; cache $CACHE_SLOTS slots; steps $STEPS after $WARMUP warm-up"
if gpu_usable; then
    echo "GPU-machine half: device $DEVICE; sizes ${GPU_SIZES[*]}; $GPU_LAYERS of $MODEL_LAYERS layers, cache $GPU_SLOTS slots; $GPU_STEPS steps after $GPU_WARMUP warm-up, context $GPU_CONTEXT; no measurement starts after ${GPU_BUDGET_S} s" >> "$OUT/env.txt"
fi

write_model() { # FILE INTERMEDIATE LABEL LAYERS
    cat > "$1" <<TOML
# bench-nvfp4's geometry with the intermediate size scaled to $2 (about $3 per expert), $4 MoE layers.
name = "expert-$3"
format = "nvfp4"

[geometry]
hidden = 3072
intermediate = $2
experts = 128
top_k = 8
moe_layers = $4
shared_experts = 0
TOML
}
models=()
for s in "${SIZES[@]}"; do
    i="${s%%:*}" label="${s#*:}"
    write_model "$OUT/models/expert-$label.toml" "$i" "$label" "$MODEL_LAYERS"
    models+=("$OUT/models/expert-$label.toml")
done
model_list=$(IFS=,; echo "${models[*]}")

rm -f "$OUT"/raw/* "$OUT/measured-bandwidth.csv" "$OUT/bandwidth-measured.svg" "$OUT/runtime.csv" "$OUT/runtime.svg"
for host in "${HOSTS[@]}"; do
    echo "expert-size: $host" >&2
    for m in "${models[@]}"; do
        "$FT" explain --host "$host" --model "$m" --cache-slots "$CACHE_SLOTS" --steps 8 --warmup 8 \
            --json | jq -c '{model: .prediction.model, expert_bytes: .prediction.expert_bytes,
                legacy: .prediction.legacy,
                served: (.explanation.reasons[] | select(.kind == "expert-size"))}' \
            >> "$OUT/raw/bench-model.$host.jsonl"
    done
    "$FT" simulate --host "$host" --sweep "model=$model_list" --cache-slots "$CACHE_SLOTS" \
        --sweep streams=1,2 --strategy offload,hybrid,cpu --with-model --steps "$STEPS" \
        --warmup "$WARMUP" --out "$OUT/raw/sim.$host.csv"
done

rm -f "$OUT/runtime-skipped.txt"
if gpu_usable; then
    # The same sizes with GPU_LAYERS layers: what `ft run --layers` decodes, for the simulator.
    mkdir -p "$OUT/models/gpu"
    gpu_models=()
    for s in "${GPU_SIZES[@]}"; do
        i="${s%%:*}" label="${s#*:}"
        write_model "$OUT/models/gpu/expert-$label.toml" "$i" "$label" "$GPU_LAYERS"
        [[ -f "$OUT/models/expert-$label.toml" ]] || write_model "$OUT/models/expert-$label.toml" "$i" "$label" "$MODEL_LAYERS"
        gpu_models+=("$OUT/models/gpu/expert-$label.toml")
    done
    has_run=0
    "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction' && has_run=1
    if [[ "$has_run" == 1 ]]; then
        echo "expert-size: simulating h200-xeon-emr for the runtime runs" >&2
        "$FT" simulate --host h200-xeon-emr --sweep "model=$(IFS=,; echo "${gpu_models[*]}")" \
            --cache-slots "$GPU_SLOTS" --sweep streams=1,2 --strategy offload,hybrid,cpu --with-model \
            --context "$GPU_CONTEXT" --output-tokens "$(( GPU_WARMUP + GPU_STEPS ))" \
            --steps "$GPU_STEPS" --warmup "$GPU_WARMUP" --out "$OUT/raw/runtime-sim.csv"
    fi
    n_meas=$(( ${#gpu_models[@]} * (1 + 6 * has_run) )) done_meas=0
    over_budget() {
        if (( SECONDS > GPU_BUDGET_S )); then
            echo "GPU-machine half: budget (${GPU_BUDGET_S} s) spent after $done_meas of $n_meas measurements; stopped before $1" | tee -a "$OUT/env.txt" >&2
            return 0
        fi
        return 1
    }
    for g in "${gpu_models[@]}"; do
        label=$(basename "$g" .toml)
        m="$OUT/models/$label.toml"   # the 48-layer model: ft run takes --layers
        over_budget "ft bench bw --model $label" && break
        echo "expert-size: ft bench bw --model $label" >&2
        # shellcheck disable=SC2086 # FT_BENCH_BW_ARGS is a list of flags
        "$FT" bench bw --device "$DEVICE" --model "$m" ${FT_BENCH_BW_ARGS:-} --json > "$OUT/raw/bench-bw.$label.json" 2> "$OUT/raw/bench-bw.$label.log" \
            || { echo "expert-size: ft bench bw --model $label failed (raw/bench-bw.$label.log)" >&2; rm -f "$OUT/raw/bench-bw.$label.json"; }
        done_meas=$(( done_meas + 1 ))
        [[ "$has_run" == 1 ]] || continue
        for b in 1 2; do
            for s in offload hybrid cpu; do
                over_budget "ft run $label $s at $b stream(s)" && break 3
                fetch=()
                [[ "$s" == hybrid ]] && fetch=(--fetch-fraction auto --host h200-xeon-emr)
                echo "expert-size: ft run $label $s at $b stream(s)" >&2
                runtime_run "$FT" "$OUT" expert-size "$label.$s.$b" "" \
                    --device "$DEVICE" --model "$m" --layers "$GPU_LAYERS" --strategy "$s" "${fetch[@]}" --streams "$b" \
                    --cache-slots "$GPU_SLOTS" --context "$GPU_CONTEXT" --steps "$GPU_STEPS" --warmup "$GPU_WARMUP"
                done_meas=$(( done_meas + 1 ))
            done
        done
    done
    echo "GPU-machine half: $done_meas of $n_meas measurements done at ${SECONDS} s" >> "$OUT/env.txt"
    [[ "$has_run" == 1 ]] \
        || echo "ft run half skipped: this ft has no 'ft run --fetch-fraction'" > "$OUT/runtime-skipped.txt"
else
    echo "GPU-machine half skipped: no usable CUDA device (or FT_GPU=0)" > "$OUT/runtime-skipped.txt"
fi

python3 "$HERE/analyze.py" "$OUT"
fi
for host in "${HOSTS[@]}"; do
    "$FT" plot "$OUT/expert-size.csv" -o "$OUT/bandwidth-$host.svg" --kind line --x expert_mb --log-x \
        --y served_cpu_moe_gbs,served_pcie_gather_gbs --series host --where "host=$host" --y-from-zero \
        --mark-x "7.975:tuning geometry" --title "The model's bench at the served expert size, $host (solid: CPU-MoE, dashed: gather)" \
        --xlabel "expert size (MB)" --ylabel "GB/s" > /dev/null
    "$FT" plot "$OUT/winners.csv" -o "$OUT/gain-$host.svg" --kind line --x expert_mb --log-x \
        --y hybrid_over_offload_pct --series streams --where "host=$host" --mark-x "7.975:tuning geometry" \
        --title "Hybrid over offload (simulated) against expert size, $host" \
        --xlabel "expert size (MB)" --ylabel "hybrid tok/s over offload's, minus 1 (%)" > /dev/null
done
if [[ -f "$OUT/measured-bandwidth.csv" ]]; then
    "$FT" plot "$OUT/measured-bandwidth.csv" -o "$OUT/bandwidth-measured.svg" --kind line \
        --x expert_mb --log-x --y cpu_moe_gbs,pcie_gather_gbs --series geometry \
        --title "ft bench bw on the GPU machine (solid: CPU-MoE, dashed: gather)" \
        --xlabel "expert size (MB)" --ylabel "GB/s" > /dev/null
fi
if [[ -f "$OUT/runtime.csv" ]]; then
    "$FT" plot "$OUT/runtime.csv" -o "$OUT/runtime.svg" --kind line --x expert_mb --log-x \
        --y measured_tok_s_total,sim_tok_s_total --series strategy --where "streams=1" --y-from-zero \
        --title "ft run on the GPU machine, 1 stream (solid: measured, dashed: simulator)" \
        --xlabel "expert size (MB)" --ylabel "tok/s" > /dev/null \
        || echo "expert-size: ft plot of runtime.csv failed; the CSV is complete" >&2
fi
echo "expert-size: results in $OUT" >&2
