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
if [[ -z "${FT:-}" ]]; then
    (cd "$HERE/../.." && cargo build --release --quiet)
    FT="$HERE/../../target/release/ft"
fi
# A committed result folder keeps its raw runs in one archive.
if [[ ! -d "$DIR/runs" && -f "$DIR/runs-predictions-probes.tar.gz" ]]; then
    tar -xzf "$DIR/runs-predictions-probes.tar.gz" -C "$DIR"
fi
for g in qwen3.8-flash-next bench-nvfp4 deepseek-v4-flash; do
    [[ -f "$DIR/profiles/$g.json" ]] || continue
    [[ -f "$DIR/profiles/$g.probed.json" ]] || cp "$DIR/profiles/$g.json" "$DIR/profiles/$g.probed.json"
    "$FT" validate refit --profile "$DIR/profiles/$g.probed.json" --out "$DIR/profiles/$g.json"
    retarget_profiles "$FT" "$DIR" "$g"
done
mkdir -p "$DIR/predictions"
while IFS=, read -r config geometry layers model_toml residency cache_slots streams threads context; do
    [[ -f "$DIR/runs/$config-hybrid.json" ]] || continue
    # Hybrid predicted at the fraction its run used (the first fit's choice), not at the
    # refitted model's own optimum: the prediction must describe the run that was measured.
    # The traffic simulation counts the steps the runs decoded, of the routing they decoded
    # (their reports say which).
    run_doc="$DIR/runs/$config-hybrid.json"
    f_run=$("$FT" validate get "$run_doc" fetch_fraction)
    STEPS=$("$FT" validate get "$run_doc" summary.steps)
    WARMUP=$("$FT" validate get "$run_doc" summary.warmup_steps)
    seed=$("$FT" validate get "$run_doc" seed)
    "$FT" predict --profile "$DIR/profiles/$geometry-t$threads.json" --model "$DIR/$model_toml" \
        --streams "$streams" --context "$context" --cache-slots "$cache_slots" \
        --steps "$STEPS" --warmup "$WARMUP" --seed "$seed" \
        --fetch-fraction "$f_run" --json < /dev/null > "$DIR/predictions/$config.json"
done < <(tail -n +2 "$DIR/plan.csv")
# The simulator leg decodes the runs' steps too (every run of a grid has the same counts).
analyse_grid "$FT" "$DIR" "${STEPS:?no run to re-analyse}" "$WARMUP"
