#!/usr/bin/env python3
"""Per-phase span durations of `ft run --trace-out` Chrome traces, per layer, measured steps
only: median and p90 in us, and each phase's share of the step. Usage: trace-phases.py TRACE..."""
import json, re, statistics, sys, collections

for path in sys.argv[1:]:
    d = json.load(open(path))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    steps = [e for e in ev if e.get("ph") == "X" and e["name"].startswith("step ") and "warm" not in e["name"]]
    if not steps:
        continue
    lo = min(s["ts"] for s in steps)
    step_us = statistics.median(s["dur"] for s in steps)
    per = collections.defaultdict(list)
    layers = set()
    for e in ev:
        if e.get("ph") != "X" or e["ts"] < lo or e["name"].startswith("step "):
            continue
        m = re.match(r"(.*) L(\d+)$", e["name"])
        if not m:
            continue
        layers.add(int(m.group(2)))
        per[m.group(1)].append(e["dur"])
    n_steps, n_layers = len(steps), max(len(layers), 1)
    print(f"== {path}: {n_steps} steps, {n_layers} layers, step {step_us:.1f} us = {step_us / n_layers:.1f} us/layer")
    for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        v.sort()
        per_layer = sum(v) / (n_steps * n_layers)
        print(f"  {name:24s} n/layer {len(v) / (n_steps * n_layers):4.1f}  median {statistics.median(v):8.1f}  "
              f"p90 {v[int(0.9 * (len(v) - 1))]:8.1f}  sum/layer {per_layer:8.1f} us")
