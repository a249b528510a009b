#!/usr/bin/env bash
# validate-h200: the acceptance of the performance model on the GPU machine.
#
# 1. `ft probe` once per expert geometry (the fit sees the probes alone, never the grid);
# 2. a grid of 48 configurations (`ft validate plan`: geometry x cache residency x streams x
#    CPU threads x context), each strategy run end to end in one process (`ft run
#    --interleave`, one report per strategy): offload, hybrid at the model's fetch fraction,
#    hybrid at the ratio rule's (ferrox-core's) fraction, cpu, in rounds (the median round
#    reported); each configuration predicted by the model (`ft predict --profile ... --json`)
#    from its probe's profile and the CPU check taken before its first round (FT_CPU_CHECK);
# 3. `ft validate collect` (grid.csv), `ft validate simulate` (the discrete-event simulator
#    on the same profiles, grid.csv's simulated_tok_s), `ft validate analyze` (summary.txt /
#    summary.json), `ft plot` (predicted against measured).
#
# Usage: run.sh OUTDIR. Env:
#   FT               the ft binary (default: carry/ft of the repository, built here with
#                    `cargo build --release --features cuda && mkdir -p carry && cp target/release/ft carry/`;
#                    the GPU machine has no Rust toolchain)
#   FT_QUICK=1       12 configurations (one per geometry and stream count), 8 steps
#   FT_DEVICE=host   the host-emulated device: a smoke test of the pipeline anywhere
#   FT_GRID_BUDGET_S wall-clock budget of the grid, s (default 480: configurations are run
#                    round by round, so a budget cut still covers every geometry and stream
#                    count; the cut is logged in env.txt)
#   FT_STEPS, FT_WARMUP   measured and warm-up steps of each run (default 48 and 24); the
#                    prediction's traffic simulation counts the same steps of the same routing
#   FT_REPEAT        rounds of the four strategies in their process, each strategy's median
#                    round reported (default 3)
#   FT_RESUME=1      continue a run cut by its budget in the same OUTDIR (see below)
#   FT_STEAL_RERUN   a configuration whose runs lost more than this share of the machine's
#                    CPU time to the hypervisor (`ft run`'s host_steal_fraction) is run once
#                    more while the budget lasts, and the attempt with less steal is kept (the
#                    other under runs/stolen/); default 0.02, as `ft validate analyze` counts
#   FT_CPU_CHECK     engine (default): the CPU check of the runs' own engine before their
#                    first round decides hybrid's fraction (`ft run --host PROFILE` with
#                    hybrid:auto) and scales the prediction's CPU side (`ft predict
#                    --cpu-speed`); predict: a check taken before the runs by `ft predict
#                    --cpu-check` (grids of 2026-12-05T16Z); 0: from the probes alone
# Only bash and ft are needed. Skips cleanly without a CUDA device.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
FT="${FT:-$ROOT/carry/ft}"
if [[ ! -x "$FT" ]]; then
    if ! command -v nvidia-smi > /dev/null; then
        echo "validate-h200: no GPU here and no ft binary at $FT: skipped" >&2
        exit 0
    fi
    echo "validate-h200: no ft binary at $FT; build one with --features cuda (see the header)" >&2
    exit 2
fi
# FT_DEVICE=host runs the whole pipeline on the host-emulated device: a smoke test of the
# scripts and the binary anywhere (minutes on two cores with FT_QUICK=1 and a small
# FT_GRID_BUDGET_S), never a measurement of the model.
DEVICE="${FT_DEVICE:-cuda}"
if [[ "$DEVICE" != host ]] && ! "$FT" --version | grep -Eq '^cuda driver: found \([1-9]'; then
    echo "validate-h200: no usable CUDA device here ($("$FT" --version | grep '^cuda driver')): skipped" >&2
    exit 0
fi
mkdir -p "$OUT"/{profiles,probes,predictions,runs,logs}
OUT="$(cd "$OUT" && pwd)"
export FT_CACHE_DIR="$OUT/cache"   # never read or overwrite the user's cached profiles
QUICK="${FT_QUICK:-0}"
# The CPU side's speed at the runs (see the header). FT_CPU_CHECK=engine (the default): the
# engine of the runs times the CPU check before its first round, before any measured step,
# and hybrid's fraction is decided there with the CPU side at that speed against the probe's
# (what `ft serve` does at start); the prediction is made after the runs from the profile and
# that speed alone (`--cpu-speed`, the fraction the run used), never from the runs' timings.
# predict: `ft predict --cpu-check` times the check in a process of its own just before the
# runs; it ran 6 to 9% faster (median) than the engine's check before the first round (the
# grids of 2026-12-05T16Z, diagnose.py's "where the CPU check is taken"), and the predictions
# inherited that bias.
# 0: the probes alone, as grids before 2026-12-05T16Z.
CPU_CHECK="${FT_CPU_CHECK:-engine}"
case "$CPU_CHECK" in
    engine|predict|0) ;;
    *) echo "validate-h200: FT_CPU_CHECK=$CPU_CHECK is none of engine, predict and 0" >&2; exit 2 ;;
esac
GRID_BUDGET_S="${FT_GRID_BUDGET_S:-480}"
if [[ "$QUICK" == 1 ]]; then STEPS="${FT_STEPS:-8}" WARMUP="${FT_WARMUP:-4}"; else STEPS="${FT_STEPS:-48}" WARMUP="${FT_WARMUP:-24}"; fi
# ft run's default seed: the prediction draws the same routing the runs decode.
SEED=0
PROBE_THREADS=15   # the serving threads: 16 cores, one left for the host thread
# The four strategies of a configuration decode in turn on one engine, this many rounds, and
# each reports its median round: single 16-step runs, one process per strategy, swung by
# 10% and more on the shared VM (2026-12-04).
REPEAT="${FT_REPEAT:-3}"
# FT_RESUME=1 continues a run cut by its budget in the same OUTDIR (carried back to the GPU
# machine): its profiles are kept (the predictions of the runs already made used them) and
# configurations with all four runs are skipped.
RESUME="${FT_RESUME:-0}"

write_env_txt "$OUT/env.txt.new" \
    "validate-h200 ($(run_size))$([[ "$DEVICE" == host ]] && echo ', host-emulated device: a smoke test, not a measurement')" \
    "$0 $*" \
    "steps: $STEPS measured after $WARMUP warm-up per run, $REPEAT interleaved rounds (the median); routing seed $SEED; grid budget ${GRID_BUDGET_S} s" \
    "layers: qwen3.8-flash-next 2 of 48, bench-nvfp4 2 of 48, deepseek-v4-flash 1 of 43 (same geometry, fewer layers: banks that fill in about a second; deepseek's 43 layers (156 GB) exceed the 128 GB host)"
if [[ "$RESUME" == 1 && -f "$OUT/env.txt" ]]; then
    { echo; echo "--- resumed"; cat "$OUT/env.txt.new"; } >> "$OUT/env.txt"
else
    mv "$OUT/env.txt.new" "$OUT/env.txt"
fi
rm -f "$OUT/env.txt.new"
cat "$OUT/env.txt" >&2

quick=(); [[ "$QUICK" == 1 ]] && quick=(--quick)
n_configs=$("$FT" validate plan --out "$OUT" "${quick[@]}")
echo "validate-h200: $n_configs configurations" >&2

# 1. The probes: once per geometry, at the serving threads; profiles for each grid thread
#    count; the rules' hybrid fraction (ferrox-core on the profile's bench bandwidths).
t0=$SECONDS
for g in qwen3.8-flash-next bench-nvfp4 deepseek-v4-flash; do
    if [[ "$RESUME" == 1 && -f "$OUT/profiles/$g.json" ]]; then
        echo "probe $g: kept from the run being resumed" >> "$OUT/env.txt"
        continue
    fi
    echo "validate-h200: probe $g" >&2
    "$FT" probe --device "$DEVICE" --model "$g" --force --threads "$PROBE_THREADS" \
        --profile-out "$OUT/profiles/$g.json" --json > "$OUT/probes/$g.json" 2> "$OUT/logs/probe-$g.log"
    retarget_profiles "$FT" "$OUT" "$g"
    "$FT" validate peer --profile "$OUT/profiles/$g.json" > "$OUT/profiles/$g.peer.txt"
    "$FT" validate peer --profile "$OUT/profiles/$g.json" --field fraction > "$OUT/profiles/$g.legacy-fraction"
    # The probe repeats itself (twice at most) while it is disturbed: the hypervisor
    # stealing more than 2%, or the bank's read rate moving by more than 15% while it ran.
    get() { "$FT" validate get "$OUT/probes/$g.json" "/outcome/$1" 2>/dev/null || echo "unrecorded"; }
    echo "probe $g: $(( SECONDS - t0 )) s cumulative; $(get attempts) probe(s), steal $(get host_steal_fraction), bank read $(get stream_read_start_gbs) -> $(get stream_read_gbs) GB/s; $(cat "$OUT/profiles/$g.peer.txt")" >> "$OUT/env.txt"
done

all_runs_exist() { # config: true when every strategy of it has its run document
    local s
    for s in offload hybrid hybrid-legacy cpu; do
        [[ -s "$OUT/runs/$1-$s.json" ]] || return 1
    done
}

STEAL_RERUN="${FT_STEAL_RERUN:-0.02}"
max_steal() { # config: the largest host steal share of its run documents (0 where unrecorded)
    local s v m=0
    for s in offload hybrid hybrid-legacy cpu; do
        v=$("$FT" validate get "$OUT/runs/$1-$s.json" /host_steal_fraction 2>/dev/null) || v=0
        m=$(awk -v a="$m" -v b="$v" 'BEGIN { b += 0; print (b > a) ? b : a }')
    done
    echo "$m"
}
above() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 > b + 0) }'; }
move_runs() { # config, from, to: its four run documents from one folder to another
    local s
    for s in offload hybrid hybrid-legacy cpu; do
        [[ -f "$2/$1-$s.json" ]] && mv "$2/$1-$s.json" "$3/$1-$s.json"
    done
    return 0
}

# predict_config CONFIG [ft predict arguments]: predictions/<config>.json from the
# configuration's profile (FT_CPU_CHECK=predict adds its --cpu-check); false on failure.
# Uses the grid loop's geometry, threads, model_toml, streams, context and cache_slots.
predict_config() {
    local config="$1"; shift
    local check=()
    [[ "$CPU_CHECK" == predict ]] && check=(--cpu-check "$DEVICE")
    if ! "$FT" predict --profile "$OUT/profiles/$geometry-t$threads.json" --model "$OUT/$model_toml" \
        --streams "$streams" --context "$context" --cache-slots "$cache_slots" \
        --steps "$STEPS" --warmup "$WARMUP" --seed "$SEED" "${check[@]}" "$@" --json < /dev/null \
        > "$OUT/predictions/$config.json" 2> "$OUT/logs/$config-predict.log"; then
        echo "validate-h200: $config: prediction failed (see logs/$config-predict.log)" >&2
        return 1
    fi
}

run_config() { # config, then ft run arguments: runs/<config>-<strategy>.json for the four
    local config="$1"; shift
    if ! "$FT" run "$@" --report-prefix "$OUT/runs/$config-" < /dev/null > /dev/null 2> "$OUT/logs/$config-run.log"; then
        echo "validate-h200: $config failed (see logs/$config-run.log)" >&2
        rm -f "$OUT/runs/$config-"*.json
    fi
}

# 2. The grid.
t0=$SECONDS
done_configs=0
while IFS=, read -r config geometry layers model_toml residency cache_slots streams threads context; do
    if (( SECONDS - t0 > GRID_BUDGET_S )); then
        echo "grid budget (${GRID_BUDGET_S} s) spent after $done_configs of $n_configs configurations; stopped before $config" | tee -a "$OUT/env.txt" >&2
        break
    fi
    if [[ "$RESUME" == 1 ]] && all_runs_exist "$config"; then
        done_configs=$(( done_configs + 1 ))
        continue
    fi
    echo "validate-h200: $config $geometry x$layers residency $residency ($cache_slots slots) $streams streams $threads threads context $context" >&2
    profile="$OUT/profiles/$geometry-t$threads.json"
    f_legacy=$(cat "$OUT/profiles/$geometry.legacy-fraction")
    common=(--device "$DEVICE" --model "$geometry" --layers "$layers" --streams "$streams" --context "$context"
            --cache-slots "$cache_slots" --threads "$threads" --steps "$STEPS" --warmup "$WARMUP"
            --seed "$SEED" --repeat "$REPEAT")
    if [[ "$CPU_CHECK" == engine ]]; then
        # hybrid's fraction decided by the run's engine at its check (the profile as --host)
        common+=(--host "$profile")
        interleave="offload,hybrid=hybrid:auto,hybrid-legacy=hybrid:$f_legacy,cpu"
    else
        predict_config "$config" || continue
        f_model=$("$FT" validate get "$OUT/predictions/$config.json" /prediction/fetch_search/chosen)
        interleave="offload,hybrid=hybrid:$f_model,hybrid-legacy=hybrid:$f_legacy,cpu"
    fi
    run_config "$config" "${common[@]}" --interleave "$interleave"
    steal=$(max_steal "$config")
    if all_runs_exist "$config" && above "$steal" "$STEAL_RERUN" && (( SECONDS - t0 < GRID_BUDGET_S )); then
        # Measured while the VM lost CPU time: not this machine's serving speed (a stolen
        # vCPU stalls the spinning pool). Once more; the attempt with less steal is kept.
        mkdir -p "$OUT/runs/stolen"
        move_runs "$config" "$OUT/runs" "$OUT/runs/stolen"
        run_config "$config" "${common[@]}" --interleave "$interleave"
        again=$(max_steal "$config")
        if ! all_runs_exist "$config" || above "$again" "$steal"; then
            mkdir -p "$OUT/runs/stolen/second"
            move_runs "$config" "$OUT/runs" "$OUT/runs/stolen/second"
            move_runs "$config" "$OUT/runs/stolen" "$OUT/runs"
            kept=first
        else
            kept=second
        fi
        echo "$config: host steal $steal of the CPU time during its runs; ran again (steal $again), kept the $kept" | tee -a "$OUT/env.txt" >&2
    fi
    if [[ "$CPU_CHECK" == engine ]] && [[ -f "$OUT/runs/$config-hybrid.json" ]]; then
        # From the profile and the speed of the kept runs' check before their first round,
        # with hybrid at the fraction decided there.
        speed=$("$FT" validate get "$OUT/runs/$config-hybrid.json" /auto_cpu_speed 2> /dev/null || echo null)
        f_model=$("$FT" validate get "$OUT/runs/$config-hybrid.json" /fetch_fraction)
        extra=(--fetch-fraction "$f_model")
        [[ "$speed" != null ]] && extra+=(--cpu-speed "$speed")
        predict_config "$config" "${extra[@]}" || continue
    fi
    done_configs=$(( done_configs + 1 ))
done < <(tail -n +2 "$OUT/plan.csv")
echo "grid: $done_configs configurations in $(( SECONDS - t0 )) s" >> "$OUT/env.txt"

# 3. Analysis (runs anywhere on the CSV: `ft validate analyze grid.csv`).
analyse_grid "$FT" "$OUT" "$STEPS" "$WARMUP"
