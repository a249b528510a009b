#!/usr/bin/env bash
# A/B of two ft binaries on the GPU machine: the same CPU-heavy decode configurations run by
# each in turn (A B A B ...), so that a slow stretch of the shared machine falls on both;
# every run's --json report is kept under OUTDIR for the analysis (the summary of the
# 2026-12-04 A/B: experiments/validate-h200/results/20261204T0417Z/pool-wait-ab.txt).
#
# Usage: scripts/binary-ab.sh OUTDIR FT_A FT_B [ROUNDS]
# Configurations: qwen3.8-flash-next geometry, 2 layers, 5% cache residency (51 slots),
# 15 threads at 1 and 4 streams, 4 threads at 1 stream; cpu and hybrid 0.4; 48 steps after
# 16 warm-up, 3 repetitions per run (flags an older binary has too).
set -uo pipefail
OUT="${1:?usage: binary-ab.sh OUTDIR FT_A FT_B [ROUNDS]}"
A="${2:?FT_A}" B="${3:?FT_B}" ROUNDS="${4:-2}"
mkdir -p "$OUT"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "A: $A ($("$A" --version | head -2 | tr '\n' ' '))"
    echo "B: $B ($("$B" --version | head -2 | tr '\n' ' '))"
} > "$OUT/env.txt"
for round in $(seq 1 "$ROUNDS"); do
    for cfg in t15-s1 t15-s4 t4-s1; do
        threads=${cfg#t}; threads=${threads%%-*}; streams=${cfg##*-s}
        for strategy in cpu hybrid; do
            for side in A B; do
                ft=$A; [[ $side == B ]] && ft=$B
                name="r$round-$cfg-$strategy-$side"
                "$ft" run --device cuda --model qwen3.8-flash-next --layers 2 --cache-slots 51 \
                    --threads "$threads" --streams "$streams" --steps 48 --warmup 16 --repeat 3 \
                    --strategy "$strategy" --fetch-fraction 0.4 --json < /dev/null \
                    > "$OUT/$name.json" 2> "$OUT/$name.log" \
                    || echo "$name: rc=$?" >> "$OUT/env.txt"
            done
        done
    done
done
