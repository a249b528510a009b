#!/usr/bin/env python3
"""pool-wait (and host-submit): from raw/*.json, one CSV row per run (results.csv), every
measured step over its run's median (steps.csv), the tok/s of each A/B pair (pairs.csv) and
the table (summary.txt).

Usage: summarize.py OUTDIR [KNOB A B] (default: pool-wait spin spin-beside). KNOB is the
`ft run` flag the A/B switches; its value is read from each report's field of the same name
(dashes as underscores).

A stalled step is one slower than twice its run's median measured step: what a worker
preempted in the middle of a tile costs (the layer waits for it). Per layer with a CPU share,
the host thread's own time (`host_submit_us`: planning and queueing GPU work before the share
and the merge after it) and its wait for the activations (`host_wait_us`) show where the
host's arrangement moves time."""
import csv
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1])
knob, a_value, b_value = (sys.argv[2:5] if len(sys.argv) >= 5
                          else ("pool-wait", "spin", "spin-beside"))
field = knob.replace("-", "_")
rows = []
steps = []
for f in sorted((out / "raw").glob("*.json")):
    d = json.load(open(f))
    s = d["summary"]
    measured = [r for r in d["step_records"] if not r["warmup"]]
    walls = [r["wall_us"] for r in measured]
    p50 = statistics.median(walls)
    cpu_layers = [l for r in measured for l in r["layers"] if l["cpu"] > 0]
    mean = lambda key: statistics.mean(l[key] for l in cpu_layers) if cpu_layers else 0.0
    value = d.get(field, "")
    for w in walls:
        steps.append(
            {
                field: value,
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
            field: value,
            "tok_s": round(s["tok_s_total"], 1),
            "step_p50_us": round(p50, 1),
            "step_p90_us": round(s["step_us"]["p90"], 1),
            "step_max_us": round(max(walls), 1),
            "mean_over_p50": round(statistics.mean(walls) / p50, 3),
            "stalled_steps": sum(1 for w in walls if w > 2 * p50),
            "steps": len(walls),
            "cpu_busy_us": round(s["cpu_busy_us"], 1),
            "cpu_layer_host_submit_us": round(mean("host_submit_us"), 1),
            "cpu_layer_host_wait_us": round(mean("host_wait_us"), 1),
            "cpu_layer_cpu_busy_us": round(mean("cpu_busy_us"), 1),
            "steal": d.get("host_steal_fraction"),
        }
    )
if not rows:
    sys.exit(f"{knob}: no run produced a report")
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
    pairs.setdefault((r["strategy"], r["streams"]), {})[r[field]] = r
with open(out / "pairs.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    # a: the first value (y of pairs.svg), b: the second.
    w.writerow(["strategy", "streams", "a_value", "b_value", "b_tok_s", "a_tok_s"])
    for (strategy, streams), p in sorted(pairs.items()):
        if a_value in p and b_value in p:
            w.writerow([strategy, streams, a_value, b_value,
                        p[b_value]["tok_s"], p[a_value]["tok_s"]])
lines = [
    f"{'strategy':<8} {'streams':>7} {'threads':>7} {knob:<12} {'tok/s':>8} "
    f"{'p50 us':>9} {'max us':>9} {'mean/p50':>8} {'stalled':>8} {'cpu us':>9}"
    f"  per CPU layer: {'host':>6} {'wait':>6} {'cpu':>7} us"
]
for r in sorted(rows, key=lambda r: (r["strategy"], r["streams"], r[field])):
    lines.append(
        f"{r['strategy']:<8} {r['streams']:>7} {r['threads']:>7} {r[field]:<12} "
        f"{r['tok_s']:>8.1f} {r['step_p50_us']:>9.1f} {r['step_max_us']:>9.1f} "
        f"{r['mean_over_p50']:>8.3f} {r['stalled_steps']:>4}/{r['steps']:<3} {r['cpu_busy_us']:>9.1f}"
        f"  {'':>14} {r['cpu_layer_host_submit_us']:>6.1f} {r['cpu_layer_host_wait_us']:>6.1f}"
        f" {r['cpu_layer_cpu_busy_us']:>7.1f}"
    )
lines.append("")
lines.append(f"{a_value} against {b_value} (tok/s ratio, stalled steps)")
for (strategy, streams), p in sorted(pairs.items()):
    if a_value in p and b_value in p:
        a, b = p[a_value], p[b_value]
        lines.append(
            f"{strategy:<8} {streams:>2} streams: {a['tok_s'] / b['tok_s']:.3f}x, "
            f"stalled {a['stalled_steps']} against {b['stalled_steps']}"
        )
text = "\n".join(lines) + "\n"
(out / "summary.txt").write_text(text)
print(text, end="")
