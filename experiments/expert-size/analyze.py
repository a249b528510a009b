#!/usr/bin/env python3
"""expert-size analysis: bandwidths at the tuning and the served geometry, each size's
simulated winner, the legacy rule's verdict measured either way, and the conclusions the CI
test checks.

Reads OUTDIR/raw/bench-model.<host>.jsonl and raw/sim.<host>.csv (and raw/bench-bw.*.json,
raw/run.*.json and raw/runtime-sim.csv where the GPU-machine half ran); writes
OUTDIR/expert-size.csv, winners.csv, measured-bandwidth.csv and runtime.csv (GPU half only),
summary.md and conclusions.json.
"""
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

FIELD_HOST = "rtx4090-2x-xeon4310"
MB = 1e6
# Closer than this share, two strategies tie.
TIE = 0.01

out = Path(sys.argv[1])
raw = out / "raw"


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def find(doc, key):
    if isinstance(doc, dict):
        if isinstance(doc.get(key), (int, float)):
            return doc[key]
        doc = list(doc.values())
    if isinstance(doc, list):
        for v in doc:
            x = find(v, key)
            if x is not None:
                return x
    return None


bench = []
for p in sorted(raw.glob("bench-model.*.jsonl")):
    host = p.name[len("bench-model."):-len(".jsonl")]
    for line in p.read_text().splitlines():
        d = json.loads(line)
        l, s = d["legacy"], d["served"]
        bench.append({
            "host": host,
            "model": d["model"],
            "expert_mb": round(d["expert_bytes"] / MB, 3),
            "tuning_mb": round(l["expert_bytes"] / MB, 3),
            "tuning_cpu_moe_gbs": round(l["cpu_moe_gbs"], 2),
            "tuning_pcie_gather_gbs": round(l["pcie_gather_gbs"], 2),
            "tuning_ratio": round(l["ratio"], 3),
            "tuning_verdict": l["verdict"],
            "served_cpu_moe_gbs": round(s["served_cpu_gbs"], 2),
            "served_pcie_gather_gbs": round(s["served_gather_gbs"], 2),
            "served_ratio": round(s["served_ratio"], 3),
            "served_verdict": "hybrid" if s["served_ratio"] > l["threshold"] else "offload",
        })
bench.sort(key=lambda r: (r["host"], -r["expert_mb"]))

sim = defaultdict(dict)
for p in sorted(raw.glob("sim.*.csv")):
    for r in read(p):
        sim[(r["host"], r["model"], int(r["streams"]))][r["strategy"]] = r

rows, winners = [], []
for b in bench:
    row = dict(b)
    for n in (1, 2):
        c = sim[(b["host"], b["model"], n)]
        tok = {s: float(c[s]["tok_s_total"]) for s in c}
        best = max(tok, key=tok.get)
        second = max(v for s, v in tok.items() if s != best)
        win = best if tok[best] > second * (1 + TIE) else "tie"
        gain = 100 * (tok["hybrid"] / tok["offload"] - 1)
        row[f"sim_winner_{n}"] = win
        row[f"hybrid_gain_{n}_pct"] = round(gain, 1)
        row[f"hybrid_f_{n}"] = round(float(c["hybrid"]["fetch_fraction"]), 3)
        winners.append({
            "host": b["host"], "model": b["model"], "expert_mb": b["expert_mb"],
            "streams": f"{n} stream" + ("s" if n > 1 else ""),
            "offload_tok_s": round(tok["offload"], 2), "hybrid_tok_s": round(tok["hybrid"], 2),
            "cpu_tok_s": round(tok["cpu"], 2), "hybrid_over_offload_pct": round(gain, 2),
            "winner": win,
            "tuning_verdict_right": int(b["tuning_verdict"] == win),
            "served_verdict_right": int(b["served_verdict"] == win),
        })
    rows.append(row)
for name, data in (("expert-size.csv", rows), ("winners.csv", winners)):
    with open(out / name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)

# GPU-machine half: ft bench bw's rows (tuning and served geometry) and ft run's tok/s.
measured = []
for p in sorted(raw.glob("bench-bw.*.json")):
    doc = json.loads(p.read_text())
    for r in doc.get("rows", []):
        measured.append({
            "model": p.name[len("bench-bw."):-len(".json")],
            "geometry": "tuning" if r.get("model") == "bench-nvfp4" else "served",
            "expert_mb": round(r["expert_bytes"] / MB, 3),
            "cpu_moe_gbs": r.get("cpu_moe_gbs"), "pcie_gather_gbs": r.get("pcie_gather_gbs"),
            "cpu_moe_contended_gbs": r.get("cpu_moe_contended_gbs"),
            "pcie_gather_contended_gbs": r.get("pcie_gather_contended_gbs"),
            "ratio": r.get("ratio"), "verdict": r.get("verdict"),
        })
if measured:
    with open(out / "measured-bandwidth.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(measured[0]))
        w.writeheader()
        w.writerows(measured)
# ft run's rows, beside the simulator of h200-xeon-emr on the same L-layer models, cache,
# context and steps (raw/runtime-sim.csv). A label may hold a dot (expert-1.5mb).
rt_sim = {}
if (raw / "runtime-sim.csv").exists():
    for r in read(raw / "runtime-sim.csv"):
        rt_sim[(r["model"], r["strategy"], int(r["streams"]))] = r
runs = []
for p in sorted(raw.glob("run.*.json")):
    m = re.fullmatch(r"run\.(.+)\.(offload|hybrid|cpu)\.(\d+)\.json", p.name)
    if not m:
        continue
    label, s, n = m.group(1), m.group(2), int(m.group(3))
    doc = json.loads(p.read_text())
    summ = doc.get("summary", {})
    sim = rt_sim.get((label, s, n), {})
    tok = summ.get("tok_s_total", find(doc, "tok_s_total"))
    sim_tok = float(sim["tok_s_total"]) if sim.get("tok_s_total") else None
    runs.append({
        "model": label, "expert_mb": round(doc.get("expert_bytes", 0) / MB, 3), "strategy": s, "streams": n,
        "layers": doc.get("layers"), "cache_slots": doc.get("cache_slots"),
        "fetch_fraction": doc.get("fetch_fraction"),
        "measured_tok_s_total": round(tok, 3) if tok is not None else None,
        "measured_miss_rate": round(summ["miss_rate"], 4) if summ.get("miss_rate") is not None else None,
        "sim_tok_s_total": round(sim_tok, 3) if sim_tok else None,
        "model_tok_s_total": round(float(sim["model_tok_s_total"]), 3) if sim.get("model_tok_s_total") else None,
        "measured_vs_sim_pct": round(100 * (tok / sim_tok - 1), 1) if tok and sim_tok else None,
    })
runs.sort(key=lambda r: (-r["expert_mb"], r["streams"], r["strategy"]))
if runs:
    with open(out / "runtime.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(runs[0]))
        w.writeheader()
        w.writerows(runs)

md = []
for host in sorted({r["host"] for r in rows}):
    hr = [r for r in rows if r["host"] == host]
    h0 = hr[0]
    md.append(f"**{host}**: the legacy bench pair at the tuning geometry ({h0['tuning_mb']:.2f} MB): CPU-MoE "
              f"{h0['tuning_cpu_moe_gbs']:.2f} / gather {h0['tuning_pcie_gather_gbs']:.2f} GB/s = {h0['tuning_ratio']:.2f} "
              f"-> {h0['tuning_verdict']}, whatever the served size.")
    md.append("")
    md.append("| expert MB | model's bench at this size: CPU-MoE / gather GB/s (ratio -> verdict) | sim winner 1 stream (hybrid over offload, f) | sim winner 2 streams (hybrid over offload, f) |")
    md.append("|---:|---:|---|---|")
    for r in hr:
        md.append(f"| {r['expert_mb']:.2f} | {r['served_cpu_moe_gbs']:.2f} / {r['served_pcie_gather_gbs']:.2f} "
                  f"({r['served_ratio']:.2f} -> {r['served_verdict']}) | {r['sim_winner_1']} ({r['hybrid_gain_1_pct']:+.0f}%, f={r['hybrid_f_1']:.2f}) | "
                  f"{r['sim_winner_2']} ({r['hybrid_gain_2_pct']:+.0f}%, f={r['hybrid_f_2']:.2f}) |")
    hw = [w for w in winners if w["host"] == host]
    md.append("")
    md.append(f"Verdict right (against the simulated winner, {len(hw)} size x stream cases): measured at the tuning "
              f"geometry {sum(w['tuning_verdict_right'] for w in hw)}, at the served geometry "
              f"{sum(w['served_verdict_right'] for w in hw)}.")
    md.append("")
if measured:
    md.append("**GPU machine, `ft bench bw`**")
    md.append("")
    md.append("| model | geometry | expert MB | CPU-MoE GB/s | gather GB/s | contended CPU / gather | ratio -> verdict |")
    md.append("|---|---|---:|---:|---:|---:|---|")
    for m in measured:
        md.append(f"| {m['model']} | {m['geometry']} | {m['expert_mb']} | {m['cpu_moe_gbs']} | {m['pcie_gather_gbs']} | "
                  f"{m['cpu_moe_contended_gbs']} / {m['pcie_gather_contended_gbs']} | {m['ratio']} -> {m['verdict']} |")
    md.append("")
if runs:
    fmt = lambda v, spec="": "" if v is None else format(v, spec)
    md.append(f"**GPU machine, `ft run`** (total tok/s, {runs[0]['layers']} layers, {runs[0]['cache_slots']} cache slots; "
              "the simulator and the model of h200-xeon-emr on the same configuration)")
    md.append("")
    md.append("| model | strategy | f | streams | measured | simulator | model | measured vs sim | measured miss rate |")
    md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        md.append(f"| {r['model']} | {r['strategy']} | {fmt(r['fetch_fraction'], '.3f')} | {r['streams']} | "
                  f"{fmt(r['measured_tok_s_total'], '.1f')} | {fmt(r['sim_tok_s_total'], '.1f')} | {fmt(r['model_tok_s_total'], '.1f')} | "
                  f"{fmt(r['measured_vs_sim_pct'], '+.1f')}% | {fmt(r['measured_miss_rate'], '.3f')} |")
    md.append("")
(out / "summary.md").write_text("\n".join(md))

fr = [r for r in rows if r["host"] == FIELD_HOST]
big, small = fr[0], fr[-1]
fw = [w for w in winners if w["host"] == FIELD_HOST]
conclusions = {
    "largest_expert_mb": big["expert_mb"],
    "smallest_expert_mb": small["expert_mb"],
    "tuning_verdict": big["tuning_verdict"],
    "tuning_verdict_same_for_every_size": len({r["tuning_verdict"] for r in fr}) == 1,
    "served_cpu_gbs_falls_as_experts_shrink": all(a["served_cpu_moe_gbs"] > b["served_cpu_moe_gbs"] for a, b in zip(fr, fr[1:])),
    "served_gather_gbs_falls_as_experts_shrink": all(a["served_pcie_gather_gbs"] > b["served_pcie_gather_gbs"] for a, b in zip(fr, fr[1:])),
    "served_ratio_largest": big["served_ratio"],
    "served_ratio_smallest": small["served_ratio"],
    "winner_largest_1_stream": big["sim_winner_1"],
    "winner_smallest_1_stream": small["sim_winner_1"],
    "winner_smallest_2_streams": small["sim_winner_2"],
    "hybrid_gain_largest_1_stream_pct": big["hybrid_gain_1_pct"],
    "hybrid_gain_smallest_1_stream_pct": small["hybrid_gain_1_pct"],
    "hybrid_gain_shrinks_with_expert_size": small["hybrid_gain_1_pct"] < big["hybrid_gain_1_pct"],
    "tuning_verdict_right_share": round(sum(w["tuning_verdict_right"] for w in fw) / len(fw), 3),
    "served_verdict_right_share": round(sum(w["served_verdict_right"] for w in fw) / len(fw), 3),
}
(out / "conclusions.json").write_text(json.dumps(conclusions, indent=2) + "\n")
print(json.dumps(conclusions, indent=2))
