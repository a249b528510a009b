#!/usr/bin/env bash
# The simulator against the analytic model on a grid: `run.sh OUTDIR` (the committed results are in
# results/).
# Uses $FT (the ft binary; `ft` on PATH by default). FT_QUICK=1 runs a small grid.
set -euo pipefail
export NO_COLOR=1
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
FT="${FT:-ft}"
mkdir -p "$OUT"
write_env_txt "$OUT/env.txt" "sim-vs-model ($(run_size))" "$0 $*"
HOSTS=rtx4090-2x-xeon4310,rtxpro4000-gen3-epyc7302,gh200,h200-xeon-emr
MODELS=qwen3.8-flash-next,qwen3.6-35b-a3b,gpt-oss-120b,deepseek-v4-flash
STREAMS=1,2,4,8
MISS=0.2,0.4,0.6
STEPS=128
if [ "${FT_QUICK:-0}" = "1" ]; then MODELS=qwen3.8-flash-next,gpt-oss-120b; STREAMS=1,4; MISS=0.4; STEPS=48; fi

# Every strategy (hybrid at the model's optimum fetch fraction), the cache sized so that
# offload misses 20/40/60% at each stream count, 64 warm-up steps, the model beside.
"$FT" -v simulate --sweep host=$HOSTS --sweep model=$MODELS --sweep streams=$STREAMS \
  --sweep miss-rate=$MISS --strategy all --fetch-fraction auto --warmup 64 --steps "$STEPS" \
  --with-model --out "$OUT/grid.csv"

# Summary: the largest |sim/model - 1| overall and per strategy, and the share within 5%.
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  { d = $col["sim_vs_model"]; a = d < 0 ? -d : d; s = $col["strategy"]; n++; ns[s]++
    if (a <= 0.05) { ok++; oks[s]++ }
    if (a > worst) { worst = a; where = $1 " " $2 " B=" $3 " " s " slots=" $6 }
    if (a > ws[s]) ws[s] = a }
  END { printf "rows %d, within 5%%: %d (%.1f%%), largest %.2f%% at %s\n", n, ok, 100 * ok / n, 100 * worst, where
        for (s in ns) printf "  %-9s rows %3d, within 5%%: %3d, largest %.2f%%\n", s, ns[s], oks[s], 100 * ws[s] }' \
  "$OUT/grid.csv" | tee "$OUT/summary.txt"
