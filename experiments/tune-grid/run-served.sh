#!/usr/bin/env bash
# Call D: ft tune with the decode measure (client-side, prefill excluded) on the grid's build
# (carry/ab/ft, feecf97) as ft serve on CUDA, both geometries, as it is and handicapped; then
# ft run of the same build at tune's configurations (serve vs run decode, as it is).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
: "${OUT:?}"; R="$OUT/r"; mkdir -p "$R"
# shellcheck source=../lib/device-env.sh
source "$ROOT/experiments/lib/device-env.sh"
FT="$ROOT/carry/device/ft"; ENG="$ROOT/carry/ab/ft"
T0=$(date +%s)
pack() { tar -C "$OUT" -czf "$OUT/results.tgz.tmp" r && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
{ date -u; nvidia-smi -L; "$FT" --version; "$ENG" --version; } > "$R/machine.txt" 2>&1
TUNE_S="${TUNE_S:-95}"
for m in flash gptoss; do
  case $m in flash) MODEL=qwen3.8-flash-next; GEOM=carry/flash-4l.toml; GB=1.06;;
              gptoss) MODEL=gpt-oss-120b; GEOM=carry/gptoss-4l.toml; GB=1.26;; esac
  for eng in normal handicap; do
    if [[ $eng == handicap ]]; then
      taskset -c 4-7 python3 -c '
import numpy as np
a = np.ones(2**27); b = np.empty_like(a)
while True: np.copyto(b, a)' > /dev/null 2>&1 &
      HOG=$!
    fi
    t1=$(date +%s)
    timeout $(( TUNE_S + 40 )) "$FT" tune --template "carry/tune-$eng.toml" --model "$MODEL" \
        --geometry "$GEOM" --threads 15 --cache-gb "$GB" \
        --strategies offload,hybrid,cpu --fetch-fractions 0.3,0.6 --streams 2 \
        --prompt-tokens 1200 --output-tokens 256 --warmup 2 --measure decode --max-runs 8 \
        --budget-s "$TUNE_S" --out "$R/tune-$m-$eng" --json > "$R/tune-$m-$eng.json" 2> "$R/tune-$m-$eng.log"
    echo "tune $m $eng rc=$? wall=$(( $(date +%s) - t1 ))" >> "$R/steps.txt"
    [[ $eng == handicap ]] && { kill "$HOG"; wait "$HOG" 2>/dev/null; }
    pkill -f "carry/ab/ft serve" 2>/dev/null
    pack
  done
done
# serve vs run: the same build's ft run at tune's configurations (as it is)
for m in qwen3.8-flash-next gpt-oss-120b; do
  case $m in qwen3.8-flash-next) SLOTS=410;; gpt-oss-120b) SLOTS=102;; esac
  for s in 1 2; do
    [[ $m == gpt-oss-120b ]] && break 2
    [[ $(( $(date +%s) - T0 )) -gt 430 ]] && break 2
    timeout 60 "$ENG" run --device cuda --model "$m" --layers 4 --interleave offload,h30=hybrid:0.3,h60=hybrid:0.6,cpu \
        --repeat 2 --streams "$s" --context 1329 --cache-slots "$SLOTS" --steps 64 --warmup 64 --threads 15 \
        --no-timeline --json > "$R/run-$m-s$s.json" 2> "$R/run-$m-s$s.log"
    echo "run $m s$s rc=$?" >> "$R/steps.txt"
    pack
  done
done
# the handicapped grid again with one strategy per process (as a served engine runs): does
# offload at 4 streams lose its later rounds only when it shares a process with CPU variants?
mkdir -p "$R/grid1"
taskset -c 4-7 python3 -c '
import numpy as np
a = np.ones(2**27); b = np.empty_like(a)
while True: np.copyto(b, a)' > /dev/null 2>&1 &
HOG=$!
for c in 4,1024,410 4,8192,819 2,8192,102; do
  IFS=, read -r s ctx slots <<< "$c"
  for v in offload h60 h30 cpu; do
    [[ $(( $(date +%s) - T0 )) -gt 540 ]] && break 2
    case $v in offload) a=(--strategy offload);; h30) a=(--strategy hybrid --fetch-fraction 0.3);;
                h60) a=(--strategy hybrid --fetch-fraction 0.6);; cpu) a=(--strategy cpu);; esac
    timeout 40 taskset -c 0-3 "$ENG" run --device cuda --model qwen3.8-flash-next --layers 4 "${a[@]}" \
        --repeat 3 --streams "$s" --context "$ctx" --cache-slots "$slots" --steps 32 --warmup 16 \
        --threads 15 --no-timeline --json > "$R/grid1/s$s-c$ctx-k$slots-$v.json" 2> "$R/grid1/s$s-c$ctx-k$slots-$v.log"
    echo "grid1 $c $v rc=$?" >> "$R/steps.txt"
  done
  pack
done
kill "$HOG"; wait "$HOG" 2>/dev/null
pgrep -af "ft serve" >> "$R/steps.txt"
pack
