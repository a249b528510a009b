# shellcheck shell=bash
# Sourced by the experiment scripts: the fingerprint of a run (the machine, the checkout, the
# command, the ft binary) at the top of its env.txt or machine.txt, written the same way by
# every script.
#
# write_env_txt FILE TITLE COMMAND [LINE...]
#   writes FILE (replacing it): the common block below, then each LINE as given (a LINE may
#   hold several lines; a script appends what it learns later with >>). FT is the ft binary
#   (resolve_ft, or the script's own default). The common block:
#     experiment:  TITLE (the experiment, and its size: `run_size`)
#     date:        now, UTC, ISO 8601
#     uname:       `uname -a` (the machine's name, kernel, architecture)
#     cpu:         the CPU model (the logical CPUs this process may use, those online, the
#                  NUMA nodes)
#     ram:         MemTotal in GB (1e6 kB)
#     gpu:         one line per NVIDIA GPU (name, memory, driver, the PCIe link now and at
#                  most: the link trains down when idle), or "gpu: none"
#     checkout:    the commit of this checkout, -dirty when tracked files differ from it (the
#                  ft binary's own build is its `git revision` below: the two can differ)
#     command:     COMMAND (what the script was run as: "$0 $*")
#     environment: the FT and FT_* variables the script was given (FT_QUICK, FT_GPU,
#                  FT_DEVICE, FT_CUDA_* ...), shell-quoted
#     ft binary:   FT, then its `--version` (version, git revision, SIMD, CUDA)
write_env_txt() {
    local file="$1" title="$2" command="$3"
    shift 3
    {
        echo "experiment: $title"
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "uname: $(uname -a)"
        echo "cpu: $(_env_txt_cpu)"
        if [[ -r /proc/meminfo ]]; then
            echo "ram: $(awk '/^MemTotal:/ { printf "%.1f GB", $2 / 1e6 }' /proc/meminfo)"
        fi
        _env_txt_gpus
        echo "checkout: $(_env_txt_checkout)"
        echo "command: $command"
        echo "environment: $(_env_txt_ft_variables)"
        echo "ft binary: ${FT:-unset}"
        if [[ -n "${FT:-}" ]]; then
            "$FT" --version || echo "ft --version failed"
        fi
        if (( $# > 0 )); then
            printf '%s\n' "$@"
        fi
    } > "$file"
}

# run_size: "quick" where FT_QUICK=1 (the reduced size CI runs), else "full".
run_size() {
    if [[ "${FT_QUICK:-0}" == 1 ]]; then echo quick; else echo full; fi
}

# The CPU model (lscpu's, which names ARM cores too; else /proc/cpuinfo's), with the logical
# CPUs this process may use (nproc), those online and the NUMA nodes.
_env_txt_cpu() {
    local model online numa
    model=$(LC_ALL=C lscpu 2> /dev/null | awk '!done && sub(/^Model name:[ \t]*/, "") { print; done = 1 }') || true
    if [[ -z "$model" ]]; then
        model=$(awk '!done && sub(/^model name[ \t]*:[ \t]*/, "") { print; done = 1 }' /proc/cpuinfo 2> /dev/null) || true
    fi
    online=$(getconf _NPROCESSORS_ONLN 2> /dev/null) || online="?"
    numa=$(LC_ALL=C lscpu 2> /dev/null | awk '!done && sub(/^NUMA node\(s\):[ \t]*/, "") { print; done = 1 }') || true
    echo "${model:-unknown} ($(nproc) cores visible, $online online${numa:+, $numa NUMA node(s)})"
}

# One line per NVIDIA GPU, or "gpu: none".
_env_txt_gpus() {
    local query=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max
    local rows name memory driver gen width gen_max width_max
    if command -v nvidia-smi > /dev/null \
        && rows=$(nvidia-smi --query-gpu="$query" --format=csv,noheader 2> /dev/null) && [[ -n "$rows" ]]; then
        while IFS=, read -r name memory driver gen width gen_max width_max; do
            echo "gpu: ${name# }, ${memory# }, driver ${driver# }, PCIe gen ${gen# } x${width# } (at most gen ${gen_max# } x${width_max# })"
        done <<< "$rows"
    else
        echo "gpu: none"
    fi
}

# The commit of the checkout this file is in, -dirty when tracked files differ from it.
_env_txt_checkout() {
    local root rev
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    if rev=$(git -C "$root" rev-parse --short=12 HEAD 2> /dev/null); then
        git -C "$root" diff --quiet HEAD -- 2> /dev/null || rev="$rev-dirty"
        echo "$rev"
    else
        echo "unknown (no git checkout here)"
    fi
}

# The exported FT and FT_* variables as NAME=VALUE, shell-quoted; "none" without any.
_env_txt_ft_variables() {
    local name vars=()
    for name in $(compgen -e | grep -E '^FT(_[A-Za-z0-9_]+)?$' | sort); do
        vars+=("$name=$(printf '%q' "${!name}")")
    done
    if (( ${#vars[@]} > 0 )); then echo "${vars[*]}"; else echo none; fi
}
