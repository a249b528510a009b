#!/usr/bin/env bash
# Reproduce the field report with the simulator: `run.sh OUTDIR` (the committed results are in
# results/).
# Uses $FT (the ft binary; `ft` on PATH by default). FT_QUICK=1 runs fewer steps.
set -euo pipefail
export NO_COLOR=1
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
FT="${FT:-ft}"
mkdir -p "$OUT"
write_env_txt "$OUT/env.txt" "field-report ($(run_size))" "$0 $*"
STEPS=256
if [ "${FT_QUICK:-0}" = "1" ]; then STEPS=64; fi

# 1. The main job: no flags but the step count (the field report's host, model, 1 and 2
#    streams, a cache sized to the reported 38% offload misses at 2 streams).
"$FT" simulate --steps "$STEPS" --out "$OUT/field-report.csv" | tee "$OUT/field-report.txt"
"$FT" simulate --steps "$STEPS" --json > "$OUT/field-report.json"

# 2. Sensitivity to the miss rate the report estimated ("about 38%"), at 2 streams.
"$FT" simulate --streams 2 --strategy offload,hybrid --steps "$STEPS" \
  --sweep miss-rate=0.30,0.34,0.38,0.42,0.46 --out "$OUT/miss-rate-sweep.csv"

# 3. The directions the report states, checked on the CSV of step 1:
#    offload bound by PCIe at 2 streams, hybrid ahead at 1 and 2 streams.
awk -F, 'NR > 1 { tok[$3 "," $5] = $8; bound[$3 "," $5] = $10 }
  END {
    ok = 1
    if (bound["2,offload"] != "pcie") { print "offload at 2 streams is not PCIe-bound"; ok = 0 }
    for (b = 1; b <= 2; b++)
      if (tok[b ",hybrid"] <= tok[b ",offload"]) { print "hybrid is not ahead at " b " stream(s)"; ok = 0 }
    if (!ok) exit 1
    printf "directions hold: hybrid/offload per stream %.2f (1 stream), %.2f (2 streams)\n",
      tok["1,hybrid"] / tok["1,offload"], tok["2,hybrid"] / tok["2,offload"]
  }' "$OUT/field-report.csv"
