#!/usr/bin/env bash
# contention: CPU-MoE and PCIe-gather bandwidth isolated and together, across CPU thread
# counts, measured on the GPU machine, beside what the analytic model assumes.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release`, with
# `--features cuda` where nvidia-smi exists, when unset), FT_QUICK=1 for the reduced size
# CI runs, FT_GPU=0 to skip the measurement even where a GPU is usable. Needs bash, jq and
# python3 (standard library only; tomllib reads the host presets).
#
# Measured half (GPU machine): `ft bench bw --threads T` measures both bandwidths alone and
# during the same window together (the CPU expert kernel and the gather loop running at
# once), at the tuning geometry (bench-nvfp4) and the served one (qwen3.8-flash-next).
# Model half (runs anywhere): the model's contended parameters (the DRAM bandwidth CPU reads
# and DMA share, and DMA's weight in that sharing) from each host preset, and the bench
# pair `ft explain` says those parameters imply, alone and contended, for every preset at
# its engine's thread count and for the GPU machine's preset (h200-xeon-emr) at each T
# (a copy of the preset with [engine] cpu_threads = T: its CPU rate follows the model's
# thread law, as the preset gives no measured CPU-MoE bandwidth).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$HERE/../.."
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw" "$OUT/hosts"
if [[ -z "${FT:-}" ]]; then
    features=()
    command -v nvidia-smi > /dev/null && features=(--features cuda)
    (cd "$ROOT" && cargo build --release --quiet "${features[@]}")
    FT="$ROOT/target/release/ft"
fi
QUICK="${FT_QUICK:-0}"
GPU_HOST=h200-xeon-emr
MODEL=qwen3.8-flash-next
PRESETS=(rtx4090-2x-xeon4310 rtxpro4000-gen3-epyc7302 gh200 h200-xeon-emr)
if [[ "$QUICK" == 1 ]]; then
    THREADS=(1 4 16)
else
    THREADS=(1 2 4 6 8 12 16)
fi
gpu_usable() {
    [[ "${FT_GPU:-auto}" != 0 ]] && "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
{
    echo "experiment: contention ($([[ "$QUICK" == 1 ]] && echo quick || echo full))"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores visible)"
    "$FT" --version
    echo "threads: ${THREADS[*]}; served model: $MODEL"
} > "$OUT/env.txt"

rm -f "$OUT"/raw/*
explain() { # HOST-OR-FILE LABEL THREADS
    "$FT" explain --host "$1" --model "$MODEL" --steps 1 --warmup 0 --json \
        | jq -c --arg lab "$2" --arg threads "$3" '{"label": $lab, "threads": $threads,
            legacy: .prediction.legacy,
            contention: (.explanation.reasons[] | select(.kind == "contention"))}' \
        >> "$OUT/raw/model.jsonl"
}
for p in "${PRESETS[@]}"; do
    cp "$ROOT/sim/hosts/$p.toml" "$OUT/hosts/$p.toml"
    explain "$p" "$p" engine
done
for t in "${THREADS[@]}"; do
    f="$OUT/hosts/$GPU_HOST-$t-threads.toml"
    { cat "$ROOT/sim/hosts/$GPU_HOST.toml"; printf '\n[engine]\ncpu_threads = %s\n' "$t"; } > "$f"
    explain "$f" "$GPU_HOST" "$t"
done

if gpu_usable; then
    for t in "${THREADS[@]}"; do
        echo "contention: ft bench bw --threads $t" >&2
        "$FT" bench bw --model "$MODEL" --threads "$t" --json > "$OUT/raw/bench-bw.$t.json"
    done
else
    echo "measured half skipped: no usable CUDA device (or FT_GPU=0)" > "$OUT/measured-skipped.txt"
fi

python3 "$HERE/analyze.py" "$OUT"
fi
"$FT" plot "$OUT/threads.csv" -o "$OUT/cpu-moe-threads.svg" --kind line --x threads \
    --y cpu_moe_gbs,cpu_moe_contended_gbs --series source --where "geometry=tuning" --y-from-zero \
    --title "CPU-MoE bandwidth alone (solid) and during a gather (dashed), tuning geometry" \
    --xlabel "CPU threads" --ylabel "GB/s" > /dev/null
"$FT" plot "$OUT/threads.csv" -o "$OUT/gather-threads.svg" --kind line --x threads \
    --y pcie_gather_gbs,pcie_gather_contended_gbs --series source --where "geometry=tuning" --y-from-zero \
    --title "Gather bandwidth alone (solid) and while the CPU kernel runs (dashed), tuning geometry" \
    --xlabel "CPU threads of the kernel" --ylabel "GB/s" > /dev/null
echo "contention: results in $OUT" >&2
