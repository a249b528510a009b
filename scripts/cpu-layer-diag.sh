#!/usr/bin/env bash
# Why `ft run` measures CPU-share layers slower than `ft probe`'s end-to-end runs of the same
# configuration (validate-h200, 2026-12-03: qwen3.8-flash-next, cpu strategy, 1 stream,
# 15 threads: about 550 us per layer in `ft run` at 2 layers, about 480 us in the probe's
# runs at 3 layers). Runs the same cpu/hybrid configuration at 2 and 3 layers, with and
# without timing events and with the pool parked, then the probe itself, one JSON each.
#
# Usage (GPU machine, carry/device/ carried): scripts/cpu-layer-diag.sh OUTDIR
set -uo pipefail
out="${1:?usage: scripts/cpu-layer-diag.sh OUTDIR}"
mkdir -p "$out"
FT="${FT:-carry/device/ft}"
common=(--device cuda --model qwen3.8-flash-next --streams 1 --threads 15 --cache-slots 64
        --context 1024 --steps 48 --warmup 8 --json)
run() { # name, extra args
    local name=$1; shift
    "$FT" run "${common[@]}" "$@" >"$out/$name.json" 2>"$out/$name.log" || echo "$name failed" >&2
}
run cpu-l2 --strategy cpu --layers 2
run cpu-l3 --strategy cpu --layers 3
run cpu-l3-notl --strategy cpu --layers 3 --no-timeline
run cpu-l3-park --strategy cpu --layers 3 --pool-wait park
run hybrid-l3 --strategy hybrid --fetch-fraction 0.4 --layers 3
run hybrid-l3-notl --strategy hybrid --fetch-fraction 0.4 --layers 3 --no-timeline
FT_CACHE_DIR="$out/cache" "$FT" probe --device cuda --model qwen3.8-flash-next --threads 15 --force \
    --profile-out "$out/probe-profile.json" --json >"$out/probe.json" 2>"$out/probe.log"
