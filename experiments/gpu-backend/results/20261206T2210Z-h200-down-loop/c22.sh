#!/usr/bin/env bash
# Down's split-sign loop (7baf1bc): every expert GPU test, bench A/B before/after, timelines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xzf carry/dz7/device.tgz -C carry
C=carry/device
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; done
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
  nv=$(find /usr/local /opt -name 'libnvrtc.so.1*' -print -quit 2>/dev/null)
  [[ -n "$nv" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nv")"; fi
export RUST_BACKTRACE=1 LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/$C/lib" PATH="$PWD/$C/bin:$PATH"
W=$OUT/w; mkdir -p $W
S=$OUT/steps.txt; : > $S
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; $C/ft --version; } > $OUT/machine.txt 2>&1
step() { local n=$1; shift; local t=$SECONDS; "$@"; echo "$n rc=$? ${SECONDS}s (+$((SECONDS-t)))" >> $S; }
step tests-all timeout 120 $C/tests/ft_runtime-experts --ignored --nocapture --test-threads 1 > $OUT/tests.log 2>&1
D=staged+pdl+split+cvt+wide
K=int8/1/auto/$D/10,int8/1/auto/$D+chain/10,int8/1/auto/$D+cross/10,int8/1/auto/$D+chain+cross/10,int8/1/auto/$D+short/10,int8/1/auto/$D+fused/10,int8/0/auto/$D/10,int8/1/auto/$D/1,int8/1/auto/$D/2,int8/1/auto/$D+cross/1,int8/4/auto/staged+pdl+cvt+wide/10
for i in 1 2 3; do
  step before$i timeout 60 $C/gpu_backend.before --device cuda --only $K --out $W/before$i > $W/before$i.txt 2>&1
  step after$i timeout 60 $C/gpu_backend --device cuda --only $K --out $W/after$i > $W/after$i.txt 2>&1
done
step compare python3 experiments/gpu-backend/bench_ab.py $W --base before > $OUT/compare.txt 2>&1
cat $OUT/compare.txt
step stamps timeout 60 $C/gpu_backend --device cuda --only int8/1/auto/$D/10,int8/1/auto/$D+cross/10,int8/1/auto/$D+chain+cross/10 --stamps --out $W/stamps > $W/stamps.txt 2>&1
cp $W/stamps.txt $OUT/stamps.txt
tar cJf $OUT/all.tar.xz -C $W .
cat $S; tail -3 $OUT/tests.log
