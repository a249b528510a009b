#!/usr/bin/env python3
"""concurrency analysis: tidy the sweeps into one table, write the README's summary and the
conclusions the CI test checks.

Reads OUTDIR/raw/sim.<host>.csv (and raw/runtime.csv with its JSON files, where the runtime
half ran); writes OUTDIR/concurrency.csv, runtime.csv (runtime half only), summary.md and
conclusions.json.
"""
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

FIELD_HOST = "rtx4090-2x-xeon4310"
# A strategy "wins" only by more than this share; closer is a tie (the simulator's and the
# model's own noise is below 1%).
TIE = 0.01

out = Path(sys.argv[1])
raw = out / "raw"

rows = []
for path in sorted(raw.glob("sim.*.csv")):
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            b = int(r["streams"])
            rows.append({
                "host": r["host"],
                "streams": b,
                "strategy": r["strategy"],
                "fetch_fraction": round(float(r["fetch_fraction"]), 4),
                "cache_slots": int(r["cache_slots"]),
                "miss_rate": round(float(r["miss_rate"]), 4),
                "sim_tok_s_total": round(float(r["tok_s_total"]), 3),
                "sim_tok_s_per_stream": round(float(r["tok_s_per_stream"]), 3),
                "model_tok_s_total": round(float(r["model_tok_s_total"]), 3),
                "model_tok_s_per_stream": round(float(r["model_tok_s_total"]) / b, 3),
                "sim_vs_model_pct": round(100 * float(r["sim_vs_model"]), 2),
                "sim_bound": r["bound"],
                "model_bound": r["model_bound"],
            })
with open(out / "concurrency.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)

by = defaultdict(dict)
for r in rows:
    by[(r["host"], r["streams"])][r["strategy"]] = r


def winner(host, b, col="sim_tok_s_total"):
    c = by[(host, b)]
    best = max(c, key=lambda s: c[s][col])
    second = max((c[s][col] for s in c if s != best), default=0)
    return best if c[best][col] > second * (1 + TIE) else "tie"


md = []
for host in sorted({r["host"] for r in rows}):
    streams = sorted(b for (h, b) in by if h == host)
    md.append(f"**{host}** (cache {by[(host, streams[0])]['offload']['cache_slots']} slots; "
              "tok/s per stream / total, simulator and model; hybrid at the model's fetch fraction)")
    md.append("")
    md.append("| streams | offload | hybrid (f) | cpu | offload miss | hybrid miss | best (sim) | best (model) | max sim-vs-model |")
    md.append("|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for b in streams:
        c = by[(host, b)]
        cell = lambda s: (f"{c[s]['sim_tok_s_per_stream']:.1f} / {c[s]['sim_tok_s_total']:.1f} "
                          f"(model {c[s]['model_tok_s_per_stream']:.1f} / {c[s]['model_tok_s_total']:.1f})")
        dev = max(abs(c[s]["sim_vs_model_pct"]) for s in c)
        md.append(f"| {b} | {cell('offload')} | {cell('hybrid')} (f={c['hybrid']['fetch_fraction']:.2f}) | {cell('cpu')} | "
                  f"{100 * c['offload']['miss_rate']:.1f}% | {100 * c['hybrid']['miss_rate']:.1f}% | "
                  f"{winner(host, b)} | {winner(host, b, 'model_tok_s_total')} | {dev:.1f}% |")
    md.append("")

# Runtime half, where it ran: the measured numbers beside the simulation of the GPU host.
runtime = []
if (raw / "runtime.csv").exists():
    def find(doc, key):
        if isinstance(doc, dict):
            if key in doc and isinstance(doc[key], (int, float)):
                return doc[key]
            for v in doc.values():
                x = find(v, key)
                if x is not None:
                    return x
        elif isinstance(doc, list):
            for v in doc:
                x = find(v, key)
                if x is not None:
                    return x
        return None
    gpu_host = "h200-xeon-emr"
    with open(raw / "runtime.csv", newline="") as f:
        for r in csv.DictReader(f):
            doc = json.loads((raw / r["json"]).read_text())
            b = int(r["streams"])
            sim = by.get((gpu_host, b), {}).get(r["strategy"], {})
            runtime.append({
                "strategy": r["strategy"],
                "streams": b,
                "measured_tok_s_total": find(doc, "tok_s_total"),
                "measured_miss_rate": find(doc, "miss_rate"),
                "sim_tok_s_total": sim.get("sim_tok_s_total"),
                "model_tok_s_total": sim.get("model_tok_s_total"),
            })
    if runtime:
        with open(out / "runtime.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(runtime[0]))
            w.writeheader()
            w.writerows(runtime)
        md.append("**Runtime (GPU machine)**: measured total tok/s beside the simulator and the model")
        md.append("")
        md.append("| strategy | streams | measured | simulator | model | measured miss rate |")
        md.append("|---|---:|---:|---:|---:|---:|")
        for r in runtime:
            md.append(f"| {r['strategy']} | {r['streams']} | {r['measured_tok_s_total']} | {r['sim_tok_s_total']} | "
                      f"{r['model_tok_s_total']} | {r['measured_miss_rate']} |")
        md.append("")
(out / "summary.md").write_text("\n".join(md))

f = FIELD_HOST
fs = sorted(b for (h, b) in by if h == f)
tot = lambda s: [by[(f, b)][s]["sim_tok_s_total"] for b in fs]
per = lambda s: [by[(f, b)][s]["sim_tok_s_per_stream"] for b in fs]
gain = lambda b: 100 * (by[(f, b)]["hybrid"]["sim_tok_s_total"] / by[(f, b)]["offload"]["sim_tok_s_total"] - 1)
off_tot = tot("offload")
conclusions = {
    "winner_at_1_stream": winner(f, 1),
    "winner_at_2_streams": winner(f, 2),
    f"winner_at_{fs[-1]}_streams": winner(f, fs[-1]),
    "model_winner_at_2_streams": winner(f, 2, "model_tok_s_total"),
    "hybrid_gain_1_stream_pct": round(gain(1), 1),
    "hybrid_gain_2_streams_pct": round(gain(2), 1),
    "hybrid_gain_grows_with_streams": gain(fs[-1]) > gain(1),
    "hybrid_total_rises_with_streams": all(a < b for a, b in zip(tot("hybrid"), tot("hybrid")[1:])),
    "offload_total_falls_at_most_streams": off_tot[-1] < max(off_tot),
    "per_stream_falls_with_streams": all(all(a > b for a, b in zip(per(s), per(s)[1:])) for s in ("offload", "hybrid", "cpu")),
    "max_abs_sim_vs_model_pct": round(max(abs(r["sim_vs_model_pct"]) for r in rows if r["host"] == f), 2),
}
(out / "conclusions.json").write_text(json.dumps(conclusions, indent=2) + "\n")
print(json.dumps(conclusions, indent=2))
