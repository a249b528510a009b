#!/usr/bin/env python3
"""The A/B of an engine switch from `ft run --json` reports, alternated in one call.

Why: a switch's effect on offload (a few per cent) is the size of the spread between GPU
machines, so an A/B runs both settings alternately on one machine, several rounds, and compares
them round by round. This reads such a folder and says, per stream count, each setting's
median tok/s per stream over the rounds, its spread, its share of the PCIe bound and where the
link idles, and each setting against the base one.

Files: `b{STREAMS}-r{ROUND}-{LABEL}.json`, one `ft run --json` report each (with `--repeat N`
its summary is the median repetition), e.g. b1-r2-g0.json. The command that made them goes in
the folder's COMMAND.txt.

Usage: switch_ab.py FOLDER [--base LABEL] [--json]
  --base   the setting the others are compared with (default: the first label in sort order)
  --json   the same as one JSON document instead of the table
Standard library only. Exit 1 when the folder holds no report.
"""
import json
import pathlib
import re
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import ab_cli  # noqa: E402  (the shared command line)
from ab_cli import fmt  # noqa: E402

NAME = re.compile(r"^b(\d+)-r(\d+)-(.+)\.json$")
IDLE_PARTS = ("dense_us", "fetched_experts_us", "combine_us", "host_us", "gaps_us")


def load(folder):
    """{(streams, label): [report summary dicts in round order]}"""
    runs = {}
    for path in sorted(folder.iterdir()):
        m = NAME.match(path.name)
        if not m:
            continue
        streams, rnd, label = int(m[1]), int(m[2]), m[3]
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"switch_ab: {path}: {e}", file=sys.stderr)
            continue
        s = report.get("summary", {})
        idle = s.get("link_idle_per_layer") or {}
        runs.setdefault((streams, label), []).append(
            (rnd, {
                "tok_s": s.get("tok_s_per_stream"),
                "share": (report.get("pcie") or {}).get("share_of_bound"),
                "idle_us": idle.get("total_us"),
                **{k: idle.get(k) for k in IDLE_PARTS},
            }))
    return {k: [r for _, r in sorted(v, key=lambda x: x[0])] for k, v in runs.items()}


def median_of(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(runs, base):
    out = []
    for streams in sorted({s for s, _ in runs}):
        labels = sorted(lab for s, lab in runs if s == streams)
        b = base if base in labels else labels[0]
        base_tok = median_of(runs[(streams, b)], "tok_s")
        for lab in labels:
            rows = runs[(streams, lab)]
            toks = [r["tok_s"] for r in rows if r["tok_s"] is not None]
            med = statistics.median(toks) if toks else None
            out.append({
                "streams": streams,
                "label": lab,
                "rounds": len(rows),
                "tok_s_per_stream": med,
                "tok_s_min": min(toks) if toks else None,
                "tok_s_max": max(toks) if toks else None,
                "spread": (max(toks) - min(toks)) / med if toks and med else None,
                "share_of_bound": median_of(rows, "share"),
                "link_idle_us": median_of(rows, "idle_us"),
                **{f"idle_{k}": median_of(rows, k) for k in IDLE_PARTS},
                "base": b,
                "vs_base": med / base_tok if med and base_tok else None,
            })
    return out


def print_table(rows):
    print(f"{'streams':>7} {'setting':>8} {'rounds':>6} {'tok/s/str':>9} {'min':>7} {'max':>7} "
          f"{'spread':>6} {'%bound':>6} {'idle us':>7} {'dense':>5} {'fetched':>7} {'combine':>7} "
          f"{'host':>5} {'vs base':>8}")
    for r in rows:
        print(f"{r['streams']:>7} {r['label']:>8} {r['rounds']:>6} {fmt(r['tok_s_per_stream'], '9.1f')} "
              f"{fmt(r['tok_s_min'], '7.1f')} {fmt(r['tok_s_max'], '7.1f')} {fmt(r['spread'], '6.3f')} "
              f"{fmt(r['share_of_bound'] and 100 * r['share_of_bound'], '6.1f')} "
              f"{fmt(r['link_idle_us'], '7.1f')} {fmt(r['idle_dense_us'], '5.1f')} "
              f"{fmt(r['idle_fetched_experts_us'], '7.1f')} {fmt(r['idle_combine_us'], '7.1f')} "
              f"{fmt(r['idle_host_us'], '5.1f')} "
              f"{'base' if r['label'] == r['base'] else fmt(r['vs_base'], '8.3f')}")


def main():
    ab_cli.run(__doc__, "switch_ab", "b<streams>-r<round>-<label>.json report", load,
               lambda runs: {lab for _, lab in runs}, summarize, print_table)


if __name__ == "__main__":
    main()
