#!/usr/bin/env python3
"""concurrency analysis: tidy the sweeps into one table, write the README's summary and the
conclusions the CI test checks.

Reads OUTDIR/raw/sim.<host>.csv (and raw/runtime.csv with its JSON files and
raw/runtime-sim.csv, the simulator on the runtime's configuration, where the runtime half ran); writes OUTDIR/concurrency.csv, runtime.csv (runtime half only), summary.md and
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

# Runtime half, where it ran: the measured numbers beside the simulation (and the model) of
# the GPU host on the same L-layer model, cache, context and steps (raw/runtime-sim.csv).
runtime = []
if (raw / "runtime.csv").exists():
    rt_sim = {}
    if (raw / "runtime-sim.csv").exists():
        with open(raw / "runtime-sim.csv", newline="") as f:
            for r in csv.DictReader(f):
                rt_sim[(r["strategy"], int(r["streams"]))] = r

    def num(r, key, digits=3):
        v = r.get(key)
        return round(float(v), digits) if v not in (None, "") else None

    with open(raw / "runtime.csv", newline="") as f:
        for r in csv.DictReader(f):
            doc = json.loads((raw / r["json"]).read_text())
            s = doc.get("summary", doc)
            b = int(r["streams"])
            sim = rt_sim.get((r["strategy"], b), {})
            measured = s.get("tok_s_total")
            sim_tok = num(sim, "tok_s_total")
            runtime.append({
                "strategy": r["strategy"],
                "streams": b,
                "layers": doc.get("layers"),
                "cache_slots": doc.get("cache_slots"),
                "fetch_fraction": doc.get("fetch_fraction"),
                "measured_tok_s_total": round(measured, 3) if measured is not None else None,
                "measured_miss_rate": round(s["miss_rate"], 4) if s.get("miss_rate") is not None else None,
                "sim_tok_s_total": sim_tok,
                "sim_miss_rate": num(sim, "miss_rate", 4),
                "model_tok_s_total": num(sim, "model_tok_s_total"),
                "measured_vs_sim_pct": round(100 * (measured / sim_tok - 1), 1) if measured and sim_tok else None,
            })
    if runtime:
        with open(out / "runtime.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(runtime[0]))
            w.writeheader()
            w.writerows(runtime)
        md.append(f"**Runtime (GPU machine)**: measured total tok/s ({runtime[0]['layers']} layers, "
                  f"{runtime[0]['cache_slots']} cache slots) beside the simulator and the model of the same configuration")
        md.append("")
        md.append("| strategy | streams | f | measured | simulator | model | measured vs sim | measured miss rate | sim miss rate |")
        md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        fmt = lambda v, spec="": "" if v is None else format(v, spec)
        for r in sorted(runtime, key=lambda r: (r["strategy"], r["streams"])):
            md.append(f"| {r['strategy']} | {r['streams']} | {fmt(r['fetch_fraction'], '.3f')} | {fmt(r['measured_tok_s_total'], '.1f')} | "
                      f"{fmt(r['sim_tok_s_total'], '.1f')} | {fmt(r['model_tok_s_total'], '.1f')} | {fmt(r['measured_vs_sim_pct'], '+.1f')}% | "
                      f"{fmt(r['measured_miss_rate'], '.3f')} | {fmt(r['sim_miss_rate'], '.3f')} |")
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
