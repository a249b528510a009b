#!/usr/bin/env python3
"""The A/B of two expert-kernel builds (or paths) from alternated `gpu_backend` runs.

Why: a kernel change moves the one-token layer by a few per cent, the size of the spread between
GPU machines, so an A/B runs the binary before and after it alternately on one machine, several
rounds, each run with its own ceilings. This reads such a folder and says, per kernel case, each
build's median queued time over the rounds, its range, its share of the run's device-copy
read+write rate, and each build against the base one.

Files: `{LABEL}{ROUND}/gpu_backend.json`, one `gpu_backend --out` folder per run, e.g.
before1/, after1/, before2/ ... (a label is letters, dashes or underscores; the round its
trailing digits). The command that made them goes in the folder's COMMAND.txt.

Usage: bench_ab.py FOLDER [--base LABEL] [--json]
  --base   the build the others are compared with (default: the first label in sort order)
  --json   the same as one JSON document instead of the table
Standard library only. Exit 1 when the folder holds no run.
"""
import json
import pathlib
import re
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import ab_cli  # noqa: E402  (the shared command line)
from ab_cli import fmt  # noqa: E402

RUN = re.compile(r"^([A-Za-z_-]+?)(\d+)$")


def case_key(row):
    """A case as `gpu_backend --only` names it: act/tokens/variant/path/experts."""
    return f"{row['act']}/{row['tokens']}/{row['variant']}/{row['path']}/{row['experts']}"


def load(folder):
    """{(case, label): [(round, queued_us, over_copy_rw)]}, and the labels in file order."""
    runs = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        m = RUN.match(sub.name)
        report = sub / "gpu_backend.json"
        if not m or not report.is_file():
            continue
        label, rnd = m[1], int(m[2])
        try:
            kernel = json.loads(report.read_text())["kernel"]
        except (OSError, ValueError, KeyError) as e:
            print(f"bench_ab: {report}: {e}", file=sys.stderr)
            continue
        for row in kernel:
            runs.setdefault((case_key(row), label), []).append(
                (rnd, row["queued_us"], row.get("over_copy_rw")))
    return runs


def summarize(runs, base):
    out = []
    cases = []
    for case, _ in runs:
        if case not in cases:
            cases.append(case)
    for case in cases:
        labels = sorted(lab for c, lab in runs if c == case)
        b = base if base in labels else labels[0]
        labels.remove(b)
        labels.insert(0, b)
        base_us = statistics.median(u for _, u, _ in runs[(case, b)])
        for lab in labels:
            rows = sorted(runs[(case, lab)])
            us = [u for _, u, _ in rows]
            share = [s for _, _, s in rows if s is not None]
            med = statistics.median(us)
            out.append({
                "case": case,
                "label": lab,
                "rounds": len(rows),
                "queued_us": med,
                "queued_us_min": min(us),
                "queued_us_max": max(us),
                "over_copy_rw": statistics.median(share) if share else None,
                "base": b,
                "vs_base": med / base_us if base_us else None,
            })
    return out


def print_table(rows):
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':>{width}} {'build':>8} {'rounds':>6} {'queued us':>9} {'min':>7} {'max':>7} "
          f"{'/copy rw':>8} {'vs base':>8}")
    for r in rows:
        print(f"{r['case']:>{width}} {r['label']:>8} {r['rounds']:>6} {fmt(r['queued_us'], '9.2f')} "
              f"{fmt(r['queued_us_min'], '7.2f')} {fmt(r['queued_us_max'], '7.2f')} "
              f"{fmt(r['over_copy_rw'], '8.3f')} "
              f"{'base' if r['label'] == r['base'] else fmt(r['vs_base'], '8.3f')}")


def main():
    ab_cli.run(__doc__, "bench_ab", "<label><round>/gpu_backend.json run", load,
               lambda runs: {lab for _, lab in runs}, summarize, print_table)


if __name__ == "__main__":
    main()
