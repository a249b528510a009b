#!/usr/bin/env python3
"""fetch-fraction analysis: hybrid's tok/s over the fetch-fraction grid, the model's optimum,
the split rules' choices, and the conclusions the CI test checks.

Reads OUTDIR/raw/{grid,split}.<name>.csv and raw/auto.<name>.json (name: field, and gpu
where the runtime half ran, with raw/runtime.csv); writes OUTDIR/fetch-fraction.<name>.csv,
marks.<name>.txt (for `ft plot --mark-x`), summary.md and conclusions.json.
"""
import csv
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
raw = out / "raw"


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def find(doc, key):
    """First numeric value under `key` anywhere in a JSON document (ft run's report)."""
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


md = []
results = {}
for name in ("field", "gpu"):
    if not (raw / f"grid.{name}.csv").exists():
        continue
    grid = read(raw / f"grid.{name}.csv")
    split = read(raw / f"split.{name}.csv")
    auto = json.loads((raw / f"auto.{name}.json").read_text())
    auto = auto if isinstance(auto, list) else [auto]
    measured = {}
    if name == "gpu" and (raw / "runtime.csv").exists():
        for r in read(raw / "runtime.csv"):
            doc = json.loads((raw / r["json"]).read_text())
            measured[(int(r["streams"]), round(float(r["fetch_fraction"]), 4))] = find(doc, "tok_s_total")
    legacy = auto[0]["legacy"]
    f_contended = legacy["fetch_fraction"]
    f_standalone = legacy["pcie_gather_gbs"] / (legacy["pcie_gather_gbs"] + legacy["cpu_moe_gbs"])
    rows, marks, per = [], [], {}
    for r in grid:
        b, f = int(r["streams"]), float(r["fetch_fraction"])
        row = {
            "streams": f"{b} stream" + ("s" if b > 1 else ""),
            "n_streams": b,
            "fetch_fraction": f,
            "sim_tok_s_total": round(float(r["tok_s_total"]), 3),
            "model_tok_s_total": round(float(r["model_tok_s_total"]), 3) if r["model_tok_s_total"] else "",
            "miss_rate": round(float(r["miss_rate"]), 4),
            "sim_bound": r["bound"],
        }
        if measured:
            row["measured_tok_s_total"] = measured.get((b, round(f, 4)), "")
        rows.append(row)
    with open(out / f"fetch-fraction.{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    split_tok = {(int(r["streams"]), round(float(r["fetch_fraction"]), 6)): float(r["tok_s_total"]) for r in split}
    for c in auto:
        b = c["streams"]
        hyb = next(s for s in c["strategies"] if s["strategy"] == "hybrid")
        off = next(s for s in c["strategies"] if s["strategy"] == "offload")
        on_grid = [r for r in rows if r["n_streams"] == b]
        best = max(on_grid, key=lambda r: r["sim_tok_s_total"])
        per[b] = {
            "model_f": hyb["fetch_fraction"],
            "sim_at_model_f": hyb["tok_s_total"],
            "model_at_model_f": hyb["model"]["tok_s_total"],
            "offload": off["tok_s_total"],
            "grid_best_f": best["fetch_fraction"],
            "grid_best": best["sim_tok_s_total"],
            "sim_at_contended": split_tok[(b, round(f_contended, 6))],
            "sim_at_standalone": split_tok[(b, round(f_standalone, 6))],
        }
        marks.append(f"{b} {hyb['fetch_fraction']:.3f}:model optimum f={hyb['fetch_fraction']:.2f}")
        marks.append(f"{b} {f_contended:.4f}:split rule, contended pair f={f_contended:.3f}")
        marks.append(f"{b} {f_standalone:.4f}:split rule, standalone pair f={f_standalone:.3f}")
    (out / f"marks.{name}.txt").write_text("\n".join(marks) + "\n")
    results[name] = (per, f_contended, f_standalone)
    md.append(f"**{auto[0]['host']}**, {auto[0]['model']}, cache {auto[0]['cache']['slots']} slots. Split rules: "
              f"p/(p+c) on the contended bench pair f = {f_contended:.3f} (the reference engine's), on the "
              f"standalone pair ({legacy['pcie_gather_gbs']:.2f} / ({legacy['pcie_gather_gbs']:.2f} + "
              f"{legacy['cpu_moe_gbs']:.2f}) GB/s) f = {f_standalone:.3f}.")
    md.append("")
    md.append("| streams | offload tok/s | best f on the grid (tok/s) | model optimum f (sim tok/s) | split rule, contended (sim tok/s) | split rule, standalone (sim tok/s) | optimum over contended split |")
    md.append("|---:|---:|---:|---:|---:|---:|---:|")
    for b, p in sorted(per.items()):
        md.append(f"| {b} | {p['offload']:.1f} | {p['grid_best_f']:.2f} ({p['grid_best']:.1f}) | "
                  f"{p['model_f']:.3f} ({p['sim_at_model_f']:.1f}) | {f_contended:.3f} ({p['sim_at_contended']:.1f}) | "
                  f"{f_standalone:.3f} ({p['sim_at_standalone']:.1f}) | {100 * (p['sim_at_model_f'] / p['sim_at_contended'] - 1):+.1f}% |")
    md.append("")
    if measured:
        # The runtime's grid (ft run, total tok/s) beside the simulator's at the same points.
        bss = sorted({b for b, _ in measured})
        sim_at = {(r["n_streams"], round(r["fetch_fraction"], 4)): r["sim_tok_s_total"] for r in rows}
        md.append("Runtime (GPU machine, `ft run`): total tok/s measured / simulated at each fetch fraction")
        md.append("")
        md.append("| f | " + " | ".join(f"{b} stream{'s' if b > 1 else ''}" for b in bss) + " |")
        md.append("|---:|" + "---:|" * len(bss))
        for f in sorted({f for _, f in measured}):
            cells = []
            for b in bss:
                m, sm = measured.get((b, f)), sim_at.get((b, f))
                cells.append(("" if m is None else f"{m:.1f}") + " / " + ("" if sm is None else f"{sm:.1f}"))
            md.append(f"| {f:g} | " + " | ".join(cells) + " |")
        best = {b: max((f for bb, f in measured if bb == b and measured[(bb, f)] is not None), key=lambda f: measured[(b, f)]) for b in bss}
        md.append("")
        md.append("Measured best f: " + ", ".join(f"{best[b]:g} at {b} stream{'s' if b > 1 else ''}" for b in bss)
                  + f" (the model's optimum: " + ", ".join(f"{per[b]['model_f']:.3f}" for b in bss if b in per) + ")")
        md.append("")
(out / "summary.md").write_text("\n".join(md))

per, f_contended, f_standalone = results["field"]
grid_step = min(b - a for a, b in zip(sorted({r for r in [float(x["fetch_fraction"]) for x in read(raw / "grid.field.csv")]}),
                                       sorted({r for r in [float(x["fetch_fraction"]) for x in read(raw / "grid.field.csv")]})[1:]))
bs = sorted(per)
conclusions = {
    "split_rule_contended_f": round(f_contended, 4),
    "split_rule_standalone_f": round(f_standalone, 4),
    **{f"model_optimum_f_{b}_streams": round(per[b]["model_f"], 3) for b in bs},
    **{f"grid_best_f_{b}_streams": per[b]["grid_best_f"] for b in bs},
    "model_optimum_within_a_grid_step_of_best": all(abs(per[b]["model_f"] - per[b]["grid_best_f"]) <= grid_step + 1e-9 for b in bs),
    "model_optimum_at_least_grid_best": all(per[b]["sim_at_model_f"] >= per[b]["grid_best"] * 0.99 for b in bs),
    "optimum_interior": all(0 < per[b]["grid_best_f"] < 1 for b in bs),
    "hybrid_at_optimum_beats_offload": all(per[b]["sim_at_model_f"] > per[b]["offload"] for b in bs),
    # Within 2%: the contended split is a near tie with the optimum on this host.
    "contended_split_within_2pct_of_optimum": all(abs(per[b]["sim_at_contended"] / per[b]["sim_at_model_f"] - 1) < 0.02 for b in bs),
    f"standalone_split_loss_{bs[-1]}_streams_pct": round(100 * (1 - per[bs[-1]]["sim_at_standalone"] / per[bs[-1]]["sim_at_model_f"]), 2),
    "standalone_split_loses_at_most_streams": per[bs[-1]]["sim_at_standalone"] < 0.97 * per[bs[-1]]["sim_at_model_f"],
    f"optimum_over_contended_split_{bs[0]}_stream_pct": round(100 * (per[bs[0]]["sim_at_model_f"] / per[bs[0]]["sim_at_contended"] - 1), 2),
    f"optimum_over_contended_split_{bs[-1]}_streams_pct": round(100 * (per[bs[-1]]["sim_at_model_f"] / per[bs[-1]]["sim_at_contended"] - 1), 2),
    "optimum_f_falls_with_streams": per[bs[-1]]["model_f"] < per[bs[0]]["model_f"],
}
(out / "conclusions.json").write_text(json.dumps(conclusions, indent=2) + "\n")
print(json.dumps(conclusions, indent=2))
