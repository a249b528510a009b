#!/usr/bin/env bash
# ratio-vs-model: how often does the legacy bandwidth-ratio rule pick the slower strategy,
# what does it cost, and how do the analytic model's picks compare? (simulator)
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs (fewer models, streams and caches, fewer
# steps). Needs bash, jq and python3 (standard library only).
#
# Method: for every host preset, the legacy rule's verdict and fetch fraction come from
# `ft predict` (the host's bench pair at the engine's tuning geometry). For every model
# preset on that host, three expert caches (a quarter, a half and all of what the GPU holds
# at 16 streams) and 1 to 16 streams, `ft simulate --sweep` runs offload and hybrid at the
# model's optimum fetch fraction with the analytic model beside it (--with-model), and
# hybrid at the legacy fraction. analyze.py scores both rules against the simulated
# timeline: a rule is wrong where the strategy it picks is over 1% slower than the other
# one, and its regret is the best simulated tok/s over what its pick achieves, minus 1.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
resolve_ft
QUICK="${FT_QUICK:-0}"

HOSTS=(rtx4090-2x-xeon4310 rtxpro4000-gen3-epyc7302 gh200 h200-xeon-emr)
if [[ "$QUICK" == 1 ]]; then
    MODELS=(qwen3.8-flash-next gpt-oss-120b glm-4.7)
    STREAMS=1,4
    SHARES=(0.25 1)
    STEPS=24 WARMUP=32
else
    MODELS=(qwen3.8-flash-next qwen3.6-35b-a3b deepseek-v4-flash gpt-oss-120b gemma-4-26b-a4b minimax-m2.5 glm-4.7 bench-nvfp4)
    STREAMS=1,2,4,8,16
    SHARES=(0.25 0.5 1)
    STEPS=64 WARMUP=256
fi
# The cache is sized for the largest stream count (its KV cache leaves the least memory) and
# kept fixed over the stream counts, so that more streams means more distinct experts.
MAX_STREAMS="${STREAMS##*,}"

if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
rm -f "$OUT/raw/gpu_slots.csv"
write_env_txt "$OUT/env.txt" "ratio-vs-model ($(run_size))" "$0 $*" \
    "hosts: ${HOSTS[*]}" \
    "models: ${MODELS[*]}" \
    "streams: $STREAMS; cache shares of what the GPU holds: ${SHARES[*]}; steps $STEPS after $WARMUP warm-up"

for host in "${HOSTS[@]}"; do
    # The legacy rule on this host (independent of the served model: it is measured at the
    # engine's tuning geometry).
    "$FT" predict --host "$host" --model "${MODELS[0]}" --steps 1 --warmup 0 --json \
        | jq -c '.prediction.legacy' > "$OUT/raw/$host.legacy.json"
    legacy_f=$(jq -r '.fetch_fraction' "$OUT/raw/$host.legacy.json")
    for model in "${MODELS[@]}"; do
        echo "ratio-vs-model: $host / $model" >&2
        gpu_slots=$("$FT" simulate --host "$host" --model "$model" --streams "$MAX_STREAMS" \
            --strategy offload --steps 1 --warmup 0 --json | jq -r '.cache.slots')
        slots=""
        for s in "${SHARES[@]}"; do
            n=$(python3 -c "import sys; print(max(1, int(float(sys.argv[1]) * int(sys.argv[2]))))" "$s" "$gpu_slots")
            slots="${slots:+$slots,}$n"
        done
        "$FT" simulate --host "$host" --model "$model" --sweep "streams=$STREAMS" \
            --sweep "cache-slots=$slots" --strategy offload,hybrid --fetch-fraction auto \
            --with-model --steps "$STEPS" --warmup "$WARMUP" --out "$OUT/raw/$host.$model.model.csv"
        "$FT" simulate --host "$host" --model "$model" --sweep "streams=$STREAMS" \
            --sweep "cache-slots=$slots" --strategy hybrid --fetch-fraction "$legacy_f" \
            --steps "$STEPS" --warmup "$WARMUP" --out "$OUT/raw/$host.$model.legacy.csv"
        echo "$host,$model,$gpu_slots" >> "$OUT/raw/gpu_slots.csv"
    done
done

python3 "$HERE/analyze.py" "$OUT"
fi
"$FT" plot "$OUT/regret.csv" -o "$OUT/regret-cdf.svg" --kind cdf --x regret_pct --series rule \
    --title "Regret of each rule over all configurations (simulated)" \
    --xlabel "regret: best tok/s over the pick's tok/s, minus 1 (%)" > /dev/null
"$FT" plot "$OUT/regret.csv" -o "$OUT/regret-histogram.svg" --kind histogram --x regret_pct \
    --series rule --bins 20 --title "Regret distribution (simulated)" \
    --xlabel "regret (%)" > /dev/null
"$FT" plot "$OUT/decisions.csv" -o "$OUT/regret-by-streams.svg" --kind scatter --x streams \
    --y ratio_regret_pct --series host --log-x \
    --title "Legacy ratio rule: regret by stream count and host" --ylabel "regret (%)" > /dev/null
echo "ratio-vs-model: results in $OUT" >&2
