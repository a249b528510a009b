#!/usr/bin/env bash
# pool-wait: the same decode with the CPU pool's two hot arrangements, A/B in one call.
#   spin         the host thread computes as one of --threads (threads - 1 workers)
#   spin-beside  --threads workers, the host spinning idle beside them (one core more)
# For the strategies with a CPU share (cpu, and hybrid at f = 0.5) at 1 and 4 streams, each
# run three times in its process (`--repeat 3`, the median repetition reported), the
# arrangements alternating so that a slow stretch of a shared machine falls on both. The
# summary counts the stalled steps (over twice their run's median step) beside tok/s.
#
# The same A/B serves other engine switches of the host's arrangement: KNOB names an `ft run`
# flag and VALUES its two values (default KNOB=pool-wait VALUES="spin spin-beside";
# experiments/host-submit runs KNOB=host-submit VALUES="overlapped serial"), with EXTRA_ARGS
# added to every `ft run` (e.g. "--pool-wait spin").
#
# Usage: run.sh OUTDIR. Env: FT (binary; default target/release/ft, built when missing),
# DEVICE (auto: cuda where a GPU is usable, else the host-emulated device), THREADS (default:
# cores - 1 on CUDA, all cores on the host device, so that the pool fills the machine there
# too), FT_QUICK=1 (24 measured steps instead of 48), FT_PLOT_ONLY=1 (redraw the plots from
# OUTDIR's tables alone).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../lib/env-txt.sh
source "$here/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
mkdir -p "$OUT/raw"
FT="${FT:-}"
if [[ -z "$FT" ]]; then
    FT="$root/target/release/ft"
    [[ -x "$FT" ]] || (cd "$root" && cargo build --release --quiet)
fi
DEVICE="${DEVICE:-auto}"
if [[ "$DEVICE" == auto ]]; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        DEVICE=cuda
    else
        DEVICE=host
    fi
fi
cores=$(nproc)
if [[ -z "${THREADS:-}" ]]; then
    if [[ "$DEVICE" == cuda ]]; then THREADS=$((cores > 1 ? cores - 1 : 1)); else THREADS=$cores; fi
fi
STEPS=48
[[ "${FT_QUICK:-0}" == 1 ]] && STEPS=24
KNOB="${KNOB:-pool-wait}"
read -r -a VALUES <<< "${VALUES:-spin spin-beside}"
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"
if [[ ${#VALUES[@]} -ne 2 || ! "$KNOB" =~ ^[a-z-]+$ ]]; then
    echo "run.sh: KNOB must name one ft run flag and VALUES give two of its values" >&2
    exit 2
fi
MODEL=qwen3.8-flash-next
LAYERS=2
# 5% of the two layers' 1024 experts: most of every step's experts miss.
SLOTS=51
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
write_env_txt "$OUT/env.txt" "pool-wait, --$KNOB A/B ($(run_size))" \
    "$0 $* (KNOB=$KNOB VALUES=\"${VALUES[*]}\" DEVICE=$DEVICE THREADS=$THREADS FT_QUICK=${FT_QUICK:-0})" \
    "device: $DEVICE, threads: $THREADS of $cores cores, model: $MODEL ($LAYERS layers), cache: $SLOTS slots, steps: $STEPS (+16 warm-up), repeat 3" \
    "A/B: --$KNOB ${VALUES[0]} against --$KNOB ${VALUES[1]}${EXTRA_ARGS:+ (with $EXTRA_ARGS)}"
for streams in 1 4; do
    for strategy in cpu hybrid; do
        for value in "${VALUES[@]}"; do
            tag="$strategy-s$streams-$value"
            args=(--model "$MODEL" --layers "$LAYERS" --strategy "$strategy" --streams "$streams"
                --steps "$STEPS" --warmup 16 --cache-slots "$SLOTS" --threads "$THREADS"
                "--$KNOB" "$value" --device "$DEVICE" --repeat 3 --json ${EXTRA[@]+"${EXTRA[@]}"})
            [[ "$strategy" == hybrid ]] && args+=(--fetch-fraction 0.5)
            if ! "$FT" run "${args[@]}" > "$OUT/raw/$tag.json" 2> "$OUT/raw/$tag.log"; then
                echo "pool-wait: ft run $tag failed (raw/$tag.log)" >&2
                rm -f "$OUT/raw/$tag.json"
            fi
        done
    done
done
python3 "$here/summarize.py" "$OUT" "$KNOB" "${VALUES[@]}"
fi
"$FT" plot "$OUT/steps.csv" --kind cdf --x step_over_median --series "${KNOB//-/_}" \
    --title "decode steps over their run's median (all runs)" --out "$OUT/steps-cdf.svg"
"$FT" plot "$OUT/pairs.csv" --x b_tok_s --y a_tok_s --series strategy --diagonal \
    --title "tok/s: --$KNOB ${VALUES[0]} (y) against ${VALUES[1]} (x)" --out "$OUT/pairs.svg"
