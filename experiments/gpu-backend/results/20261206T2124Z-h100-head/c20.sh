#!/usr/bin/env bash
# The bench's main cases stamped (block timelines), with the --out fix.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xzf carry/dz6/gb.tgz -C carry
C=carry/device
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; done
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
  nv=$(find /usr/local /opt -name 'libnvrtc.so.1*' -print -quit 2>/dev/null)
  [[ -n "$nv" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nv")"; fi
export RUST_BACKTRACE=1 LD_LIBRARY_PATH
{ date -u; nvidia-smi -L; } > $OUT/machine.txt 2>&1
D=staged+pdl+split+cvt+wide
K=int8/1/auto/$D/10,int8/1/auto/$D+chain/10,int8/1/auto/$D+cross/10,int8/1/auto/$D+chain+cross/10,int8/0/auto/$D/10,int8/0/auto/$D+chain/10,int8/1/auto/$D/1
timeout 90 $C/gpu_backend --device cuda --only $K --stamps --out $OUT/s/stamps > $OUT/stamps.txt 2>&1; echo "stamps rc=$?" > $OUT/steps.txt
tar cJf $OUT/stamps.tar.xz -C $OUT/s stamps && rm -rf $OUT/s
cat $OUT/steps.txt; tail -12 $OUT/stamps.txt
