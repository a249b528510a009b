# shellcheck shell=bash
# Sourced by the experiments whose GPU half runs `ft run --layers N`: the layer-reduced model
# and the cache that keeps a full model's cache share, so that the runtime, the simulator
# and the model all describe the same run.
#
# runtime_model_and_cache FT OUT MODEL LAYERS HOST CACHE_GB
#   writes OUT/models/runtime.toml (MODEL with LAYERS of its MoE layers) and sets
#   GPU_SLOTS (the slots CACHE_GB holds of the whole model, as the same share of LAYERS
#   layers' experts) and SLOTS_FULL (those of the whole model).
runtime_model_and_cache() {
    local ft="$1" out="$2" model="$3" layers="$4" host="$5" cache_gb="$6"
    mkdir -p "$out/models"
    "$ft" validate model-file --model "$model" --layers "$layers" --out "$out/models/runtime.toml"
    local experts
    SLOTS_FULL=$("$ft" simulate --host "$host" --model "$model" --cache-gb "$cache_gb" \
        --streams 1 --strategy offload --steps 1 --warmup 0 --json | jq -r '.cache.slots')
    experts=$(sed -n 's/^experts = //p' "$out/models/runtime.toml")
    local model_layers
    model_layers=$("$ft" simulate --host "$host" --model "$model" --steps 1 --warmup 0 --streams 1 \
        --strategy offload --json | jq -r '.strategies[0].sim.layers')
    GPU_SLOTS=$(( (SLOTS_FULL * layers + model_layers / 2) / model_layers ))
    echo "runtime half: cache $GPU_SLOTS slots of $(( layers * experts )) experts ($SLOTS_FULL of $model_layers layers' at $cache_gb GiB)" >> "$out/env.txt"
}

# runtime_host FT OUT DEVICE PRESET BUDGET_S
#   sets SIM_HOST: a profile of this machine for OUT/models/runtime.toml (`ft probe`, at most
#   BUDGET_S seconds, written to OUT/profile.json), so that the simulator and the model
#   beside the runtime describe this host as fitted, not as a preset describes it (the
#   h200-xeon-emr preset's CPU side ran 20 to 60% fast for the runs of 2026-12-04); PRESET
#   where the probe fails (said in env.txt).
runtime_host() {
    local ft="$1" out="$2" device="$3" preset="$4" budget="$5"
    SIM_HOST="$preset"
    mkdir -p "$out/raw"
    if FT_CACHE_DIR="$out/cache" "$ft" probe --device "$device" --model "$out/models/runtime.toml" \
        --force --budget-s "$budget" --profile-out "$out/profile.json" --json \
        > "$out/raw/probe.json" 2> "$out/raw/probe.log"; then
        # shellcheck disable=SC2034 # SIM_HOST is read by the script that sources this file
        SIM_HOST="$out/profile.json"
        echo "runtime half: simulator and model on this machine's profile (ft probe: profile.json)" >> "$out/env.txt"
    else
        echo "runtime half: ft probe failed (raw/probe.log): simulator and model on the $preset preset" >> "$out/env.txt"
    fi
}

# runtime_run FT OUT NAME TAG ROW ARGS...
#   one `ft run ARGS --json` of the runtime half into OUT/raw/run.TAG.json, its log beside
#   it; on success ROW (when not empty) is appended to OUT/raw/runtime.csv, on failure the
#   document is removed and NAME says so on stderr. Always returns 0: one failed run does
#   not stop the half.
runtime_run() {
    local ft="$1" out="$2" name="$3" tag="$4" row="$5"
    shift 5
    if "$ft" run "$@" --json > "$out/raw/run.$tag.json" 2> "$out/raw/run.$tag.log"; then
        [[ -z "$row" ]] || echo "$row" >> "$out/raw/runtime.csv"
    else
        echo "$name: ft run $tag failed (raw/run.$tag.log)" >&2
        rm -f "$out/raw/run.$tag.json"
    fi
}
