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
    local full_layers experts
    full_layers=$("$ft" simulate --host "$host" --model "$model" --cache-gb "$cache_gb" \
        --streams 1 --strategy offload --steps 1 --warmup 0 --json | jq -r '.cache.slots')
    SLOTS_FULL="$full_layers"
    experts=$(sed -n 's/^experts = //p' "$out/models/runtime.toml")
    local model_layers
    model_layers=$("$ft" simulate --host "$host" --model "$model" --steps 1 --warmup 0 --streams 1 \
        --strategy offload --json | jq -r '.strategies[0].sim.layers')
    GPU_SLOTS=$(( (SLOTS_FULL * layers + model_layers / 2) / model_layers ))
    echo "runtime half: cache $GPU_SLOTS slots of $(( layers * experts )) experts ($SLOTS_FULL of $model_layers layers' at $cache_gb GiB)" >> "$out/env.txt"
}
