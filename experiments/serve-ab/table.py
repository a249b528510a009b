#!/usr/bin/env python3
"""The serve-ab table: per service and concurrency, measured decode tok/s per stream beside
the model's prediction for that strategy and what auto chose; also a CSV (table.csv)."""
import glob
import json
import os
import sys

out = sys.argv[1]
pred = {}
for n in (1, 2):
    p = os.path.join(out, f"predict-{n}.json")
    if os.path.exists(p):
        pred[n] = json.load(open(p))

def predicted(n, kind):
    d = pred.get(n)
    if not d:
        return None
    for e in d["decision"]["estimates"]:
        s = e["strategy"]
        if (s if isinstance(s, str) else s["kind"]) == kind:
            t = e["tok_s"]
            return t["value"], t["lo"], t["hi"], e.get("miss_rate")
    return None

rows = []
for f in sorted(glob.glob(os.path.join(out, "service-*.loadgen.json"))):
    tag = os.path.basename(f).split(".")[0][len("service-"):]
    kind = "hybrid" if "hybrid" in tag else "offload"
    try:
        r = json.load(open(f))
    except Exception as e:  # a failed service
        rows.append((tag, "-", "-", "-", f"unreadable: {e}", "", "", ""))
        continue
    metrics = {}
    m = os.path.join(out, f"service-{tag}.metrics.txt")
    if os.path.exists(m):
        for line in open(m):
            if line.startswith("ft_expert_miss_rate "):
                metrics["miss"] = float(line.split()[1])
    for run in r["runs"]:
        n = run["concurrency"]
        p = predicted(n, kind)
        choice = pred.get(n, {}).get("decision", {}).get("choice")
        choice = choice if isinstance(choice, str) else (choice or {}).get("kind", "?")
        rows.append((
            tag, n, f"{run['mean_decode_tok_s']:.2f}", f"{run['mean_ttft_s']:.2f}",
            f"{run['errors']}",
            f"{p[0]:.1f} [{p[1]:.1f}, {p[2]:.1f}]" if p else "n/a",
            choice,
            f"{metrics['miss']:.3f}" if "miss" in metrics else "",
        ))

head = ("service", "streams", "decode tok/s/stream", "ttft s", "errors",
        "predicted tok/s/stream [interval]", "auto's choice", "miss rate (last)")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
for n, d in sorted(pred.items()):
    print(f"\nat {n} stream(s): {d['decision_line']}")
with open(os.path.join(out, "table.csv"), "w") as c:
    c.write(",".join(h.replace(",", ";") for h in head) + "\n")
    for r in rows:
        c.write(",".join(str(x).replace(",", ";") for x in r) + "\n")
