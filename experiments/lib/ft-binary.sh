# shellcheck shell=bash
# Sourced by the experiment scripts: the ft binary they run.
#
# resolve_ft
#   keeps FT where the caller set it (the binary to measure); otherwise builds this checkout
#   in release mode (with the CUDA backend where nvidia-smi exists) and sets FT to it.
resolve_ft() {
    if [[ -n "${FT:-}" ]]; then
        return
    fi
    local root features=()
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    command -v nvidia-smi > /dev/null && features=(--features cuda)
    (cd "$root" && cargo build --release --quiet "${features[@]}")
    FT="$root/target/release/ft"
}
