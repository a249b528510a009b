# shellcheck shell=bash
# Sourced by run.sh (the experiment) and reanalyze.sh (the same measurements, this build's
# fitting): the steps both take on a result folder.

# The grid's CPU thread counts: each geometry's profile is re-expressed at each.
GRID_THREAD_COUNTS=(4 15)

# retarget_profiles FT DIR G: profiles/G-t<T>.json from profiles/G.json for every grid
# thread count (`ft validate retarget`).
retarget_profiles() {
    local ft="$1" dir="$2" g="$3" t
    for t in "${GRID_THREAD_COUNTS[@]}"; do
        "$ft" validate retarget --profile "$dir/profiles/$g.json" --threads "$t" --out "$dir/profiles/$g-t$t.json"
    done
}

# analyse_grid FT DIR STEPS WARMUP: grid.csv from the runs and predictions, the simulator
# on the same profiles (issue #6: simulated_tok_s), summary.txt / summary.json and the plot
# of predicted against measured.
analyse_grid() {
    local ft="$1" dir="$2" steps="$3" warmup="$4"
    "$ft" validate collect --dir "$dir" --out "$dir/grid.csv"
    "$ft" validate simulate --dir "$dir" --steps "$steps" --warmup "$warmup"
    "$ft" validate analyze "$dir/grid.csv" --out "$dir/summary.json" | tee "$dir/summary.txt"
    plot_grid "$ft" "$dir"
}

# plot_grid FT DIR: pred-vs-measured.svg (predicted against measured, y = x drawn) from
# DIR/grid.csv, its summary in plot.txt.
plot_grid() {
    local ft="$1" dir="$2"
    "$ft" plot "$dir/grid.csv" --x measured_tok_s --y predicted_tok_s --series strategy --diagonal \
        --log-x --log-y --title "validate-h200: predicted against measured decode tok/s" \
        --xlabel "measured tok/s (all streams)" --ylabel "predicted tok/s (all streams)" \
        --out "$dir/pred-vs-measured.svg" > "$dir/plot.txt" \
        || echo "validate-h200: ft plot failed; the CSV is complete" >&2
}

# repredict_grid FT DIR [EXTRA_FN]: predictions/<config>.json again for every configuration of
# plan.csv whose runs exist, from profiles/<G>-t<T>.json (as run.sh predicts, but with hybrid
# at the fraction its run used: the prediction must describe the run that was measured).
# EXTRA_FN, a shell function called with DIR CONFIG GEOMETRY THREADS, prints further
# `ft predict` arguments for that configuration (a what-if), or nothing. A configuration the
# grid predicted with a CPU check is predicted again at the same speed (`--cpu-speed`; the
# check itself cannot be taken again), unless EXTRA_FN gives arguments: the speed its hybrid
# run decided its fraction at (`auto_cpu_speed`, FT_CPU_CHECK=engine), else the prediction's
# own check (`cpu_check.speed`, FT_CPU_CHECK=predict).
repredict_grid() {
    local ft="$1" dir="$2" extra_fn="${3:-}" config geometry layers model_toml residency cache_slots streams threads context
    local run_doc f_run steps warmup seed extra speed
    mkdir -p "$dir/predictions"
    # shellcheck disable=SC2034 # every column of plan.csv is named, not all are used here
    while IFS=, read -r config geometry layers model_toml residency cache_slots streams threads context; do
        [[ -f "$dir/runs/$config-hybrid.json" ]] || continue
        # Hybrid predicted at the fraction its run used (the first fit's choice), not at the
        # refitted model's own optimum: the prediction must describe the run that was measured.
        # The traffic simulation counts the steps the runs decoded, of the routing they decoded
        # (their reports say which).
        run_doc="$dir/runs/$config-hybrid.json"
        f_run=$("$ft" validate get "$run_doc" /fetch_fraction)
        steps=$("$ft" validate get "$run_doc" /summary/steps)
        warmup=$("$ft" validate get "$run_doc" /summary/warmup_steps)
        seed=$("$ft" validate get "$run_doc" /seed)
        extra=()
        if [[ -n "$extra_fn" ]]; then
            read -r -a extra < <("$extra_fn" "$dir" "$config" "$geometry" "$threads") || true
        fi
        if (( ${#extra[@]} == 0 )); then
            speed=$("$ft" validate get "$run_doc" /auto_cpu_speed 2> /dev/null || true)
            if [[ -z "$speed" || "$speed" == null ]] && [[ -f "$dir/predictions/$config.json" ]]; then
                speed=$("$ft" validate get "$dir/predictions/$config.json" /cpu_check/speed 2> /dev/null || true)
            fi
            [[ -n "$speed" && "$speed" != null ]] && extra=(--cpu-speed "$speed")
        fi
        "$ft" predict --profile "$dir/profiles/$geometry-t$threads.json" --model "$dir/$model_toml" \
            --streams "$streams" --context "$context" --cache-slots "$cache_slots" \
            --steps "$steps" --warmup "$warmup" --seed "$seed" \
            --fetch-fraction "$f_run" "${extra[@]}" --json < /dev/null > "$dir/predictions/$config.json"
    done < <(tail -n +2 "$dir/plan.csv")
}

# steps_of_runs FT DIR: STEPS and WARMUP (globals) of the grid's runs (every run has the same).
steps_of_runs() {
    local ft="$1" dir="$2" doc
    doc=$(ls "$dir"/runs/*-hybrid.json 2> /dev/null | head -1)
    [[ -n "$doc" ]] || { echo "validate-h200: no run to re-analyse in $dir" >&2; return 1; }
    # shellcheck disable=SC2034 # STEPS and WARMUP are read by the scripts that source this file
    STEPS=$("$ft" validate get "$doc" /summary/steps)
    # shellcheck disable=SC2034
    WARMUP=$("$ft" validate get "$doc" /summary/warmup_steps)
}
