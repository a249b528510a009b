#!/usr/bin/env python3
"""pool-wait: from raw/*.json, one CSV row per run (results.csv), every measured step over its
run's median (steps.csv), the tok/s of each A/B pair (pairs.csv) and the table (summary.txt).

A stalled step is one slower than twice its run's median measured step: what a worker
preempted in the middle of a tile costs (the layer waits for it)."""
import csv
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1])
rows = []
steps = []
for f in sorted((out / "raw").glob("*.json")):
    d = json.load(open(f))
    s = d["summary"]
    walls = [r["wall_us"] for r in d["step_records"] if not r["warmup"]]
    p50 = statistics.median(walls)
    for w in walls:
        steps.append(
            {
                "pool_wait": d["pool_wait"],
                "strategy": d["strategy"].split("(")[0],
                "streams": d["streams"],
                "step_over_median": round(w / p50, 4),
            }
        )
    rows.append(
        {
            "strategy": d["strategy"].split("(")[0],
            "streams": d["streams"],
            "threads": d["threads"],
            "pool_wait": d["pool_wait"],
            "tok_s": round(s["tok_s_total"], 1),
            "step_p50_us": round(p50, 1),
            "step_p90_us": round(s["step_us"]["p90"], 1),
            "step_max_us": round(max(walls), 1),
            "mean_over_p50": round(statistics.mean(walls) / p50, 3),
            "stalled_steps": sum(1 for w in walls if w > 2 * p50),
            "steps": len(walls),
            "cpu_busy_us": round(s["cpu_busy_us"], 1),
            "steal": d.get("host_steal_fraction"),
        }
    )
if not rows:
    sys.exit("pool-wait: no run produced a report")
with open(out / "results.csv", "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
with open(out / "steps.csv", "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(steps[0]))
    w.writeheader()
    w.writerows(steps)
pairs = {}
for r in rows:
    pairs.setdefault((r["strategy"], r["streams"]), {})[r["pool_wait"]] = r
with open(out / "pairs.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(["strategy", "streams", "spin_beside_tok_s", "spin_tok_s"])
    for (strategy, streams), p in sorted(pairs.items()):
        if "spin" in p and "spin-beside" in p:
            w.writerow([strategy, streams, p["spin-beside"]["tok_s"], p["spin"]["tok_s"]])
lines = [
    f"{'strategy':<8} {'streams':>7} {'threads':>7} {'pool wait':<12} {'tok/s':>8} "
    f"{'p50 us':>9} {'max us':>9} {'mean/p50':>8} {'stalled':>8} {'cpu us':>9}"
]
for r in sorted(rows, key=lambda r: (r["strategy"], r["streams"], r["pool_wait"])):
    lines.append(
        f"{r['strategy']:<8} {r['streams']:>7} {r['threads']:>7} {r['pool_wait']:<12} "
        f"{r['tok_s']:>8.1f} {r['step_p50_us']:>9.1f} {r['step_max_us']:>9.1f} "
        f"{r['mean_over_p50']:>8.3f} {r['stalled_steps']:>4}/{r['steps']:<3} {r['cpu_busy_us']:>9.1f}"
    )
lines.append("")
lines.append("spin against spin-beside (tok/s ratio, stalled steps)")
for (strategy, streams), p in sorted(pairs.items()):
    if "spin" in p and "spin-beside" in p:
        a, b = p["spin"], p["spin-beside"]
        lines.append(
            f"{strategy:<8} {streams:>2} streams: {a['tok_s'] / b['tok_s']:.3f}x, "
            f"stalled {a['stalled_steps']} against {b['stalled_steps']}"
        )
text = "\n".join(lines) + "\n"
(out / "summary.txt").write_text(text)
print(text, end="")
