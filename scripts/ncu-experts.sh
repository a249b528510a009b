#!/usr/bin/env bash
# Hardware counters of the batch-1 expert kernels on the GPU machine (Nsight Compute; works
# on the Firecracker runtime, not on gVisor): duration, DRAM throughput, achieved occupancy
# and launch statistics of ft_experts_gate_up_1 / ft_experts_down_1 for the int8 path, as
# `gpu_backend --reps 5` launches them (its second case; the first 22 launches are f32).
#
# Usage (on the GPU machine, carry/device/ carried): scripts/ncu-experts.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.." || exit
out=${1:?usage: scripts/ncu-experts.sh OUTDIR}
mkdir -p "$out"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [[ -z "$NCU" ]]; then
    echo "ncu not found" | tee "$out/ncu.txt"
    exit 0
fi
"$NCU" --clock-control none -k 'regex:ft_experts_.*_1$' --launch-skip 22 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    carry/device/gpu_backend --device cuda --reps 5 --out "$out/gb" >"$out/ncu.txt" 2>&1
echo "ncu rc=$?" >>"$out/ncu.txt"
