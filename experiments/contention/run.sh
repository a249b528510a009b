#!/usr/bin/env bash
# contention: CPU-MoE and PCIe-gather bandwidth isolated and together, across CPU thread
# counts, measured on the GPU machine, beside what the analytic model assumes.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release`, with
# `--features cuda` where nvidia-smi exists, when unset), FT_QUICK=1 for the reduced size
# CI runs, FT_GPU=0 to skip the measurement even where a GPU is usable, FT_GPU=1 to run it
# even without one (with FT_DEVICE=host: the host-emulated device, the gather a memcpy).
# Needs bash, jq and python3 (standard library only; tomllib reads the host presets).
#
# Measured half (GPU machine): `ft bench bw --threads T` measures both bandwidths alone and
# during the same window together (the CPU expert kernel and the gather loop running at
# once), at the tuning geometry (bench-nvfp4) and the served one (qwen3.8-flash-next).
# Bounded to fit one remote call beside the other experiments (scripts/device-run.sh); the
# thread counts run extremes first (1 and 16, then those between), so a budget cut still
# leaves the span. Env:
#   FT_DEVICE        ft bench bw's device (default cuda; host: host-emulated)
#   FT_GPU_QUICK     1 (default): threads 1, 16, 4, 8 (about 20 s on the H200 machine);
#                    0: 1, 16, 4, 8, 2, 12, 6 (about 35 s)
#   FT_BENCH_BW_ARGS extra `ft bench bw` flags (default none: a 1 GiB bank, 20 repetitions,
#                    a 500 ms contended window; e.g. "--bank-mib 64 --reps 2" for a smoke test)
#   FT_GPU_BUDGET_S  no measurement starts later than this many seconds after the script
#                    started (default 120); a cut is logged in env.txt
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
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
resolve_ft
QUICK="${FT_QUICK:-0}"
GPU_HOST=h200-xeon-emr
MODEL=qwen3.8-flash-next
PRESETS=(rtx4090-2x-xeon4310 rtxpro4000-gen3-epyc7302 gh200 h200-xeon-emr)
if [[ "$QUICK" == 1 ]]; then
    THREADS=(1 4 16)
else
    THREADS=(1 2 4 6 8 12 16)
fi
# The measured half's bounds (see the header).
DEVICE="${FT_DEVICE:-cuda}"
GPU_BUDGET_S="${FT_GPU_BUDGET_S:-120}"
if [[ "${FT_GPU_QUICK:-1}" == 1 ]]; then GPU_THREADS=(1 16 4 8); else GPU_THREADS=(1 16 4 8 2 12 6); fi
gpu_usable() {
    case "${FT_GPU:-auto}" in
    0) return 1 ;;
    1) return 0 ;;
    *) "$FT" --version | grep -Eq '^cuda driver: found \([1-9]' ;;
    esac
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
write_env_txt "$OUT/env.txt" "contention ($(run_size))" "$0 $*" \
    "threads: ${THREADS[*]}; served model: $MODEL"
if gpu_usable; then
    echo "measured half: device $DEVICE, ft bench bw at threads ${GPU_THREADS[*]}${FT_BENCH_BW_ARGS:+ with $FT_BENCH_BW_ARGS}; no measurement starts after ${GPU_BUDGET_S} s" >> "$OUT/env.txt"
fi

rm -f "$OUT"/raw/*
explain() { # HOST-OR-FILE LABEL THREADS
    "$FT" explain --host "$1" --model "$MODEL" --steps 1 --warmup 0 --json \
        | jq -c --arg lab "$2" --arg threads "$3" '{"label": $lab, "threads": $threads,
            legacy: .prediction.legacy,
            contention: (.explanation.reasons[] | select(.kind == "contention"))}' \
        >> "$OUT/raw/model.jsonl"
}
for p in "${PRESETS[@]}"; do
    cp "$ROOT/model/hosts/$p.toml" "$OUT/hosts/$p.toml"
    explain "$p" "$p" engine
done
for t in "${THREADS[@]}"; do
    f="$OUT/hosts/$GPU_HOST-$t-threads.toml"
    { cat "$ROOT/model/hosts/$GPU_HOST.toml"; printf '\n[engine]\ncpu_threads = %s\n' "$t"; } > "$f"
    explain "$f" "$GPU_HOST" "$t"
done

rm -f "$OUT/measured-skipped.txt"
if gpu_usable; then
    done_meas=0
    for t in "${GPU_THREADS[@]}"; do
        if (( SECONDS > GPU_BUDGET_S )); then
            echo "measured half: budget (${GPU_BUDGET_S} s) spent after $done_meas of ${#GPU_THREADS[@]} thread counts; stopped before $t" | tee -a "$OUT/env.txt" >&2
            break
        fi
        echo "contention: ft bench bw --threads $t" >&2
        # shellcheck disable=SC2086 # FT_BENCH_BW_ARGS is a list of flags
        "$FT" bench bw --device "$DEVICE" --model "$MODEL" --threads "$t" ${FT_BENCH_BW_ARGS:-} --json \
            > "$OUT/raw/bench-bw.$t.json" 2> "$OUT/raw/bench-bw.$t.log" \
            || { echo "contention: ft bench bw --threads $t failed (raw/bench-bw.$t.log)" >&2; rm -f "$OUT/raw/bench-bw.$t.json"; }
        done_meas=$(( done_meas + 1 ))
    done
    echo "measured half: $done_meas thread counts done at ${SECONDS} s" >> "$OUT/env.txt"
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
