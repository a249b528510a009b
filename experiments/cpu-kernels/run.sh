#!/usr/bin/env bash
# Rebuild ft and reproduce the CPU expert-kernel benchmark (`ft bench cpu`): the expert step's
# weight GB/s against STREAM read with the same threads, over formats x geometries x tokens
# per expert x experts per call x threads x activation path.
#
# Usage: experiments/cpu-kernels/run.sh OUTPUT_DIR [extra `ft bench cpu` flags]
# Writes into OUTPUT_DIR: results-<machine>.json, results-<machine>.csv, table-<machine>.txt
# and machine-<machine>.txt (experiments/lib/env-txt.sh's fingerprint, then lscpu). No other steps.
# Environment: FT_BIN=path (or FT, as `ft experiment run` sets it) uses a prebuilt ft instead of building; FT_MACHINE=name overrides
# <machine> (default: <logical CPUs>c-<CPU model>).
set -euo pipefail
out="${1:?usage: $0 OUTPUT_DIR [extra ft bench cpu flags]}"
shift
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=../lib/env-txt.sh
source "$root/experiments/lib/env-txt.sh"
mkdir -p "$out"
FT_BIN="${FT_BIN:-${FT:-}}"
if [[ -n "${FT_BIN:-}" ]]; then
    ft="$FT_BIN"
else
    (cd "$root" && cargo build --release --bin ft)
    ft="$root/target/release/ft"
fi
model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | tr -cs 'A-Za-z0-9' '-' | sed 's/^-//; s/-$//' | tr 'A-Z' 'a-z')"
machine="${FT_MACHINE:-$(nproc)c-${model:-unknown}}"
FT="$ft" write_env_txt "$out/machine-$machine.txt" cpu-kernels "$0 $out $*" "$(lscpu)"
# Default grid: both issue geometries, all formats and paths, tokens 1,2,4,8, experts
# 1,4,10,32, threads 1 and all. 100 ms (at least 3 calls) per configuration keeps a 2-core
# run under about 5 minutes.
"$ft" bench cpu \
    --min-time-ms 100 --min-repeats 3 \
    --save-json "$out/results-$machine.json" \
    --save-csv "$out/results-$machine.csv" \
    "$@" | tee "$out/table-$machine.txt"
echo "wrote $out/results-$machine.{json,csv}, table-$machine.txt, machine-$machine.txt" >&2
