#!/usr/bin/env bash
# validate-h200, is a run's CPU speed a property of its process? Model-free.
#
# The grid's tail is the level of each probe's CPU side against its runs minutes later
# (README, "The engine check on the GPU, and a slowdown beside the gather"), and the three
# rounds of one `cpu` run differ by 13 to 15% (median max/min) too. If each process drew
# its own speed (where its banks landed in physical memory: page sizes, the hypervisor's
# mapping) the spread between processes would exceed the spread between the rounds of one
# process, and the bank's allocation would be the remedy (both for the probe and the runs);
# if not, the machine moves under every process alike and only timing closer to the
# prediction helps. This runs, for each of FT_REPEAT_THREADS, FT_REPEAT_N `cpu` runs of the
# same work as separate processes back to back (each fills its own bank), then one process
# of FT_REPEAT_N rounds (`--repeat`), and repeat.py compares the two spreads (tok/s and the
# same-run STREAM read of the bank).
#
# Usage: repeat.sh OUT_DIR. Env: FT (the ft binary; default: built here), FT_DEVICE (default
# cuda), FT_REPEAT_MODEL (default bench-nvfp4), FT_REPEAT_THREADS (default "4 15"),
# FT_REPEAT_N (default 8), FT_REPEAT_STEPS (measured steps per run, default 48 after 24
# warm-up, as the grid), FT_REPEAT_LAYERS (default 2, as the grid). python3 only for the
# summary (run repeat.py OUT_DIR anywhere later).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: repeat.sh OUT_DIR}"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
resolve_ft
DEVICE="${FT_DEVICE:-cuda}"
G="${FT_REPEAT_MODEL:-bench-nvfp4}"
N="${FT_REPEAT_N:-8}"
STEPS="${FT_REPEAT_STEPS:-48}"
LAYERS="${FT_REPEAT_LAYERS:-2}"
mkdir -p "$OUT/runs"
write_env_txt "$OUT/env.txt" "validate-h200 repeat" "$0 $*" \
    "model $G, $LAYERS layers, $N processes and $N rounds at each of threads ${FT_REPEAT_THREADS:-4 15}, $STEPS steps after $(( STEPS / 2 )) warm-up each"
cat /sys/kernel/mm/transparent_hugepage/enabled >> "$OUT/env.txt" 2> /dev/null || true
common=(--model "$G" --layers "$LAYERS" --strategy cpu --streams 4 --steps "$STEPS"
    --warmup $(( STEPS / 2 )) --cache-slots 38 --device "$DEVICE" --json)
for t in ${FT_REPEAT_THREADS:-4 15}; do
    for i in $(seq 1 "$N"); do
        "$FT" run "${common[@]}" --threads "$t" > "$OUT/runs/proc-t$t-$i.json" \
            2> "$OUT/runs/proc-t$t-$i.log"
    done
    "$FT" run "${common[@]}" --threads "$t" --repeat "$N" > "$OUT/runs/one-t$t.json" \
        2> "$OUT/runs/one-t$t.log"
done
if command -v python3 > /dev/null; then
    python3 "$HERE/repeat.py" "$OUT" | tee "$OUT/summary.txt"
fi
