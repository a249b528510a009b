#!/usr/bin/env bash
# validate-h200, re-analysed: the same measurements (the probes' samples and the grid's runs
# of a result folder), the current build's fitting and prediction. Runs anywhere (no GPU).
#
# 1. each probed profile (kept as profiles/<G>.probed.json) refitted from its own samples
#    (`ft validate refit`), then re-expressed at 4 and 15 threads (`ft validate retarget`);
# 2. every configuration of plan.csv that ran re-predicted (`ft predict --profile ...`, as
#    run.sh, with hybrid at the fraction its run used);
# 3. `ft validate collect`, `ft validate simulate`, `ft validate analyze`, `ft plot`.
#
# Usage: reanalyze.sh RESULT_DIR (a folder run.sh wrote: plan.csv, models/, profiles/,
# runs/). Env: FT, the ft binary (default: built here with `cargo build --release`).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
DIR="$(cd "${1:?usage: reanalyze.sh RESULT_DIR}" && pwd)"
# shellcheck source=../lib/ft-binary.sh
source "$HERE/../lib/ft-binary.sh"
resolve_ft
# A committed result folder keeps its raw runs in one archive, and its profiles in another.
if [[ ! -d "$DIR/runs" ]]; then
    for a in "$DIR/runs-predictions-probes.tar.xz" "$DIR/runs-predictions-probes.tar.gz"; do
        if [[ -f "$a" ]]; then
            tar -xf "$a" -C "$DIR"
            break
        fi
    done
fi
if [[ ! -d "$DIR/profiles" && -f "$DIR/profiles.tar.gz" ]]; then
    tar -xzf "$DIR/profiles.tar.gz" -C "$DIR"
fi
for g in qwen3.8-flash-next bench-nvfp4 deepseek-v4-flash; do
    [[ -f "$DIR/profiles/$g.json" ]] || continue
    [[ -f "$DIR/profiles/$g.probed.json" ]] || cp "$DIR/profiles/$g.json" "$DIR/profiles/$g.probed.json"
    "$FT" validate refit --profile "$DIR/profiles/$g.probed.json" --out "$DIR/profiles/$g.json"
    retarget_profiles "$FT" "$DIR" "$g"
done
repredict_grid "$FT" "$DIR"
# The simulator leg decodes the runs' steps too (every run of a grid has the same counts).
steps_of_runs "$FT" "$DIR"
analyse_grid "$FT" "$DIR" "$STEPS" "$WARMUP"
