#!/usr/bin/env bash
# Simulator speed: `run.sh OUTDIR` (the committed results are in results/). Builds ft-sim's
# two examples in release (sim_speed: the engine micro-benchmark; sim_sweep: the points of
# `ft simulate --sweep`, the same rows, without building the ft binary). FT_QUICK=1 sweeps
# 100 points once; FT_REPEATS=N runs the sweep N times (default 3) and reports medians.
set -euo pipefail
export NO_COLOR=1
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
ROOT="$(cd "$HERE/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
REPEATS="${FT_REPEATS:-3}"
if [ "${FT_QUICK:-0}" = "1" ]; then REPEATS=1; fi
mkdir -p "$OUT"
write_env_txt "$OUT/machine.txt" "sim-speed ($(run_size))" "$0 $*" \
  "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

(cd "$ROOT" && cargo build --quiet --release -p ft-sim --example sim_speed --example sim_sweep)

# 1. Events per second on one core (engine alone, replayed plan, live decode by parts).
"$TARGET/release/examples/sim_speed" > "$OUT/engine.csv"

# 2. A 1,000-configuration sweep of 256-step decodes (after 64 warm-up steps each):
#    4 hosts x 5 stream counts x 5 cache sizes x 10 strategies (hybrid at 7 fractions).
HOSTS=rtx4090-2x-xeon4310,rtxpro4000-gen3-epyc7302,gh200,h200-xeon-emr
STRATS=offload,cpu,resident,hybrid:0.1,hybrid:0.2,hybrid:0.3,hybrid:0.4,hybrid:0.5,hybrid:0.6,hybrid:0.7
if [ "${FT_QUICK:-0}" = "1" ]; then STRATS=offload,hybrid:0.3; HOSTS=gh200,h200-xeon-emr; fi
CMD=("$TARGET/release/examples/sim_sweep" "$OUT/sweep.csv" --sweep "host=$HOSTS"
  --sweep "streams=1,2,4,8,16" --sweep "cache-slots=2000,4000,6000,8000,10000"
  --sweep "strategy=$STRATS" --steps 256 --warmup 64)
echo "${CMD[*]}" > "$OUT/sweep-command.txt"

# 3. The sweep's events per second against the replayed plan's on one core, measured above
#    in this run: a sweep that plans and replays at the engine's own rate on both cores would
#    reach twice it per wall second, and 1.0 of it per CPU-second. Planning, routing and the
#    sweep's bookkeeping are what keeps it below; a regression in any of them lowers the
#    ratio whatever the machine's speed.
replay=$(awk -F, '$1 == "replay" { print $5 }' "$OUT/engine.csv")
echo "repeat,wall_s,cpu_s,events,events_per_wall_s,events_per_cpu_s,replay_events_per_s,cpu_ratio_to_replay,load_before" \
  > "$OUT/sweep-times.csv"
TIMEFORMAT='%R %U %S'
for r in $(seq 1 "$REPEATS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  { time "${CMD[@]}" > "$OUT/sweep-log.txt"; } 2> "$OUT/sweep-times.raw"
  read -r wall user sys < "$OUT/sweep-times.raw"
  rm -f "$OUT/sweep-times.raw"
  events=$(python3 -c 'import csv,sys; print(sum(int(r["events"]) for r in csv.DictReader(open(sys.argv[1]))))' "$OUT/sweep.csv")
  awk -v r="$r" -v w="$wall" -v u="$user" -v s="$sys" -v e="$events" -v rp="$replay" -v l="$load" \
    'BEGIN { c = u + s; printf "%d,%.2f,%.2f,%d,%.0f,%.0f,%.0f,%.3f,%s\n", r, w, c, e, e / w, e / c, rp, e / c / rp, l }' \
    >> "$OUT/sweep-times.csv"
done
rows=$(($(wc -l < "$OUT/sweep.csv") - 1))
python3 - "$OUT/sweep-times.csv" "$rows" << 'EOF' | tee "$OUT/sweep-time.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
med = lambda k: statistics.median(float(r[k]) for r in rows)
print(f"configurations: {sys.argv[2]}")
print(f"repeats: {len(rows)} (medians below; every repeat in sweep-times.csv)")
print(f"wall seconds: {med('wall_s'):.2f}")
print(f"cpu seconds (user + sys, both cores): {med('cpu_s'):.2f}")
print(f"events: {int(med('events'))}")
print(f"events per wall second: {med('events_per_wall_s') / 1e6:.2f} M")
print(f"events per cpu second: {med('events_per_cpu_s') / 1e6:.2f} M")
print(f"replayed plan on one core (engine.csv, this run): {med('replay_events_per_s') / 1e6:.2f} M events/s")
print(f"sweep per cpu second / replayed plan: {med('cpu_ratio_to_replay'):.3f}")
EOF
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
