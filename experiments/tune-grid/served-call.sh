#!/usr/bin/env bash
# One GPU call of the served-grid work (run from the repository root; carry/device/ft the cuda
# build under test, carry/tune-served.toml, carry/{flash,gptoss}-4l.toml as in the results
# folders). PHASE=all runs, in order:
#  1. numerics: `ft run --compare-numerics` of every strategy on CUDA against the reference;
#  2. an alternated A/B of the CPU-side variants against other builds, same traffic: AB_BINS is
#     a space-separated list of label=path (default: the runtime grid's build, carry/ab/ft);
#     round r runs the builds in the list's order, every second round reversed;
#  3. `ft tune` of this build's `ft serve` (TUNE_MODEL=flash|gptoss) over TUNE_STREAMS, with
#     the default 5-minute budget unless TUNE_S is set;
#  4. the served grid (served-grid.sh) on the rows of served-grid-configs.csv for GRID_MODEL
#     (default: the tuned model; all: every row; GRID_CONFIGS names another list) until the
#     call's BUDGET_S.
# PHASE=tune skips 1-2; PHASE=grid runs 4 only.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
: "${OUT:?}"; R="$OUT/r"; mkdir -p "$R"
# shellcheck source=../lib/device-env.sh
source "$ROOT/experiments/lib/device-env.sh"
export T0=$(date +%s)
FT="$ROOT/carry/device/ft"
export PACK_CMD='tar -C "$OUT" -czf "$OUT/results.tgz.tmp" r && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"'
pack() { eval "$PACK_CMD"; }
{ date -u; nvidia-smi -L; nproc; "$FT" --version; } > "$R/machine.txt" 2>&1
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
read -r -a BINS <<< "new=$FT ${AB_BINS:-old=$ROOT/carry/ab/ft}"
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  order=("${BINS[@]}")
  if (( round % 2 == 0 )); then
    order=(); for ((i = ${#BINS[@]} - 1; i >= 0; i--)); do order+=("${BINS[$i]}"); done
  fi
  for lb in "${order[@]}"; do
    label=${lb%%=*}; b=${lb#*=}
    { "$b" --version | head -2; } > "$R/ab-version-$label.txt" 2>&1
    timeout 60 "$b" run --device cuda --model qwen3.8-flash-next --layers 4 \
        --interleave "${AB_VARIANTS:-offload,h40=hybrid:0.4,cpu}" --repeat 2 --streams 2 --context 1024 \
        --cache-slots 410 --steps 48 --warmup 16 --threads 15 --no-timeline --json \
        > "$R/ab-r$round-$label.json" 2> "$R/ab-r$round-$label.log"
    echo "ab r$round $label rc=$? t=$(( $(date +%s) - T0 ))" >> "$R/steps.txt"
  done
done
pack
fi
TUNE_MODEL=${TUNE_MODEL:-flash}
model_of() {
  case $1 in flash) echo "qwen3.8-flash-next carry/flash-4l.toml 1.06,0.265";;
             gptoss) echo "gpt-oss-120b carry/gptoss-4l.toml 1.26,0.315";; esac
}
if [[ $PHASE != grid ]]; then
  read -r MODEL GEOM GB <<< "$(model_of "$TUNE_MODEL")"
  budget=(); [[ -n ${TUNE_S:-} ]] && budget=(--budget-s "$TUNE_S")
  t1=$(date +%s)
  timeout 330 "$FT" tune --template carry/tune-served.toml --model "$MODEL" --geometry "$GEOM" \
      --threads 15 --host "$R/host.toml" --cache-gb "$GB" --strategies offload,hybrid,cpu --fetch-fractions 0.3,0.6 \
      --streams "${TUNE_STREAMS:-2,4}" --prompt-tokens 1200 --output-tokens 256 --warmup 2 --measure decode \
      "${budget[@]}" --out "$R/tune-$TUNE_MODEL" --json \
      > "$R/tune-$TUNE_MODEL.json" 2> "$R/tune-$TUNE_MODEL.log"
  echo "tune $TUNE_MODEL rc=$? wall=$(( $(date +%s) - t1 )) t=$(( $(date +%s) - T0 ))" >> "$R/steps.txt"
  pkill -f "carry/device/ft serve" 2>/dev/null
  pack
fi
CONFIGS=${GRID_CONFIGS:-experiments/tune-grid/served-grid-configs.csv}
if [[ ${GRID_MODEL:-} == all ]]; then
  cp "$CONFIGS" "$R/configs.csv"
else
  read -r MODEL _ _ <<< "$(model_of "${GRID_MODEL:-$TUNE_MODEL}")"
  grep -E "^model|^$MODEL," "$CONFIGS" > "$R/configs.csv"
fi
read -r -a cpu0 < <(grep '^cpu ' /proc/stat)
FT="$FT" BUDGET_S=${BUDGET_S:-540} experiments/tune-grid/served-grid.sh "$R/configs.csv"
read -r -a cpu1 < <(grep '^cpu ' /proc/stat)
# The hypervisor's share of the machine's CPU time over the grid (/proc/stat: steal is the 8th
# field): the served CPU side is only this machine's own where it is near 0.
awk -v a="${cpu0[*]:1}" -v b="${cpu1[*]:1}" 'BEGIN { n = split(a, x); split(b, y); t = 0;
  for (i = 1; i <= n; i++) t += y[i] - x[i]; printf "grid steal fraction %.3f\n", (y[8] - x[8]) / t }' >> "$R/steps.txt"
echo "grid end t=$(( $(date +%s) - T0 ))" >> "$R/steps.txt"
pkill -f "carry/device/ft serve" 2>/dev/null
pack
