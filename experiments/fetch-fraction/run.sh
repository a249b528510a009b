#!/usr/bin/env bash
# fetch-fraction: hybrid's decode tok/s across fetch fractions 0 to 1 at 1, 2 and 8 streams,
# with the analytic model's optimum and the bandwidth-split rule's choice marked.
#
# Usage: run.sh OUTDIR. Env: FT_PLOT_ONLY=1 redraws the plots from OUTDIR's tables alone;
# FT = the ft binary (built with `cargo build --release` when
# unset), FT_QUICK=1 for the reduced size CI runs, FT_GPU=0 to skip the runtime half even
# where a GPU is usable. Needs bash, jq and python3 (standard library only).
#
# Simulator half: the field report's host and model with its cache (offload misses 38% at 2
# streams); `ft simulate --strategy hybrid --sweep fetch-fraction=0,...,1` at 1, 2 and 8
# streams (with --with-model in the full run, for the model's curve), and hybrid with
# `--fetch-fraction auto` for the model's optimum at each stream count. The split rules
# come from the same run's legacy view: the reference engine's p/(p+c) on the contended
# bench pair (the field report's 27.7%), and p/(p+c) on the standalone pair.
# Runtime half (GPU machine): `ft run --strategy hybrid --fetch-fraction F` over the same
# grid on h200-xeon-emr's cache of 16 GiB, and the simulator of that host beside it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw"
if [[ -z "${FT:-}" ]]; then
    features=()
    command -v nvidia-smi > /dev/null && features=(--features cuda)
    (cd "$HERE/../.." && cargo build --release --quiet "${features[@]}")
    FT="$HERE/../../target/release/ft"
fi
QUICK="${FT_QUICK:-0}"
HOST=rtx4090-2x-xeon4310
MODEL=qwen3.8-flash-next
GPU_HOST=h200-xeon-emr
GPU_CACHE_GB=16
STREAMS=1,2,8
if [[ "$QUICK" == 1 ]]; then
    GRID=0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1 STEPS=24 WARMUP=32 WITH_MODEL=()
else
    GRID=0,0.05,0.1,0.15,0.2,0.25,0.3,0.35,0.4,0.45,0.5,0.55,0.6,0.65,0.7,0.75,0.8,0.85,0.9,0.95,1
    STEPS=128 WARMUP=256 WITH_MODEL=(--with-model)
fi
gpu_usable() {
    [[ "${FT_GPU:-auto}" != 0 ]] && "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'
}
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
{
    echo "experiment: fetch-fraction ($([[ "$QUICK" == 1 ]] && echo quick || echo full))"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores visible)"
    "$FT" --version
    echo "host: $HOST; model: $MODEL; streams: $STREAMS; fetch fractions: $GRID; steps $STEPS after $WARMUP warm-up"
} > "$OUT/env.txt"

sim_half() { # HOST OUTNAME [cache flags...]: the grid, the optimum and the legacy view
    local host="$1" name="$2"
    shift 2
    "$FT" simulate --host "$host" --model "$MODEL" "$@" --strategy hybrid --sweep "streams=$STREAMS" \
        --sweep "fetch-fraction=$GRID" "${WITH_MODEL[@]}" --steps "$STEPS" --warmup "$WARMUP" \
        --out "$OUT/raw/grid.$name.csv"
    "$FT" simulate --host "$host" --model "$MODEL" "$@" --strategy offload,hybrid --fetch-fraction auto \
        --streams "$STREAMS" --steps "$STEPS" --warmup "$WARMUP" --json > "$OUT/raw/auto.$name.json"
    # Hybrid at exactly the two split rules' fractions: p/(p+c) on the contended bench pair
    # (the reference engine's) and on the standalone pair.
    local contended standalone
    contended=$(jq -r '.[0].legacy.fetch_fraction' "$OUT/raw/auto.$name.json")
    standalone=$(jq -r '.[0].legacy | .pcie_gather_gbs / (.pcie_gather_gbs + .cpu_moe_gbs)' "$OUT/raw/auto.$name.json")
    "$FT" simulate --host "$host" --model "$MODEL" "$@" --strategy hybrid --sweep "streams=$STREAMS" \
        --sweep "fetch-fraction=$contended,$standalone" --steps "$STEPS" --warmup "$WARMUP" \
        --out "$OUT/raw/split.$name.csv"
    echo "$host" > "$OUT/host.$name.txt"
}
echo "fetch-fraction: simulating $HOST" >&2
sim_half "$HOST" field

rm -f "$OUT/raw/runtime.csv"
if gpu_usable; then
    if "$FT" run --help 2> /dev/null | grep -q -- '--fetch-fraction'; then
        echo "fetch-fraction: simulating $GPU_HOST for the runtime half" >&2
        sim_half "$GPU_HOST" gpu --cache-gb "$GPU_CACHE_GB"
        echo "streams,fetch_fraction,json" > "$OUT/raw/runtime.csv"
        IFS=, read -ra bs <<< "$STREAMS"
        IFS=, read -ra fs <<< "$GRID"
        for b in "${bs[@]}"; do
            for f in "${fs[@]}"; do
                echo "fetch-fraction: ft run hybrid f=$f at $b stream(s)" >&2
                "$FT" run --model "$MODEL" --strategy hybrid --fetch-fraction "$f" --streams "$b" \
                    --cache-gb "$GPU_CACHE_GB" --steps "$STEPS" --warmup "$WARMUP" --json \
                    > "$OUT/raw/run.$b.$f.json"
                echo "$b,$f,run.$b.$f.json" >> "$OUT/raw/runtime.csv"
            done
        done
    else
        echo "runtime half skipped: this ft has no 'ft run --fetch-fraction'" | tee "$OUT/runtime-skipped.txt" >&2
    fi
else
    echo "runtime half skipped: no usable CUDA device (or FT_GPU=0)" > "$OUT/runtime-skipped.txt"
fi

python3 "$HERE/analyze.py" "$OUT"
fi
for name in field gpu; do
    [[ -f "$OUT/fetch-fraction.$name.csv" ]] || continue
    ycols=sim_tok_s_total
    [[ "$QUICK" != 1 ]] && ycols=sim_tok_s_total,model_tok_s_total
    [[ "$name" == gpu ]] && ycols=measured_tok_s_total,sim_tok_s_total
    host=$(cat "$OUT/host.$name.txt")
    # marks.NAME.txt: "STREAMS VALUE:LABEL" per line (the split rules carry every stream count).
    all_marks=()
    for b in ${STREAMS//,/ }; do
        mark_args=()
        while read -r mb m; do
            [[ "$mb" == "$b" ]] && mark_args+=(--mark-x "$m")
        done < "$OUT/marks.$name.txt"
        all_marks+=("${mark_args[@]}")
        "$FT" plot "$OUT/fetch-fraction.$name.csv" -o "$OUT/tok-s-$name-$b-streams.svg" --kind line \
            --x fetch_fraction --y "$ycols" --series streams --where "n_streams=$b" "${mark_args[@]}" --legend upper-right \
            --title "Hybrid tok/s against fetch fraction, $b stream(s), $host" \
            --xlabel "fetch fraction (share of each layer's misses gathered)" \
            --ylabel "tok/s over all streams" > /dev/null
    done
done
echo "fetch-fraction: results in $OUT" >&2
