#!/usr/bin/env bash
# Hardware counters of the expert kernels of one gpu_backend case on the GPU machine (Nsight
# Compute; works on the Firecracker runtime, not on gVisor): duration, DRAM throughput,
# occupancy, launch, warp-state and instruction statistics of the first two launches (gate/up
# and down) of the case CASE, by default the int8 one-token layer of 10 experts on the
# default path. `gpu_backend --only CASE` runs no other expert case, so the profiled launches
# are that case's whatever the table holds (until 2026-12-06 this script skipped a fixed 22
# launches, which by 2026-12-04 landed in the f32 case: results/20261204T2034Z-chunked/ncu.txt
# profiled the f32 path).
#
# Usage (on the GPU machine, carry/device/ carried): scripts/ncu-experts.sh OUTDIR [CASE]
# (CASE as gpu_backend's kernel table keys it: act/tokens/variant/path/experts).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
out=${1:?usage: scripts/ncu-experts.sh OUTDIR [CASE]}
case_key=${2:-int8/1/auto/staged+pdl+split+cvt+wide/10}
mkdir -p "$out"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [[ -z "$NCU" ]]; then
    echo "ncu not found" | tee "$out/ncu.txt"
    exit 0
fi
echo "case: $case_key" >"$out/ncu.txt"
"$NCU" --clock-control none -k 'regex:ft_experts_' --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    carry/device/gpu_backend --device cuda --reps 2 --only "$case_key" --out "$out/gb" >>"$out/ncu.txt" 2>&1
echo "ncu rc=$?" >>"$out/ncu.txt"
