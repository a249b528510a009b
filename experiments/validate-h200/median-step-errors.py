#!/usr/bin/env python3
"""validate-h200: the model's errors against each run's median step as well as its mean.

A diagnostic beside `ft validate analyze` (whose measured tok/s is the run's total, i.e. its
mean step): the measured tok/s of a run is also taken as streams / median step of its
reported round, so that steps stalled by the machine (the 15-thread runs on the H200 VM)
weigh no more than one step each. The p90 is the nearest-rank one (it can differ from
`ft validate analyze`'s by a point). Usage: median-step-errors.py RESULT_DIR (grid.csv beside
runs/ or runs-predictions-probes.tar.gz). Standard library only.
"""
import csv, json, statistics, sys, tarfile, tempfile, os

def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]

def main(d):
    runs = os.path.join(d, "runs")
    tmp = None
    if not os.path.isdir(runs):
        tmp = tempfile.TemporaryDirectory()
        with tarfile.open(os.path.join(d, "runs-predictions-probes.tar.gz")) as t:
            t.extractall(tmp.name, members=[m for m in t.getmembers() if m.name.startswith("runs/")])
        runs = os.path.join(tmp.name, "runs")
    groups = {}
    for r in csv.DictReader(open(os.path.join(d, "grid.csv"))):
        doc = json.load(open(os.path.join(runs, f"{r['config']}-{r['strategy']}.json")))
        median_tok_s = doc["streams"] / (doc["summary"]["step_us"]["p50"] * 1e-6)
        pred, mean_tok_s = float(r["predicted_tok_s"]), float(r["measured_tok_s"])
        for key in ("all", f"threads {r['threads']}", r["strategy"]):
            g = groups.setdefault(key, ([], []))
            g[0].append(abs(pred / mean_tok_s - 1))
            g[1].append(abs(pred / median_tok_s - 1))
    print(f"{'rows':<16} {'n':>4} {'mean step: median':>18} {'p90':>7} {'median step: median':>20} {'p90':>7}")
    for key, (m, s) in groups.items():
        print(f"{key:<16} {len(m):>4} {100 * statistics.median(m):>17.1f}% {100 * q(m, .9):>6.1f}%"
              f" {100 * statistics.median(s):>19.1f}% {100 * q(s, .9):>6.1f}%")

if __name__ == "__main__":
    main(sys.argv[1])
