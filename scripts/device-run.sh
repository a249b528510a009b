#!/usr/bin/env bash
# One remote call on the GPU machine: run the named steps in order, each under its own time
# limit, and pack everything they wrote into $OUT/results.tar.gz (what comes back from a
# remote call is limited in file count and depth, so results travel as one archive), again
# after each step: a call the device's time limit ends keeps what its finished steps wrote.
#
# Usage (on the GPU machine, from the repository root, with carry/device/ carried):
#   OUT=... scripts/device-run.sh STEP[:LIMIT_S] ...
# Steps: gpu-check, gpu-tests (only the GPU tests: every carried test binary with --ignored, or
# those matching the glob FT_GPU_TESTS, e.g. 'ft_runtime-experts'),
# bench (gpu_backend alone), cpu-kernels, runtime-grid, runtime-grid@VAR=VALUE (the grid with
# one switch set, e.g. runtime-grid@FT_CUDA_EXPERT_VARIANT=2:170, compared with a runtime-grid
# step run before it in the same call; runtime-grid@old: the grid by carry/ab/ft, the binary
# before a change without a switch, as the base that plain grid is compared against),
# validate, drift (experiments/validate-h200/drift.sh), serve-ab, diag, cpu-diag
# (scripts/cpu-layer-diag.sh), ab (scripts/binary-ab.sh: carry/ab/ft against carry/device/ft),
# ncu, and exp-NAME for
# any experiments/NAME/run.sh OUTDIR (its GPU half runs where a CUDA device is usable).
# An exp-NAME step runs its simulator half at CI's size (FT_QUICK=1 unless FT_QUICK is set:
# that half runs anywhere) and its GPU half at its bounded default (FT_GPU_QUICK, FT_LAYERS:
# see each run.sh), and gets FT_GPU_BUDGET_S = LIMIT - LIMIT/10 - 15 unless it is set: no
# GPU-half measurement starts after that, so the step ends inside its limit with its
# analysis written instead of being killed. Five of them fit one call, e.g.
#   FT_QUICK=1 OUT=$OUT scripts/device-run.sh exp-expert-size:110 exp-concurrency:95 \
#       exp-contention:50 exp-cache-history:105 exp-fetch-fraction:125
# (485 s of limits; 194 s measured on the H200 machine, 2026-12-04: 45 + 38 + 14 + 42 + 54,
# before concurrency, cache-history and fetch-fraction probed the machine first: about 20 s
# each more). A runtime-grid step needs about 150 s with FT_QUICK=1 (90 s cut it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
ROOT=$PWD
: "${OUT:?set OUT}"
R="$OUT/r"
mkdir -p "$R"
# shellcheck source=../experiments/lib/device-env.sh
source "$ROOT/experiments/lib/device-env.sh"
# jq and its libraries, carried by scripts/gpu-check.sh --build (the GPU machine has none).
[[ -d "$ROOT/carry/device/bin" ]] && PATH="$ROOT/carry/device/bin:$PATH"
[[ -d "$ROOT/carry/device/lib" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$ROOT/carry/device/lib"
export LD_LIBRARY_PATH PATH
export FT="$ROOT/carry/device/ft" FT_BIN="$ROOT/carry/device/ft"
log="$R/steps.txt"
# The validation grid into FT_VALIDATE_OUT when set (a folder of the working tree: it travels
# with it, so FT_RESUME=1 can continue a run cut by its budget in an earlier call), else a
# fresh folder; either way the results come back as validate-h200/.
validate_step() { # limit
    local out="${FT_VALIDATE_OUT:-$R/validate-h200}" rc
    timeout "$1" experiments/validate-h200/run.sh "$out"
    rc=$?
    [[ "$out" != "$R/validate-h200" ]] && cp -r "$out" "$R/validate-h200"
    return "$rc"
}
# The runtime grid with one switch set (runtime-grid@VAR=VALUE), into
# runtime-grid-<var>-<value>/, or by the binary before a change (runtime-grid@old), into
# runtime-grid-old/; either is compared point by point with the plain runtime-grid step of
# the same call where one ran before it (compare.txt beside its grid).
runtime_grid_with() { # VAR=VALUE or old, limit
    local sw="$1" limit="$2" dir rc base new
    local -a envs
    if [[ "$sw" == old ]]; then
        # The grid by the binary before a change that has no switch (carry/ab/ft), compared
        # as the base of the plain grid of the same call.
        dir="$R/runtime-grid-old"
        envs=(FT="$ROOT/carry/ab/ft" FT_BIN="$ROOT/carry/ab/ft")
        base="$dir" new="$R/runtime-grid"
    elif [[ "$sw" =~ ^FT_[A-Z0-9_]+=[A-Za-z0-9._-]+$ ]]; then
        dir="$R/runtime-grid-$(echo "${sw,,}" | tr '=_' '--')"
        envs=("$sw")
        base="$R/runtime-grid" new="$dir"
    else
        echo "runtime-grid@$sw: give one switch, e.g. runtime-grid@FT_CUDA_EXPERT_VARIANT=2, or old" >&2
        return 2
    fi
    env "${envs[@]}" FT_GPU_BUDGET_S="${FT_GPU_BUDGET_S:-$(( limit - limit / 10 - 40 ))}" \
        timeout "$limit" experiments/runtime-grid/run.sh "$dir"
    rc=$?
    if [[ -f "$R/runtime-grid/grid.csv" && -f "$dir/grid.csv" ]]; then
        python3 experiments/runtime-grid/compare.py "$base" "$new" > "$dir/compare.txt"
        cat "$dir/compare.txt"
    fi
    return "$rc"
}
echo "date: $(date -u +%FT%TZ)" >"$log"
# The machine's CPU time split once a second (the /proc/stat "cpu" line: user nice system
# idle iowait irq softirq steal ...), so that stalls in a step can be told apart: steal time
# is the VM's vCPUs taken away by the host, not this process's threads.
(while sleep 1; do echo "$(date +%s) $(head -1 /proc/stat)"; done) >"$R/procstat.txt" 2>/dev/null &
sampler=$!
for spec in "$@"; do
    name="${spec%%:*}"
    limit=600
    [[ "$spec" == *:* ]] && limit="${spec##*:}"
    t0=$SECONDS
    case "$name" in
    gpu-check) timeout "$limit" scripts/gpu-check.sh "$R/gpu-check" ;;
    cpu-kernels) FT_MACHINE=gpu-host-16c timeout "$limit" experiments/cpu-kernels/run.sh "$R/cpu-kernels" ;;
    runtime-grid) FT_GPU_BUDGET_S="${FT_GPU_BUDGET_S:-$(( limit - limit / 10 - 40 ))}" \
        timeout "$limit" experiments/runtime-grid/run.sh "$R/runtime-grid" ;;
    runtime-grid@*) runtime_grid_with "${name#runtime-grid@}" "$limit" ;;
    validate) validate_step "$limit" ;;
    drift) timeout "$limit" experiments/validate-h200/drift.sh "$R/drift" ;;
    serve-ab) timeout "$limit" experiments/serve-ab/run.sh "$R/serve-ab" ;;
    diag) timeout "$limit" scripts/device-diag.sh "$R/diag" ;;
    cpu-diag) timeout "$limit" scripts/cpu-layer-diag.sh "$R/cpu-diag" ;;
    ab) timeout "$limit" scripts/binary-ab.sh "$R/ab" "$ROOT/carry/ab/ft" "$FT" ;;
    gpu-tests)
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
        for t in carry/device/tests/${FT_GPU_TESTS:-*}; do
            skip=()
            [[ $t == *multi_gpu* && $gpus -lt 2 ]] && skip=(--skip cuda:: --skip cuda_combine_reports_its_method)
            echo "===== $t"
            timeout "$limit" "$t" --ignored --test-threads=1 "${skip[@]}" 2>&1
            echo "===== $t rc=$?"
        done ;;
    ncu) timeout "$limit" scripts/ncu-experts.sh "$R/ncu" ;;
    bench) mkdir -p "$R/bench"; timeout "$limit" carry/device/gpu_backend --device cuda --out "$R/bench" ;;
    exp-*) FT_QUICK="${FT_QUICK:-1}" FT_GPU_BUDGET_S="${FT_GPU_BUDGET_S:-$(( limit - limit / 10 - 15 ))}" \
        timeout "$limit" "experiments/${name#exp-}/run.sh" "$R/${name#exp-}" ;;
    *) echo "unknown step $name" >&2; false ;;
    esac >"$R/$name.stdout" 2>"$R/$name.stderr"
    echo "$name: rc=$? ($((SECONDS - t0)) s, limit $limit)" >>"$log"
    # Packed after every step, so that a call cut by its own time limit still brings back
    # the steps that finished (2026-12-06: a call that packed only at its end lost them all).
    tar -czf "$OUT/results.tar.gz" -C "$R" .
done
kill "$sampler" 2>/dev/null
cat "$log"
tar -czf "$OUT/results.tar.gz" -C "$R" .
rm -rf "$R"
