#!/usr/bin/env bash
# The served-grid call (run from the repository root with carry/device/ft the cuda build,
# carry/ab/ft the runtime grid's build, carry/tune-served.toml and carry/flash-4l.toml as in
# results/h100-20261207T2217Z-served-grid/): numerics of every strategy on CUDA against the
# reference; alternated A/B against the runtime grid's build (carry/ab/ft, feecf97); ft tune of
# this build's ft serve (flash-next, as it is) over streams 2,4 and caches of 20% and 5%; then
# the served grid (experiments/tune-grid/served-grid.sh) until the call's budget.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
: "${OUT:?}"; R="$OUT/r"; mkdir -p "$R"
# shellcheck source=../lib/device-env.sh
source "$ROOT/experiments/lib/device-env.sh"
export T0=$(date +%s)
FT="$ROOT/carry/device/ft"; OLD="$ROOT/carry/ab/ft"
export PACK_CMD='tar -C "$OUT" -czf "$OUT/results.tgz.tmp" r && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"'
pack() { eval "$PACK_CMD"; }
{ date -u; nvidia-smi -L; nproc; "$FT" --version; "$OLD" --version; } > "$R/machine.txt" 2>&1
PHASE=${PHASE:-all}
"$FT" host init > "$R/host.toml" 2> "$R/host-init.log"; echo "host init rc=$?" >> "$R/steps.txt"
if [[ $PHASE == all ]]; then
for s in offload hybrid cpu resident layer-split:2 layer-split-cached:2; do
  extra=(); [[ $s == hybrid ]] && extra=(--fetch-fraction 0.5)
  [[ $s != resident && $s != layer-split:2 ]] && extra+=(--cache-slots 410)
  timeout 40 "$FT" run --device cuda --model qwen3.8-flash-next --layers 4 --strategy "$s" "${extra[@]}" \
      --streams 2 --steps 8 --warmup 4 --threads 15 --compare-numerics --no-timeline --json \
      > "$R/numerics-${s//:/_}.json" 2> "$R/numerics-${s//:/_}.log"
  echo "numerics $s rc=$? t=$(( $(date +%s) - T0 ))" >> "$R/steps.txt"
done
for round in $(seq 1 ${AB_ROUNDS:-2}); do
  for side in new old; do
    [[ $round == 2 ]] && side=$([[ $side == new ]] && echo old || echo new)
    b=$FT; [[ $side == old ]] && b=$OLD
    timeout 40 "$b" run --device cuda --model qwen3.8-flash-next --layers 4 \
        --interleave offload,h40=hybrid:0.4,cpu --repeat 2 --streams 2 --context 1024 --cache-slots 410 \
        --steps 48 --warmup 16 --threads 15 --no-timeline --json > "$R/ab-r$round-$side.json" 2> "$R/ab-r$round-$side.log"
    echo "ab r$round $side rc=$? t=$(( $(date +%s) - T0 ))" >> "$R/steps.txt"
  done
done
pack
fi
TUNE_MODEL=${TUNE_MODEL:-flash}
case $TUNE_MODEL in flash) MODEL=qwen3.8-flash-next; GEOM=carry/flash-4l.toml; GB=1.06,0.265;;
                    gptoss) MODEL=gpt-oss-120b; GEOM=carry/gptoss-4l.toml; GB=1.26,0.315;; esac
t1=$(date +%s)
timeout 200 "$FT" tune --template carry/tune-served.toml --model "$MODEL" --geometry "$GEOM" \
    --threads 15 --host "$R/host.toml" --cache-gb "$GB" --strategies offload,hybrid,cpu --fetch-fractions 0.3,0.6 \
    --streams 2,4 --prompt-tokens 1200 --output-tokens 256 --warmup 2 --measure decode \
    --max-runs 10 --budget-s "${TUNE_S:-150}" --out "$R/tune-$TUNE_MODEL" --json \
    > "$R/tune-$TUNE_MODEL.json" 2> "$R/tune-$TUNE_MODEL.log"
echo "tune $TUNE_MODEL rc=$? wall=$(( $(date +%s) - t1 )) t=$(( $(date +%s) - T0 ))" >> "$R/steps.txt"
pkill -f "carry/device/ft serve" 2>/dev/null
pack
grep -E "^model|^$MODEL," experiments/tune-grid/served-grid-configs.csv > "$R/configs.csv"
FT="$FT" BUDGET_S=${BUDGET_S:-540} experiments/tune-grid/served-grid.sh "$R/configs.csv"
echo "grid end t=$(( $(date +%s) - T0 ))" >> "$R/steps.txt"
pkill -f "carry/device/ft serve" 2>/dev/null
pack
