#!/usr/bin/env bash
# Resident decode against its bound on the GPU machine (issue 41 item 6): qwen3.6-35b-a3b at full
# depth, every expert resident, 1 / 4 / 16 streams, three alternated rounds, beside the same run's
# HBM ceilings (gpu_backend's device copy and dense read) and a Chrome trace of the 1-stream step.
#
# Usage (GPU machine, repository root, the binaries carried in $BIN):
#   BIN=carry/res OUT=... experiments/resident-speed/run-device.sh
set -uo pipefail
BIN=${BIN:-carry/res}
MODEL=${MODEL:-qwen3.6-35b-a3b}
STEPS=${STEPS:-64}
# No run starts after BUDGET_S seconds of the script (a cut is logged), so one remote call
# keeps what its finished runs wrote.
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$OUT/machine.txt" 2>&1
# The ceilings (and the one-token layer case, so the bench's table is not empty).
timeout 120 "$BIN/gpu_backend" --device cuda --only int8/1/auto/staged+pdl+split+cvt+wide/10 > "$OUT/ceilings.txt" 2>&1
echo "ceilings rc=$?" >> "$OUT/log.txt"
for round in 1 2 3; do
  for s in 1 4 16; do
    if (( SECONDS > BUDGET_S )); then echo "budget ${BUDGET_S} s spent: stopped before round $round streams $s" >> "$OUT/log.txt"; break 2; fi
    timeout 150 "$BIN/ft" run --device cuda --model "$MODEL" --strategy resident --streams "$s" \
      --steps "$STEPS" --warmup 4 --json > "$OUT/res-s$s-r$round.json" 2>> "$OUT/log.txt"
    echo "round $round streams $s rc=$?" >> "$OUT/log.txt"
  done
done
(( SECONDS > BUDGET_S )) || timeout 120 "$BIN/ft" run --device cuda --model "$MODEL" --strategy resident --streams 1 --steps 8 \
  --warmup 4 --trace-out "$OUT/trace-s1.json" --json > "$OUT/res-s1-trace.json" 2>> "$OUT/log.txt"
echo "trace rc=$?" >> "$OUT/log.txt"
cd "$OUT" && tar czf runs.tgz res-*.json trace-s1.json 2>/dev/null; rm -f res-*.json trace-s1.json
