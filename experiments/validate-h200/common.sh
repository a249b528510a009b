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
    "$ft" plot "$dir/grid.csv" --x measured_tok_s --y predicted_tok_s --series strategy --diagonal \
        --log-x --log-y --title "validate-h200: predicted against measured decode tok/s" \
        --xlabel "measured tok/s (all streams)" --ylabel "predicted tok/s (all streams)" \
        --out "$dir/pred-vs-measured.svg" > "$dir/plot.txt" \
        || echo "validate-h200: ft plot failed; the CSV is complete" >&2
}
