#!/usr/bin/env bash
# One remote call on the GPU machine: run the named steps in order, each under its own time
# limit, and pack everything they wrote into $OUT/results.tar.gz (what comes back from a
# remote call is limited in file count and depth, so results travel as one archive).
#
# Usage (on the GPU machine, from the repository root, with carry/device/ carried):
#   OUT=... scripts/device-run.sh STEP[:LIMIT_S] ...
# Steps: gpu-check, bench (gpu_backend alone), cpu-kernels, runtime-grid, validate, serve-ab,
# diag, ncu, and exp-NAME for
# any experiments/NAME/run.sh OUTDIR (its GPU half runs where a CUDA device is usable).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
: "${OUT:?set OUT}"
R="$OUT/r"
mkdir -p "$R"
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 \
         /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
# jq and its libraries, carried by scripts/gpu-check.sh --build (the GPU machine has none).
[[ -d "$ROOT/carry/device/bin" ]] && PATH="$ROOT/carry/device/bin:$PATH"
[[ -d "$ROOT/carry/device/lib" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$ROOT/carry/device/lib"
export LD_LIBRARY_PATH PATH
export FT="$ROOT/carry/device/ft" FT_BIN="$ROOT/carry/device/ft"
log="$R/steps.txt"
echo "date: $(date -u +%FT%TZ)" >"$log"
for spec in "$@"; do
    name="${spec%%:*}"
    limit=600
    [[ "$spec" == *:* ]] && limit="${spec##*:}"
    t0=$SECONDS
    case "$name" in
    gpu-check) timeout "$limit" scripts/gpu-check.sh "$R/gpu-check" ;;
    cpu-kernels) FT_MACHINE=gpu-host-16c timeout "$limit" experiments/cpu-kernels/run.sh "$R/cpu-kernels" ;;
    runtime-grid) timeout "$limit" experiments/runtime-grid/run.sh "$R/runtime-grid" ;;
    validate) timeout "$limit" experiments/validate-h200/run.sh "$R/validate-h200" ;;
    serve-ab) OUT="$R/serve-ab" timeout "$limit" experiments/serve-ab/run.sh ;;
    diag) timeout "$limit" scripts/device-diag.sh "$R/diag" ;;
    ncu) timeout "$limit" scripts/ncu-experts.sh "$R/ncu" ;;
    bench) mkdir -p "$R/bench"; timeout "$limit" carry/device/gpu_backend --device cuda --out "$R/bench" ;;
    exp-*) timeout "$limit" "experiments/${name#exp-}/run.sh" "$R/${name#exp-}" ;;
    *) echo "unknown step $name" >&2; false ;;
    esac >"$R/$name.stdout" 2>"$R/$name.stderr"
    echo "$name: rc=$? ($((SECONDS - t0)) s, limit $limit)" >>"$log"
done
cat "$log"
tar -czf "$OUT/results.tar.gz" -C "$R" .
rm -rf "$R"
