#!/usr/bin/env python3
"""validate-h200: the hypervisor's steal time during each configuration of a grid that ran
before `ft run` recorded it (`host_steal_fraction`, added 2026-12-04 after the 20:46Z grid).

scripts/device-run.sh samples the machine's /proc/stat "cpu" line once a second into
procstat.txt. A configuration's runs span from its `logs/<config>-run.log` (written as the run
starts) to the last of its `runs/<config>-*.json` (written as it ends); the file times come
from the result archive (tar keeps them; a git checkout does not). This script writes
steal.csv (config, start and end in seconds after the first sample, steal share) and
grid-with-steal.csv, the grid with its `host_steal` column filled, for
`ft validate analyze grid-with-steal.csv`.

Usage: steal.py RESULT_DIR (procstat.txt, grid.csv, runs-predictions-probes.tar.xz or .gz).
Standard library only.
"""
import csv
import os
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diagnose import archive  # noqa: E402 (the same folder)


def samples(path):
    """(unix time, own ticks, stolen ticks) per line of procstat.txt."""
    out = []
    for line in open(path):
        f = line.split()
        if len(f) < 10 or f[1] != "cpu":
            continue
        v = [int(x) for x in f[2:]]
        out.append((int(f[0]), sum(v[:7]), v[7]))
    return out


def steal_between(s, start, end):
    """Stolen share of the ticks from the last sample at or before `start` to the first at
    or after `end`."""
    a = max((x for x in s if x[0] <= start), default=s[0])
    b = min((x for x in s if x[0] >= end), default=s[-1])
    own, stolen = b[1] - a[1], b[2] - a[2]
    return stolen / (own + stolen) if own + stolen > 0 else 0.0


def main(d):
    s = samples(os.path.join(d, "procstat.txt"))
    start, end = {}, {}
    with tarfile.open(archive(d, "runs-predictions-probes")) as t:
        for m in t.getmembers():
            name = os.path.basename(m.name)
            if m.name.startswith("logs/") and name.endswith("-run.log"):
                start[name[: -len("-run.log")]] = m.mtime
            elif m.name.startswith("runs/") and name.endswith(".json"):
                c = name.split("-")[0]
                end[c] = max(end.get(c, 0), m.mtime)
    t0 = s[0][0]
    frac = {}
    with open(os.path.join(d, "steal.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "start_s", "end_s", "host_steal"])
        for c in sorted(start):
            if c not in end:
                continue
            frac[c] = steal_between(s, start[c], end[c])
            w.writerow([c, start[c] - t0, end[c] - t0, f"{frac[c]:.4f}"])
    with open(os.path.join(d, "grid.csv")) as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0].keys())
    if "host_steal" not in fields:
        fields.append("host_steal")
    with open(os.path.join(d, "grid-with-steal.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            r["host_steal"] = f"{frac[r['config']]:.4f}" if r["config"] in frac else ""
            w.writerow(r)
    stolen = sorted(c for c, x in frac.items() if x > 0.02)
    print(f"{len(frac)} configurations; steal above 2% in: {', '.join(stolen) or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1])
