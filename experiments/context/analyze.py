#!/usr/bin/env python3
"""context analysis: hybrid's gain over offload against context, the context at which the
strategies converge, and the conclusions the CI test checks.

Reads OUTDIR/raw/{sim,model,gpu}.<host>.csv and raw/slots.csv; writes OUTDIR/context.csv,
summary.md and conclusions.json.
"""
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

FIELD_HOST = "rtx4090-2x-xeon4310"
# The strategies have "converged" once hybrid's gain over offload is below this share: about
# the run-to-run noise of an end-to-end measurement plus the model's interval at one stream.
CONVERGED_PCT = 10.0

out = Path(sys.argv[1])
raw = out / "raw"


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


slots = {r["host"]: int(r["slots"]) for r in read(raw / "slots.csv")}
gpu = {(r["host"], int(r["streams"]), int(r["context"])): int(r["gpu_slots"])
       for p in raw.glob("gpu.*.csv") for r in read(p)}
points = defaultdict(dict)  # (host, streams, context) -> values
for p in sorted(raw.glob("sim.*.csv")):
    for r in read(p):
        k = (r["host"], int(r["streams"]), int(r["context"]))
        points[k]["source"] = "simulator"
        points[k][f"sim_{r['strategy']}"] = float(r["tok_s_total"])
        points[k][f"model_{r['strategy']}"] = float(r["model_tok_s_total"])
for p in sorted(raw.glob("model.*.csv")):
    for r in read(p):
        k = (r["host"], int(r["streams"]), int(r["context"]))
        points[k].setdefault("source", "model")
        points[k][f"model_{r['strategy']}"] = float(r["model_tok_s_total"])

rows = []
for (host, b, c), v in sorted(points.items()):
    sim_gain = 100 * (v["sim_hybrid"] / v["sim_offload"] - 1) if "sim_hybrid" in v else None
    model_gain = 100 * (v["model_hybrid"] / v["model_offload"] - 1)
    src = "sim" if sim_gain is not None else "model"
    rows.append({
        "host": host,
        "streams": f"{b} stream" + ("s" if b > 1 else ""),
        "n_streams": b,
        "context": c,
        "source": v["source"],
        "offload_tok_s_total": round(v.get("sim_offload", v["model_offload"]), 3),
        "hybrid_tok_s_total": round(v.get("sim_hybrid", v["model_hybrid"]), 3),
        "sim_gain_pct": "" if sim_gain is None else round(sim_gain, 2),
        "model_gain_pct": round(model_gain, 2),
        "gain_pct": round(sim_gain if sim_gain is not None else model_gain, 2),
        "gain_from": src,
        "cache_slots": slots[host],
        "gpu_holds_slots": gpu.get((host, b, c), ""),
        "cache_fits_beside_kv": int(gpu.get((host, b, c), 0) >= slots[host]),
    })
with open(out / "context.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)


def series(host, b):
    return [r for r in rows if r["host"] == host and r["n_streams"] == b]


def converge(host, b):
    """Smallest context whose gain is below CONVERGED_PCT, or None."""
    for r in series(host, b):
        if r["gain_pct"] < CONVERGED_PCT:
            return r["context"]
    return None


md = []
for host in sorted({r["host"] for r in rows}):
    md.append(f"**{host}** ({slots[host]} expert slots, fixed; gain = hybrid tok/s over offload's, minus 1; "
              "simulator to 64K, the model alone beyond)")
    md.append("")
    md.append("| context | 1 stream: offload / hybrid tok/s | gain | 2 streams: offload / hybrid tok/s | gain | cache fits beside KV (1 / 2 streams) |")
    md.append("|---:|---:|---:|---:|---:|---|")
    for c in sorted({r["context"] for r in rows if r["host"] == host}):
        cells = []
        fits = []
        for b in (1, 2):
            r = next(r for r in series(host, b) if r["context"] == c)
            tag = "" if r["gain_from"] == "sim" else " (model)"
            cells.append(f"{r['offload_tok_s_total']:.1f} / {r['hybrid_tok_s_total']:.1f}{tag} | {r['gain_pct']:+.1f}%")
            fits.append("yes" if r["cache_fits_beside_kv"] else "no")
        md.append(f"| {c} | {cells[0]} | {cells[1]} | {' / '.join(fits)} |")
    for b in (1, 2):
        cv = converge(host, b)
        md.append("")
        md.append(f"{b} stream(s): gain below {CONVERGED_PCT:.0f}% " +
                  (f"from {cv} tokens of context." if cv else "at no context up to 4M tokens."))
    md.append("")
(out / "summary.md").write_text("\n".join(md))

f = FIELD_HOST
s1, s2 = series(f, 1), series(f, 2)
sim1 = [r for r in s1 if r["gain_from"] == "sim"]
sim2 = [r for r in s2 if r["gain_from"] == "sim"]
conclusions = {
    "winner_at_shortest_context_1_stream": "hybrid" if sim1[0]["gain_pct"] > 0 else "offload",
    "winner_at_64k_1_stream": "hybrid" if sim1[-1]["gain_pct"] > 0 else "offload",
    "gain_shrinks_with_context_1_stream": all(a["gain_pct"] > b["gain_pct"] for a, b in zip(s1, s1[1:])),
    "gain_shrinks_with_context_2_streams": all(a["gain_pct"] > b["gain_pct"] for a, b in zip(s2, s2[1:])),
    "gain_at_256_1_stream_pct": sim1[0]["gain_pct"],
    "gain_at_64k_1_stream_pct": sim1[-1]["gain_pct"],
    "gain_at_64k_2_streams_pct": sim2[-1]["gain_pct"],
    "converged_by_64k": sim1[-1]["gain_pct"] < CONVERGED_PCT,
    "converge_by_context_1_stream": converge(f, 1),
    "converge_by_context_2_streams": converge(f, 2),
}
(out / "conclusions.json").write_text(json.dumps(conclusions, indent=2) + "\n")
print(json.dumps(conclusions, indent=2))
