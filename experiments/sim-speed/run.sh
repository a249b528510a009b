#!/usr/bin/env bash
# Simulator speed: `run.sh OUTDIR` (the committed results are in results/). Uses $FT (the ft
# binary; `ft` on PATH by default) and cargo for the engine micro-benchmark. FT_QUICK=1 sweeps
# 100 points.
set -euo pipefail
export NO_COLOR=1
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
FT="${FT:-ft}"
mkdir -p "$OUT"
write_env_txt "$OUT/machine.txt" "sim-speed ($(run_size))" "$0 $*" \
  "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. Events per second on one core (engine alone, replayed plan, live decode by parts).
(cd "$HERE/../.." && cargo run --quiet --release -p ft-sim --example sim_speed) > "$OUT/engine.csv"

# 2. A 1,000-configuration sweep of 256-step decodes (after 64 warm-up steps each):
#    4 hosts x 5 stream counts x 5 cache sizes x 10 strategies (hybrid at 7 fractions).
HOSTS=rtx4090-2x-xeon4310,rtxpro4000-gen3-epyc7302,gh200,h200-xeon-emr
STRATS=offload,cpu,resident,hybrid:0.1,hybrid:0.2,hybrid:0.3,hybrid:0.4,hybrid:0.5,hybrid:0.6,hybrid:0.7
if [ "${FT_QUICK:-0}" = "1" ]; then STRATS=offload,hybrid:0.3; HOSTS=gh200,h200-xeon-emr; fi
CMD=("$FT" -v simulate --sweep "host=$HOSTS" --sweep "streams=1,2,4,8,16"
  --sweep "cache-slots=2000,4000,6000,8000,10000" --sweep "strategy=$STRATS"
  --steps 256 --warmup 64 --out "$OUT/sweep.csv")
echo "${CMD[*]}" > "$OUT/sweep-command.txt"
TIMEFORMAT='%R %U %S'
{ time "${CMD[@]}" 2> "$OUT/sweep-log.txt"; } 2> "$OUT/sweep-times.raw"
read -r wall user sys < "$OUT/sweep-times.raw"
rm -f "$OUT/sweep-times.raw"
rows=$(($(wc -l < "$OUT/sweep.csv") - 1))
{
  echo "configurations: $rows"
  echo "wall seconds: $wall"
  echo "cpu seconds (user + sys, both cores): $(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')"
} | tee "$OUT/sweep-time.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
