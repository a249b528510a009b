#!/usr/bin/env bash
# validate-h200, what if: the grid of a result folder predicted again with a CPU serving
# slowdown *assumed* at some thread counts, to see how much of the errors at those counts the
# slowdown accounts for. A diagnostic, never a result: the assumed values come from the
# command line, not from a probe (since 2026-12-04 `ft probe --slowdown-threads` measures the
# slowdown at a second thread count; a folder probed before that has it at the serving count
# only, and the model then carried that count's slowdown to every count).
#
# 1. a copy of RESULT_DIR is re-analysed (reanalyze.sh: profiles refitted from their samples);
# 2. each refitted profile gets `cpu_serving_slowdown_at` = the given THREADS:SLOWDOWN pairs
#    (the serving count's own fitted slowdown is kept), is re-expressed at the grid's thread
#    counts, and every configuration is predicted again and analysed (summary.txt).
#
# Usage: whatif-slowdown.sh RESULT_DIR OUT_DIR THREADS:SLOWDOWN [THREADS:SLOWDOWN ...]
#   e.g. whatif-slowdown.sh results/20261204T2046Z /tmp/whatif 4:0
# Env: FT, the ft binary (default: built here with `cargo build --release`). Needs python3.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
SRC="${1:?usage: whatif-slowdown.sh RESULT_DIR OUT_DIR THREADS:SLOWDOWN ...}"
OUT="${2:?usage: whatif-slowdown.sh RESULT_DIR OUT_DIR THREADS:SLOWDOWN ...}"
shift 2
(( $# > 0 )) || { echo "whatif-slowdown: give at least one THREADS:SLOWDOWN" >&2; exit 2; }
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
resolve_ft
[[ -e "$OUT" ]] && { echo "whatif-slowdown: $OUT exists; give a new folder" >&2; exit 2; }
cp -r "$SRC" "$OUT"
FT="$FT" "$HERE/reanalyze.sh" "$OUT" > "$OUT/summary-refit.txt"
for g in qwen3.8-flash-next bench-nvfp4 deepseek-v4-flash; do
    [[ -f "$OUT/profiles/$g.json" ]] || continue
    python3 - "$OUT/profiles/$g.json" "$@" <<'EOF'
import json, sys
path, pairs = sys.argv[1], sys.argv[2:]
doc = json.load(open(path))
at = []
for p in pairs:
    t, s = p.split(":")
    at.append({"threads": int(t), "slowdown": float(s), "se": 0.0})
doc["params"]["cpu_serving_slowdown_at"] = sorted(at, key=lambda k: k["threads"])
json.dump(doc, open(path, "w"), indent=2)
EOF
    retarget_profiles "$FT" "$OUT" "$g"
done
repredict_grid "$FT" "$OUT"
steps_of_runs "$FT" "$OUT"
analyse_grid "$FT" "$OUT" "$STEPS" "$WARMUP" > /dev/null
{
    echo "what if: cpu_serving_slowdown_at = $* (assumed, not probed), on the runs of $SRC"
    cat "$OUT/summary.txt"
} > "$OUT/summary-whatif.txt"
cat "$OUT/summary-whatif.txt"
