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
# there first). Env: FT, the ft binary (default: built here); FT_WHATIF_SPEED=check scales
# by the CPU check instead (the run's `cpu.cpu_check` against the profile's `cpu_checks`:
# the CPU side's own work timed, at every thread count the probe checked; grids from
# 2026-12-05T14Z on); FT_WHATIF_SPEED=first-check by the check before the run's first round only
# (`cpu_check_rounds_us[0]`, what FT_CPU_CHECK=engine predicts with, before any measured
# step); FT_WHATIF_SPEED=probe predicts from the probes alone (`--cpu-speed 1`,
# undoing a grid's own check). Needs python3.
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

# DIR CONFIG GEOMETRY THREADS: `--cpu-speed X` for the configuration, else nothing. With
# FT_WHATIF_SPEED=stream (the default), X is its hybrid run's STREAM read over its probe's,
# where both read at these threads; with FT_WHATIF_SPEED=check, the profile's CPU check over
# the run's check of the same work (`cpu.cpu_check`, taken before each round; the profile
# holds one per thread count the probe ran), the CPU side's own speed.
cpu_speed_of() {
    python3 - "$HERE" "$@" <<'EOF'
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from diagnose import check_speed  # the same folder as this script
d, config, geometry, threads = Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
mode = os.environ.get("FT_WHATIF_SPEED", "stream")
if mode == "probe":
    print("--cpu-speed 1")
    sys.exit(0)
try:
    run = json.loads((d / "runs" / f"{config}-hybrid.json").read_text())
    cpu = run.get("cpu") or {}
    if mode in ("check", "first-check"):
        refs = json.loads((d / "profiles" / f"{geometry}.json").read_text()).get("cpu_checks", [])
    else:
        probe = json.loads((d / "probes" / f"{geometry}.json").read_text())["outcome"]
except (OSError, ValueError, KeyError, TypeError):
    sys.exit(0)
if mode in ("check", "first-check"):
    speed = check_speed(run, refs, first_round=mode == "first-check")
    if speed:
        print(f"--cpu-speed {speed:.6f}")
elif probe.get("threads") == threads and cpu.get("threads") == threads \
        and probe.get("stream_read_gbs") and cpu.get("stream_read_gbs"):
    print(f"--cpu-speed {cpu['stream_read_gbs'] / probe['stream_read_gbs']:.6f}")
EOF
}

repredict_grid "$FT" "$OUT" cpu_speed_of
steps_of_runs "$FT" "$OUT"
analyse_grid "$FT" "$OUT" "$STEPS" "$WARMUP" > /dev/null
scaled=$({ grep -l '"source": ".*CPU side at' "$OUT"/predictions/*.json 2> /dev/null || true; } | wc -l)
{
    if [[ "${FT_WHATIF_SPEED:-stream}" == probe ]]; then
        echo "what if: each configuration predicted from its probe alone (the CPU side at the probed speed), on the runs of $SRC"
    elif [[ "${FT_WHATIF_SPEED:-stream}" == first-check ]]; then
        echo "what if: each configuration predicted with its CPU side at the CPU check before its runs' first round against its profile's ($scaled configuration(s) had both), on the runs of $SRC"
    elif [[ "${FT_WHATIF_SPEED:-stream}" == check ]]; then
        echo "what if: each configuration predicted with its CPU side at its runs' CPU check against its profile's ($scaled configuration(s) had both), on the runs of $SRC"
    else
        echo "what if: each configuration at the probe's threads predicted with its CPU side at its runs' STREAM read over its probe's ($scaled configuration(s) had both readings), on the runs of $SRC"
    fi
    cat "$OUT/summary.txt"
} > "$OUT/summary-whatif.txt"
cat "$OUT/summary-whatif.txt"
