#!/usr/bin/env bash
# multi-gpu: on two RTX 3090s (one desktop CPU, host RAM and CPU pool shared), sharded or
# tensor-parallel, offload or hybrid, and does the legacy ratio rule still pick right?
#
# Usage: run.sh OUTDIR (the committed results: run.sh experiments/multi-gpu/results). Env:
# FT = the ft binary (`ft` on PATH by default), FT_QUICK=1 for fewer steps. Needs bash, jq
# and python3.
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
# shellcheck source=../lib/env-txt.sh
source "$HERE/../lib/env-txt.sh"
OUT="${1:?usage: run.sh OUTDIR}"
FT="${FT:-ft}"
mkdir -p "$OUT"
STEPS=256 WARMUP=128
if [[ "${FT_QUICK:-0}" == 1 ]]; then STEPS=32 WARMUP=32; fi
MODEL=qwen3.8-flash-next
HOSTS=("$HERE/hosts/1x-rtx3090.toml" "$HERE/hosts/2x-rtx3090-sharded.toml"
       2x-rtx3090-tp-ryzen7950x "$HERE/hosts/2x-rtx3090-tp-nvlink.toml")
if [[ "${FT_PLOT_ONLY:-0}" != 1 ]]; then
write_env_txt "$OUT/env.txt" "multi-gpu ($(run_size))" "$0 $*" \
    "model: $MODEL; streams 1,2,4; steps $STEPS after $WARMUP warm-up"

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

# The conclusions the reproduction test checks (tests/experiments_reproduce.rs), and the
# summary as markdown.
python3 - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/multi-gpu.csv")))
tok = {(r["host"], int(r["streams"]), r["strategy"]): float(r["sim_tok_s_total"]) for r in rows}
verdict = {(r["host"], int(r["streams"])): r["legacy_verdict"] for r in rows}
hosts = sorted({r["host"] for r in rows}); streams = sorted({int(r["streams"]) for r in rows})
c = {}
for b in streams:
    best = max((t, h, s) for (h, bb, s), t in tok.items() if bb == b and s != "resident")
    c[f"best_{b}_streams"] = f"{best[1]} {best[2]}"
faster = {(h, b): ("hybrid" if tok[(h, b, "hybrid")] > tok[(h, b, "offload")] else "offload")
          for h in hosts for b in streams}
c["hybrid_beats_offload_everywhere"] = all(v == "hybrid" for v in faster.values())
c["legacy_right_everywhere"] = all(verdict[k] == v for k, v in faster.items())
gain = lambda a, b, s, n: round(100 * (tok[(a, n, s)] / tok[(b, n, s)] - 1), 2)
c["offload_two_sharded_over_one_1_stream_pct"] = gain("2x-rtx3090-sharded", "1x-rtx3090", "offload", 1)
c["hybrid_tp_nvlink_over_tp_host_1_stream_pct"] = gain("2x-rtx3090-tp-nvlink", "2x-rtx3090-tp-ryzen7950x", "hybrid", 1)
c["hybrid_over_offload_shrinks_with_a_second_gpu"] = all(
    tok[(h, b, "hybrid")] / tok[(h, b, "offload")]
    < tok[("1x-rtx3090", b, "hybrid")] / tok[("1x-rtx3090", b, "offload")]
    for h in hosts if h != "1x-rtx3090" for b in streams)
worst = max(abs(float(r["sim_vs_model_pct"])) for r in rows if r["sim_vs_model_pct"])
c["max_sim_vs_model_pct"] = round(worst, 2)
c["sim_and_model_within_5pct"] = worst <= 5.0
json.dump(c, open(f"{out}/conclusions.json", "w"), indent=2)
with open(f"{out}/summary.md", "w") as f:
    f.write("# multi-gpu: summary\n\n")
    for line in open(f"{out}/summary.txt"):
        f.write(f"- {line.strip()}\n")
PY

fi
for s in offload hybrid; do
    "$FT" plot "$OUT/multi-gpu.csv" -o "$OUT/tok-s-$s.svg" --kind line --x streams \
        --y sim_tok_s_total,model_tok_s_total --series host --where "strategy=$s" \
        --title "$s: decode tok/s, $MODEL, RTX 3090 hosts (solid: simulator, dashed: model)" \
        --ylabel "tok/s over all streams" > /dev/null
done
echo "multi-gpu: results in $OUT" >&2
