#!/usr/bin/env bash
# Layer split (llama.cpp's `--n-cpu-moe N`: N layers' experts on the CPU, the rest resident,
# or cached with fetched misses) measured by the engine on the GPU machine, for the model's
# prediction beside it (issue 41: N = 0, a quarter, half and all layers; model within 5% at
# the median). `analyze.sh` predicts each run from this machine's probe, locally.
#
# Usage (GPU machine, repository root, the cuda build of `ft` in $BIN):
#   BIN=carry/device OUT=... experiments/layer-split/run-device.sh
# Env: MODEL (qwen3.6-35b-a3b), CACHE_GB (the cached split's expert cache: 4 GiB, so that the
# GPU layers' experts do not all fit it), STREAMS ("1 4"), STEPS (48), ROUNDS (2), BUDGET_S (no
# run starts after it: 200 s), PROBE_S (the probe's budget: 30 s).
set -uo pipefail
BIN=${BIN:-carry/device}
MODEL=${MODEL:-qwen3.6-35b-a3b}
CACHE_GB=${CACHE_GB:-4}
STREAMS=${STREAMS:-1 4}
STEPS=${STEPS:-48}
ROUNDS=${ROUNDS:-2}
BUDGET_S=${BUDGET_S:-200}
PROBE_S=${PROBE_S:-30}
DEVICE=${DEVICE:-cuda}   # host: a smoke test on the host-emulated device
mkdir -p "$OUT/raw"
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$OUT/machine.txt" 2>&1
layers=$("$BIN/ft" model show "$MODEL" --json | jq -r '.model.geometry.moe_layers')
echo "model $MODEL, $layers MoE layers; cached split's cache $CACHE_GB GiB; streams $STREAMS; $STEPS steps" >> "$OUT/machine.txt"
FT_CACHE_DIR="$OUT/cache" timeout $(( PROBE_S + 60 )) "$BIN/ft" probe --device "$DEVICE" --model "$MODEL" --force \
    --budget-s "$PROBE_S" --profile-out "$OUT/profile.json" --json > "$OUT/raw/probe.json" 2> "$OUT/raw/probe.log"
echo "probe rc=$? at $SECONDS s" >> "$OUT/log.txt"
splits=(0 $(( layers / 4 )) $(( layers / 2 )) "$layers")
echo "split,cpu_layers,streams,round,json" > "$OUT/runs.csv"
for round in $(seq 1 "$ROUNDS"); do
  for s in $STREAMS; do
    for n in "${splits[@]}"; do
      for kind in layer-split layer-split-cached; do
        [[ "$kind" == layer-split-cached && "$n" == "$layers" ]] && continue
        if (( SECONDS > BUDGET_S )); then echo "budget ${BUDGET_S} s spent before round $round $kind:$n $s" >> "$OUT/log.txt"; break 4; fi
        cache=()
        [[ "$kind" == layer-split-cached ]] && cache=(--cache-gb "$CACHE_GB")
        tag="$kind-$n-s$s-r$round"
        timeout 120 "$BIN/ft" run --device "$DEVICE" --model "$MODEL" --strategy "$kind:$n" "${cache[@]}" \
            --streams "$s" --steps "$STEPS" --warmup 4 --json > "$OUT/raw/$tag.json" 2> "$OUT/raw/$tag.log"
        rc=$?
        echo "$tag rc=$rc at $SECONDS s" >> "$OUT/log.txt"
        (( rc == 0 )) && echo "$kind,$n,$s,$round,raw/$tag.json" >> "$OUT/runs.csv"
      done
    done
  done
done
