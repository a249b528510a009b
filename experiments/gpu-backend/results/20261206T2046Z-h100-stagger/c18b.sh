#!/usr/bin/env bash
# Staggered tile requests (952cf42): GPU tests, bench A/B, engine A/B. Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xzf carry/dz4/device.tgz -C carry
C=carry/device
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; done
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
  nv=$(find /usr/local /opt -name 'libnvrtc.so.1*' -print -quit 2>/dev/null)
  [[ -n "$nv" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nv")"; fi
export LD_LIBRARY_PATH RUST_BACKTRACE=1 LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/$C/lib" PATH="$PWD/$C/bin:$PATH"
S=$OUT/steps.txt; : > $S
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,clocks.sm,clocks.mem --format=csv; grep -m1 'model name' /proc/cpuinfo; nproc; $C/ft --version; } > $OUT/machine.txt 2>&1
step() { local n=$1; shift; local t=$SECONDS; "$@"; echo "$n rc=$? ${SECONDS}s (+$((SECONDS-t)))" >> $S; }
T=$C/tests/ft_runtime-experts
step tests-int8 timeout 90 env FT_TEST_PATHS=stagger $T --ignored --nocapture --test-threads 1 cuda_int8_path > $OUT/tests-int8.log 2>&1
step tests-f32 timeout 60 env FT_TEST_PATHS=stagger $T --ignored --nocapture --test-threads 1 cuda_f32_path cuda_empty > $OUT/tests-f32.log 2>&1
D=staged+pdl+split+cvt+wide
K=int8/1/auto/$D/10,int8/1/auto/$D+stagger1/10,int8/1/auto/$D+stagger2/10,int8/1/auto/$D+stagger3/10,int8/1/auto/$D+stagger5/10,int8/1/auto/$D+chain+cross/10,int8/1/auto/$D+chain+cross+stagger2/10,int8/1/auto/$D+chain+cross+stagger3/10,int8/1/auto/$D/1,int8/1/auto/$D+stagger2/1
B=$OUT/bench; mkdir -p $B
for i in 1 2 3; do step bench$i timeout 60 $C/gpu_backend --device cuda --only $K --out $B/run$i > $B/run$i.txt 2>&1; done
step stamps timeout 60 $C/gpu_backend --device cuda --only $K --stamps --out $B/stamps > $B/stamps.txt 2>&1
step compare python3 experiments/gpu-backend/bench_ab.py $B --base run > $B/compare.txt 2>&1
cat $B/compare.txt
if [[ $SECONDS -gt 150 ]]; then echo "skip engine at ${SECONDS}s" >> $S; exit 0; fi
A="--model qwen3.8-flash-next --layers 12 --steps 32 --warmup 8 --context 1024 --threads 15 --json --cache-slots 1536 --repeat 1"
mkdir -p $OUT/off1
for i in 1 2 3; do for st in 0 3; do
  if [[ $st == 0 ]]; then E="env -u FT_CUDA_STAGGER_US"; else E="env FT_CUDA_STAGGER_US=$st"; fi
  step off-r$i-s$st timeout 60 $E $C/ft run --device cuda $A --strategy offload --streams 1 > $OUT/off1/b1-r$i-s$st.json 2> $OUT/off1/b1-r$i-s$st.err
done; done
step engine-compare python3 experiments/runtime-grid/switch_ab.py $OUT/off1 --base s0 > $OUT/off1-compare.txt 2>&1
cat $OUT/off1-compare.txt $S
tar cJf $OUT/bench-csv.tar.xz --exclude='*.txt' -C $OUT bench 2>/dev/null
