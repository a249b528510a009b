#!/usr/bin/env bash
# validate-h200, what if the model had known the machine's CPU ceiling at run time: the runs
# of a result folder re-predicted with the CPU side of each configuration's profile at the
# speed its runs' same-run STREAM read gives against its probe's (`ft predict --cpu-speed
# RUN/PROBE`, the run's `cpu.stream_read_gbs` over `probes/<G>.json`'s
# `outcome.stream_read_gbs`; both `ft_kernels::stream::read_window` of the served bank with
# the same threads). Only configurations at the probe's thread count have both readings; the
# others are predicted as reanalyze.sh predicts them. A diagnostic, never a result: if the
# 15-thread errors shrink here, the machine's drift between probe and run is what they
# measure, and a ceiling read at prediction time (`ft serve`'s start) is the remedy.
#
# Usage: whatif-ceiling.sh RESULT_DIR OUT_DIR (OUT_DIR: a new folder; RESULT_DIR is copied
# there first). Env: FT, the ft binary (default: built here). Needs python3.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
SRC="${1:?usage: whatif-ceiling.sh RESULT_DIR OUT_DIR}"
OUT="${2:?usage: whatif-ceiling.sh RESULT_DIR OUT_DIR}"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
resolve_ft
[[ -e "$OUT" ]] && { echo "whatif-ceiling: $OUT exists; give a new folder" >&2; exit 2; }
cp -r "$SRC" "$OUT"
FT="$FT" "$HERE/reanalyze.sh" "$OUT" > "$OUT/summary-refit.txt"

# DIR CONFIG GEOMETRY THREADS: `--cpu-speed RUN/PROBE` where the configuration's hybrid run
# and its geometry's probe both read the ceiling at these threads, else nothing.
cpu_speed_of() {
    python3 - "$@" <<'EOF'
import json, sys
from pathlib import Path
d, config, geometry, threads = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    probe = json.loads((d / "probes" / f"{geometry}.json").read_text())["outcome"]
    run = json.loads((d / "runs" / f"{config}-hybrid.json").read_text())
except (OSError, ValueError, KeyError):
    sys.exit(0)
cpu = run.get("cpu") or {}
if probe.get("threads") == threads and cpu.get("threads") == threads \
        and probe.get("stream_read_gbs") and cpu.get("stream_read_gbs"):
    print(f"--cpu-speed {cpu['stream_read_gbs'] / probe['stream_read_gbs']:.6f}")
EOF
}

repredict_grid "$FT" "$OUT" cpu_speed_of
steps_of_runs "$FT" "$OUT"
analyse_grid "$FT" "$OUT" "$STEPS" "$WARMUP" > /dev/null
scaled=$(grep -l '"source": ".*CPU side at' "$OUT"/predictions/*.json 2> /dev/null | wc -l)
{
    echo "what if: each configuration at the probe's threads predicted with its CPU side at its runs' STREAM read over its probe's ($scaled configuration(s) had both readings), on the runs of $SRC"
    cat "$OUT/summary.txt"
} > "$OUT/summary-whatif.txt"
cat "$OUT/summary-whatif.txt"
