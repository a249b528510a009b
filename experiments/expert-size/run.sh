#!/usr/bin/env bash
# expert-size: CPU-MoE and gather bandwidth, and the strategy winner, as the expert size falls
# from 12 MB to 1 MB: what measuring at a tuning geometry instead of the served one does.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the GPU-machine half
# even where a GPU is usable. Needs bash, jq and python3 (standard library only).
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
# GPU-machine half: `ft bench bw --model FILE` measures both bandwidths at every size (and at
# the tuning geometry), and `ft run` decodes each size with each strategy.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw" "$OUT/models"
if [[ -z "${FT:-}" ]]; then
    features=()
    command -v nvidia-smi > /dev/null && features=(--features cuda)
    (cd "$HERE/../.." && cargo build --release --quiet "${features[@]}")
    FT="$HERE/../../target/release/ft"
fi
QUICK="${FT_QUICK:-0}"
# intermediate:label pairs; expert bytes = 3 * 3072 * I * 9/16 + 2 * (2 I + 3072) in NVFP4.
if [[ "$QUICK" == 1 ]]; then
    SIZES=(2304:12mb 768:4mb 192:1mb) HOSTS=(rtx4090-2x-xeon4310) STEPS=24 WARMUP=32
else
    SIZES=(2304:12mb 1536:8mb 1152:6mb 768:4mb 576:3mb 384:2mb 288:1.5mb 192:1mb)
    HOSTS=(rtx4090-2x-xeon4310 h200-xeon-emr) STEPS=128 WARMUP=256
fi
CACHE_SLOTS=1536
gpu_usable() {
    [[ "${FT_GPU:-auto}" != 0 ]] && "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
{
    echo "experiment: expert-size ($([[ "$QUICK" == 1 ]] && echo quick || echo full))"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores visible)"
    "$FT" --version
    echo "sizes (intermediate:label): ${SIZES[*]}; hosts: ${HOSTS[*]}; cache $CACHE_SLOTS slots; steps $STEPS after $WARMUP warm-up"
} > "$OUT/env.txt"

models=()
for s in "${SIZES[@]}"; do
    i="${s%%:*}" label="${s#*:}"
    cat > "$OUT/models/expert-$label.toml" <<TOML
# bench-nvfp4's geometry with the intermediate size scaled to $i (about $label per expert).
name = "expert-$label"
format = "nvfp4"

[geometry]
hidden = 3072
intermediate = $i
experts = 128
top_k = 8
moe_layers = 48
shared_experts = 0
TOML
    models+=("$OUT/models/expert-$label.toml")
done
model_list=$(IFS=,; echo "${models[*]}")

rm -f "$OUT"/raw/*
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

if gpu_usable; then
    for m in "${models[@]}"; do
        label=$(basename "$m" .toml)
        echo "expert-size: ft bench bw --model $label" >&2
        "$FT" bench bw --model "$m" --json > "$OUT/raw/bench-bw.$label.json"
        if "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction'; then
            for s in offload hybrid cpu; do
                for b in 1 2; do
                    fetch=()
                    [[ "$s" == hybrid ]] && fetch=(--fetch-fraction auto --host h200-xeon-emr)
                    "$FT" run --model "$m" --strategy "$s" "${fetch[@]}" --streams "$b" --cache-slots "$CACHE_SLOTS" \
                        --steps "$STEPS" --warmup "$WARMUP" --json > "$OUT/raw/run.$label.$s.$b.json"
                done
            done
        fi
    done
    "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction' \
        || echo "ft run half skipped: this ft has no 'ft run --fetch-fraction'" > "$OUT/runtime-skipped.txt"
else
    echo "GPU-machine half skipped: no usable CUDA device (or FT_GPU=0)" > "$OUT/runtime-skipped.txt"
fi

python3 "$HERE/analyze.py" "$OUT"
fi
for host in "${HOSTS[@]}"; do
    "$FT" plot "$OUT/expert-size.csv" -o "$OUT/bandwidth-$host.svg" --kind line --x expert_mb --log-x \
        --y served_cpu_moe_gbs,served_pcie_gather_gbs --series host --where "host=$host" --y-from-zero --legend lower-right \
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
echo "expert-size: results in $OUT" >&2
