#!/usr/bin/env bash
# Call C: ft tune on the GPU against the grid's ft serve build, as it is and handicapped
# (taskset to 4 of 16 cores with 15 threads + a DRAM co-runner on cores 4-7).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
: "${OUT:?}"; R="$OUT/r"; mkdir -p "$R"
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 \
         /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH
FT="$ROOT/carry/device/ft"
pack() { tar -C "$OUT" -czf "$OUT/results.tgz.tmp" r && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
"$FT" host init > "$R/host.toml" 2> "$R/host-init.log"; echo "host init rc=$?" >> "$R/steps.txt"
TUNE_S="${TUNE_S:-160}"
for eng in handicap normal; do
  if [[ $eng == handicap ]]; then
    taskset -c 4-7 python3 -c '
import numpy as np
a = np.ones(2**27); b = np.empty_like(a)
while True: np.copyto(b, a)' > /dev/null 2>&1 &
    HOG=$!
  fi
  timeout $(( TUNE_S + 60 )) "$FT" tune --template "carry/tune-$eng.toml" --model qwen3.8-flash-next \
      --geometry carry/flash-4l.toml --threads 15 --cache-gb 1.06 \
      --strategies offload,hybrid,cpu --fetch-fractions 0.3,0.6 --streams 2 \
      --prompt-tokens 1200 --output-tokens 256 --warmup 2 --measure client-e2e \
      --budget-s "$TUNE_S" --out "$R/tune-$eng" --json > "$R/tune-$eng.json" 2> "$R/tune-$eng.log"
  echo "tune $eng rc=$?" >> "$R/steps.txt"
  [[ $eng == handicap ]] && { kill "$HOG"; wait "$HOG" 2>/dev/null; }
  pack
done
pgrep -af "ft serve" >> "$R/steps.txt"
pack
