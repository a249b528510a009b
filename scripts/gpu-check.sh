#!/usr/bin/env bash
# GPU check on the GPU machine (no cargo there): runs the prebuilt test executables, `ft bench
# bw` and the gpu-backend micro-bench carried from the build machine, writing results under
# OUTDIR. Build what it needs first (on the build machine): scripts/gpu-check.sh --build
#
# Usage: scripts/gpu-check.sh --build            (build machine: fills carry/device/)
#        scripts/gpu-check.sh OUTDIR [CARRY_DIR] (GPU machine: CARRY_DIR defaults to
#                                                 carry/device/; carry only that folder)
#
# Results (at most 8 files, so that they fit what comes back from a remote run):
#   summary.txt     machine fingerprint, one line per step with its exit code
#   tests.log       every test executable, GPU tests included (--include-ignored)
#   bench_bw.txt    `ft bench bw` table;  bench_bw.json  its --save report
#   gpu_backend.txt the micro-bench table; gpu_backend.json / gpu_backend.csv its records
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--build" ]]; then
    set -e
    C=carry/device
    mkdir -p "$C/tests"
    cargo build --release --features cuda -p ft-runtime --example gpu_backend
    cp target/release/examples/gpu_backend "$C/gpu_backend"
    rm -f "$C"/tests/*
    # The test executables of ft-runtime, found through cargo's JSON messages.
    cargo test --release --features cuda --no-run -p ft-runtime --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        t = m["target"]
        name = ("lib" if "lib" in t["kind"] else t["name"])
        dst = os.path.join("carry/device/tests", "ft_runtime-" + name)
        shutil.copy(m["executable"], dst)
        print("carried", dst)
'
    cargo build --release --features cuda
    cp target/release/ft "$C/ft"
    # The experiment scripts parse JSON with jq, which the GPU machine lacks: carry this
    # machine's jq with its two libraries (glibc here is older than there, so it runs).
    mkdir -p "$C/bin" "$C/lib"
    cp "$(command -v jq)" "$C/bin/jq"
    ldd "$(command -v jq)" | awk '/libjq|libonig/ {print $3}' | xargs -r -I{} cp -L {} "$C/lib/"
    # Debug info (line tables) is most of each file; the remote run carries at most 64 MiB.
    for f in "$C/ft" "$C/gpu_backend" "$C"/tests/*; do strip --strip-debug "$f"; done
    ls -la "$C" "$C/tests"
    exit 0
fi

OUT="${1:?usage: scripts/gpu-check.sh OUTDIR [CARRY_DIR] | --build}"
CARRY="${2:-carry/device}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

# Where libcuda and libnvrtc live on the GPU machine.
# shellcheck source=../experiments/lib/device-env.sh
source experiments/lib/device-env.sh
export RUST_BACKTRACE=1

{
    echo "== fingerprint"
    date -u
    nvidia-smi -L 2>&1 | head -4
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem --format=csv 2>&1 | head -3
    grep -m1 'model name' /proc/cpuinfo
    echo "cores: $(nproc)"
    "$CARRY/ft" --version 2>&1
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} >>"$SUMMARY" 2>&1

step() { # name, command...
    local name=$1
    shift
    local t0=$SECONDS
    "$@"
    local rc=$?
    echo "$name: rc=$rc ($((SECONDS - t0)) s)" >>"$SUMMARY"
    return 0
}

# Per-step limits, seconds (a hung step must not eat the remote run's time).
TEST_LIMIT=${TEST_LIMIT:-150}
BENCH_LIMIT=${BENCH_LIMIT:-150}

run_tests() { # the GPU-facing executables first
    for t in "$CARRY"/tests/ft_runtime-nvrtc "$CARRY"/tests/ft_runtime-device \
             "$CARRY"/tests/ft_runtime-experts "$CARRY"/tests/*; do
        [[ -x "$t" ]] || continue
        case " $done_tests " in *" $t "*) continue ;; esac
        done_tests="$done_tests $t"
        echo "===== $t"
        local skip=()
        if [[ $t == *multi_gpu* && $GPUS -lt 2 ]]; then
            # Its cuda twins need 2 or more GPUs; the host-emulated ones still run.
            echo "(skipping the cuda:: tests: $GPUS GPU(s) here, they need 2 or more)"
            skip=(--skip cuda:: --skip cuda_combine_reports_its_method)
        fi
        timeout "$TEST_LIMIT" "$t" --include-ignored --test-threads=1 "${skip[@]}" 2>&1
        echo "===== $t rc=$?"
    done
}
done_tests=""
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
step tests run_tests >"$OUT/tests.log" 2>&1
grep -E "^test result|FAILED|panicked|rc=" "$OUT/tests.log" >>"$SUMMARY"

step "gpu_backend" timeout "$BENCH_LIMIT" "$CARRY/gpu_backend" --device cuda --out "$OUT" >"$OUT/gpu_backend.txt" 2>&1
step "ft bench bw" timeout "$BENCH_LIMIT" "$CARRY/ft" bench bw --device cuda --save "$OUT/bench_bw.json" >"$OUT/bench_bw.txt" 2>&1
cat "$OUT/gpu_backend.txt" "$OUT/bench_bw.txt" >>"$SUMMARY" 2>/dev/null
echo "done" >>"$SUMMARY"
