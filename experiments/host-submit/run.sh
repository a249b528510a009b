#!/usr/bin/env bash
# host-submit: a hybrid layer's GPU work that its CPU share does not wait for, queued by the
# host before the share (serial) or while it waits for the activations and beside the share
# (overlapped, the default since 2026-12-05), A/B in one call: the pool-wait experiment's
# runs and summary with the engine switch `ft run --host-submit` (cpu and hybrid at f = 0.5,
# 1 and 4 streams, --repeat 3, the two arrangements back to back), the pool at its serving
# arrangement (--pool-wait spin: the host computes as one of --threads).
#
# Usage: run.sh OUTDIR. Env as experiments/pool-wait/run.sh (FT, DEVICE, THREADS, FT_QUICK).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
KNOB=host-submit VALUES="overlapped serial" EXTRA_ARGS="--pool-wait spin" \
    exec "$here/../pool-wait/run.sh" "$@"
