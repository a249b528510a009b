#!/usr/bin/env bash
# Where a layer's GPU time goes: `ft run` on CUDA with Chrome traces (per-phase GPU spans)
# for resident, offload and cpu at 1 and 8 streams on qwen3.8-flash-next (8 layers).
# Usage: scripts/device-diag.sh OUTDIR (FT: the ft binary, default carry/device/ft).
set -uo pipefail
OUT="${1:?usage: device-diag.sh OUTDIR}"
FT="${FT:-carry/device/ft}"
mkdir -p "$OUT"
common=(--device cuda --model qwen3.8-flash-next --layers 8 --steps 16 --warmup 8 --context 1024
        --threads 15 --json)
for b in 1 8; do
    for s in resident offload cpu "hybrid --fetch-fraction 0.5"; do
        name="$(echo "$s" | cut -d' ' -f1)-b$b"
        # shellcheck disable=SC2086
        "$FT" run "${common[@]}" --strategy $s --streams "$b" --cache-slots 1024 \
            --trace-out "$OUT/$name.trace.json" > "$OUT/$name.json" 2> "$OUT/$name.log" ||
            echo "$name failed" >&2
    done
done
python3 "$(dirname "$0")/trace-phases.py" "$OUT"/*.trace.json > "$OUT/phases.txt" 2>&1
for f in "$OUT"/*.json; do case "$f" in *.trace.json) ;; *) python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d[\"summary\"]; print(sys.argv[1].split(\"/\")[-1], round(s[\"tok_s_per_stream\"],1), \"tok/s/stream, share of PCIe bound\", round(d[\"pcie\"][\"share_of_bound\"] or 0,3))" "$f" >> "$OUT/phases.txt" 2>&1;; esac; done
