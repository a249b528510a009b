#!/usr/bin/env bash
# multi-gpu: on two RTX 3090s (one desktop CPU, host RAM and CPU pool shared), sharded or
# tensor-parallel, offload or hybrid, and does the legacy ratio rule still pick right?
#
# Usage: run.sh OUTDIR (default: this folder). Env: FT = the ft binary (`ft` on PATH by
# default), FT_QUICK=1 for fewer steps. Needs bash and jq.
#
# Method: `ft simulate` (simulator and analytic model side by side) of every strategy on
# four hosts that differ only in their GPUs: one RTX 3090 (the baseline), two sharded
# (expert % 2), two tensor-parallel through host memory (the shipped preset
# 2x-rtx3090-tp-ryzen7950x: GeForce cards have no PCIe peer-to-peer), and two
# tensor-parallel over an NVLink bridge. Model qwen3.8-flash-next (the field report's), at
# 1, 2 and 4 streams, each GPU's cache what its 24 GB hold after the dense weights, KV and
# the reserve. The legacy rule's verdict and the simulated best are read from --json.
set -euo pipefail
export NO_COLOR=1
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE}"
FT="${FT:-ft}"
mkdir -p "$OUT"
STEPS=256 WARMUP=128
if [[ "${FT_QUICK:-0}" == 1 ]]; then STEPS=32 WARMUP=32; fi
MODEL=qwen3.8-flash-next
HOSTS=("$HERE/hosts/1x-rtx3090.toml" "$HERE/hosts/2x-rtx3090-sharded.toml"
       2x-rtx3090-tp-ryzen7950x "$HERE/hosts/2x-rtx3090-tp-nvlink.toml")
{
    echo "experiment: multi-gpu ($([[ "${FT_QUICK:-0}" == 1 ]] && echo quick || echo full))"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores visible)"
    "$FT" --version
    echo "model: $MODEL; streams 1,2,4; steps $STEPS after $WARMUP warm-up"
} > "$OUT/env.txt"

echo "host,gpus,placement,streams,cache_slots,strategy,fetch_fraction,miss_rate,sim_tok_s_total,model_tok_s_total,sim_vs_model_pct,bound,best,legacy_verdict,legacy_ratio" > "$OUT/multi-gpu.csv"
: > "$OUT/multi-gpu.txt"
for host in "${HOSTS[@]}"; do
    echo "multi-gpu: simulating $(basename "$host" .toml)" >&2
    "$FT" simulate --host "$host" --model "$MODEL" --streams 1,2,4 --steps "$STEPS" \
        --warmup "$WARMUP" >> "$OUT/multi-gpu.txt"
    "$FT" simulate --host "$host" --model "$MODEL" --streams 1,2,4 --steps "$STEPS" \
        --warmup "$WARMUP" --json \
      | jq -r '.[] | . as $c | .strategies[] | [$c.host, $c.gpus, $c.placement, $c.streams,
          $c.cache.slots, .strategy, .fetch_fraction, .miss_rate, .tok_s_total,
          .model.tok_s_total, (100 * .sim_vs_model), .bound, $c.best, $c.legacy.verdict,
          $c.legacy.ratio] | @csv' | tr -d '"' >> "$OUT/multi-gpu.csv"
done

# The question's answers, from the CSV: the best layout and strategy at each stream count,
# and whether the ratio's verdict (offload or hybrid) is the faster of the two.
awk -F, 'NR > 1 {
    key = $4; tok = $9 + 0
    # Resident does not fit: 24 GB per GPU hold neither all experts nor half of each.
    if ($6 != "resident" && tok > best[key]) { best[key] = tok; what[key] = $1 " " $6 }
    if ($6 == "offload" || $6 == "hybrid") t[$1 "," $4 "," $6] = tok
    verdict[$1 "," $4] = $14; hosts[$1] = 1; streams[$4] = 1
    d = ($11 < 0 ? -$11 : $11); if (d > worst) worst = d
  }
  END {
    for (b in streams) printf "best at %s stream(s): %s (%.1f tok/s)\n", b, what[b], best[b]
    for (h in hosts) for (b in streams) {
      k = h "," b; off = t[k ",offload"]; hyb = t[k ",hybrid"]
      right = (hyb > off ? "hybrid" : "offload")
      printf "%s, %s stream(s): ratio says %s, faster is %s (hybrid/offload %.2f)%s\n", h, b,
        verdict[k], right, hyb / off, (verdict[k] == right ? "" : "  <- ratio wrong")
    }
    printf "largest |sim - model|: %.2f%%\n", worst
  }' "$OUT/multi-gpu.csv" | sort | tee "$OUT/summary.txt"

for s in offload hybrid; do
    "$FT" plot "$OUT/multi-gpu.csv" -o "$OUT/tok-s-$s.svg" --kind line --x streams \
        --y sim_tok_s_total,model_tok_s_total --series host --where "strategy=$s" \
        --title "$s: decode tok/s, $MODEL, RTX 3090 hosts (solid: simulator, dashed: model)" \
        --ylabel "tok/s over all streams" > /dev/null
done
echo "multi-gpu: results in $OUT" >&2
