#!/usr/bin/env bash
# validate-h200, the machine's drift between a probe and the runs after it, model-free.
#
# The grid's CPU-heavy rows miss by more than the p90 target where the machine ran them at
# another speed than it ran their probe (diagnose.py, "the probe's own cpu blocks against
# the grid's cpu runs"). This measures that drift alone: `ft probe` of one geometry, then
# `cpu` runs of the same work (every expert on the CPU, context 1024, the probe's threads)
# back to back for FT_DRIFT_S seconds, in turn at the grid's layer count and streams (2
# layers, 1 and 4 streams) and at the probe's own layer count (1 stream), then a second
# probe. drift.py sets each run's time per layer against the first probe's end-to-end `cpu`
# blocks of the same streams and threads, over time, and the second probe's against the
# first's. No model is involved: what it shows bounds any profile's prediction of later runs.
#
# With FT_DRIFT_PREDICT_CHECK=1 (the default), each round of the three runs starts with the
# check `ft predict --cpu-check` takes against the first probe's profile (in a process of its
# own, on a bank it fills: `checks/<i>-predict.json`); drift.py sets it against the next
# run's own check (its engine's, before its first round). The run of 2026-12-05T16:47Z
# (results/20261205T1647Z-h100-drift) compared two banks for that check here.
#
# Usage: drift.sh OUT_DIR. Env: FT (the ft binary; default: built here), FT_DEVICE (default
# cuda), FT_DRIFT_MODEL (default qwen3.8-flash-next), FT_DRIFT_THREADS (default cores - 1),
# FT_DRIFT_S (default 180), FT_DRIFT_STEPS (measured steps per run, default 48 after 24
# warm-up, as the grid), FT_DRIFT_PREDICT_CHECK (default 1). Needs python3.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: drift.sh OUT_DIR}"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
resolve_ft
DEVICE="${FT_DEVICE:-cuda}"
G="${FT_DRIFT_MODEL:-qwen3.8-flash-next}"
T="${FT_DRIFT_THREADS:-$(( $(nproc) - 1 ))}"
DUR="${FT_DRIFT_S:-180}"
STEPS="${FT_DRIFT_STEPS:-48}"
mkdir -p "$OUT/runs" "$OUT/logs" "$OUT/checks"
write_env_txt "$OUT/env.txt" "validate-h200 drift" "$0 $*" \
    "model $G, $T threads, runs for $DUR s, $STEPS steps after $(( STEPS / 2 )) warm-up each"
now() { date +%s.%N; }
T0=$(now)
elapsed() { python3 -c "print(f'{$(now) - $T0:.2f}')"; }
probe() { # N
    local t; t=$(elapsed)
    "$FT" probe --device "$DEVICE" --model "$G" --force --threads "$T" \
        --profile-out "$OUT/probe-$1.profile.json" --json > "$OUT/probe-$1.json" 2> "$OUT/logs/probe-$1.log"
    echo "probe-$1,$t,$(elapsed)" >> "$OUT/probes.csv"
}
echo "probe,start_s,end_s" > "$OUT/probes.csv"
echo "run,start_s,end_s,layers,streams" > "$OUT/runs.csv"
probe 1
predict_check() { # I NAME PROFILE
    "$FT" predict --profile "$3" --model "$G" --streams 1 --context 1024 --cache-slots 16 \
        --cpu-check "$DEVICE" --json > "$OUT/checks/$1-$2.json" 2>> "$OUT/logs/checks.log" || true
}
i=0
start=$SECONDS
while (( SECONDS - start < DUR )); do
    if [[ "${FT_DRIFT_PREDICT_CHECK:-1}" == 1 ]]; then
        predict_check "$i" predict "$OUT/probe-1.profile.json"
    fi
    for variant in "2 1" "3 1" "2 4"; do
        read -r layers streams <<< "$variant"
        t=$(elapsed)
        "$FT" run --device "$DEVICE" --model "$G" --layers "$layers" --streams "$streams" \
            --context 1024 --strategy cpu --threads "$T" --cache-slots 16 \
            --steps "$STEPS" --warmup $(( STEPS / 2 )) --json \
            > "$OUT/runs/$i.json" 2>> "$OUT/logs/runs.log"
        echo "$i,$t,$(elapsed),$layers,$streams" >> "$OUT/runs.csv"
        i=$(( i + 1 ))
    done
done
probe 2
python3 "$HERE/drift.py" "$OUT" | tee "$OUT/summary.txt"
