#!/usr/bin/env bash
# replot.sh: redraw every committed figure that `ft plot` draws, from the CSV committed
# beside it, with this build's `ft plot` (after a change to the figures, so that the
# committed plots show what the command draws today).
#
# Each experiment's own run.sh draws its figures (FT_PLOT_ONLY=1 redraws them from a
# results folder's tables alone), at the size the folder was run at (its env.txt says
# "(quick)" or "(full)"); validate-h200's grids are drawn by common.sh's plot_grid. Only
# figures already there are redrawn (one the script draws beside them is removed again:
# the tree keeps the figures it kept); a folder whose tables an older script wrote (other
# columns) keeps its figures as they are, and is named on stderr.
#
# Usage: experiments/replot.sh. Env: FT (the ft binary; default target/release/ft, built
# when missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
FT="${FT:-}"
if [[ -z "$FT" ]]; then
    FT="$root/target/release/ft"
    [[ -x "$FT" ]] || (cd "$root" && cargo build --release --quiet)
fi
FT="$(cd "$(dirname "$FT")" && pwd)/$(basename "$FT")"
export FT NO_COLOR=1
failed=()

# redraw DIR CMD...: run CMD, then remove the SVGs in DIR it added.
redraw() {
    local dir="$1" before svg
    shift
    before="$(ls "$dir"/*.svg 2>/dev/null || true)"
    if ! "$@" > /dev/null; then
        failed+=("$dir")
        echo "replot: $dir: a figure failed (its tables are an older script's); the committed one stays" >&2
    fi
    for svg in "$dir"/*.svg; do
        grep -qxF "$svg" <<< "$before" || rm -f "$svg"
    done
}

for run in "$here"/*/run.sh; do
    grep -q FT_PLOT_ONLY "$run" || continue
    exp="$(dirname "$run")"
    for dir in "$exp/results" "$exp"/results/*/; do
        dir="${dir%/}"
        compgen -G "$dir/*.svg" > /dev/null || continue
        quick=0
        head -1 "$dir/env.txt" 2>/dev/null | grep -q "(quick" && quick=1
        echo "replot: $(basename "$exp") ${dir#"$exp"/}" >&2
        redraw "$dir" env FT_PLOT_ONLY=1 FT_QUICK="$quick" FT_GPU=0 bash "$run" "$dir"
    done
done
# host-submit runs pool-wait's script with its own knob.
for dir in "$here"/host-submit/results/*/; do
    compgen -G "$dir/*.svg" > /dev/null || continue
    echo "replot: host-submit ${dir#"$here"/host-submit/}" >&2
    redraw "${dir%/}" env FT_PLOT_ONLY=1 bash "$here/host-submit/run.sh" "${dir%/}"
done
# shellcheck source=validate-h200/common.sh
source "$here/validate-h200/common.sh"
while IFS= read -r svg; do
    dir="$(dirname "$svg")"
    [[ -f "$dir/grid.csv" ]] || continue
    echo "replot: validate-h200 ${dir#"$here"/validate-h200/}" >&2
    kept_summary=0
    [[ -f "$dir/plot.txt" ]] && kept_summary=1
    plot_grid "$FT" "$dir"
    [[ "$kept_summary" == 1 ]] || rm -f "$dir/plot.txt"
done < <(find "$here/validate-h200" -name pred-vs-measured.svg | sort)
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "replot: ${#failed[@]} folder(s) with a figure not redrawn: ${failed[*]}" >&2
fi
