#!/usr/bin/env python3
"""runtime-grid: an A/B of two runs of the grid (a switch on and off, a build before and
after), point by point.

Standard library only. Usage: compare.py BASE NEW [--json]
(each a folder with grid.csv, as run.sh and analyze.py write it, or a grid.csv itself).

The points are matched by what they ran (strategy, fetch fraction, streams, cache share),
not by name, so grids of older layouts compare too. Per point: total tok/s of both and
their ratio NEW / BASE; offload's and hybrid's share of their PCIe bound; the idle link per
layer where both measured it. A ratio counts as a change only beyond the noise the two runs
measured themselves: the larger of the two points' round spreads ((max - min) / median of
their interleaved rounds), or NOISE_FLOOR where neither has rounds. Where both runs read
the same-run STREAM ceiling of the CPU share, both readings are shown: a change of the
machine itself between the runs. The summary gives each
strategy's geometric mean ratio and its changes, and the paths each run took (env.txt's
switches line, and `device.cuda_tuning` of the reports where json/ is there).
"""
import csv
import json
import math
import sys
from pathlib import Path

# The least relative change called one when a point has a single round: the run-to-run
# spread of offload's tok/s on the GPU machine (experiments/runtime-grid, 2026-12-04: 1 to 3%).
NOISE_FLOOR = 0.03


def grid_path(arg):
    p = Path(arg)
    return p / "grid.csv" if p.is_dir() else p


def num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def key_of(row):
    """What a point ran: strategy, fetch fraction, streams, cache share (cpu and resident
    have no cache to speak of; older grids leave their share empty)."""
    strategy = row["strategy"]
    share = num(row.get("cache_share"))
    if strategy in ("cpu", "resident"):
        share = None
    f = num(row.get("fetch_fraction"))
    return (strategy, None if f is None else round(f, 3), int(row["streams"]),
            None if share is None else round(share, 3))


def load(arg):
    path = grid_path(arg)
    if not path.is_file():
        sys.exit(f"compare.py: {arg}: no grid.csv (run analyze.py on the folder first)")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    points = {}
    for r in rows:
        k = key_of(r)
        if k in points:
            sys.exit(f"compare.py: {path}: two rows ran {k}")
        points[k] = r
    return path.parent, points


def paths_of(folder):
    """The CUDA paths a run took, in words: the reports' `device.cuda_tuning` (with the
    engine's fetch chunks and folded combine) where json/ holds them, else env.txt's switches
    line."""
    tunings = set()
    for doc in sorted((folder / "json").glob("*.json")) if (folder / "json").is_dir() else []:
        try:
            report = json.loads(doc.read_text())
            device = report.get("device")
        except (OSError, ValueError, AttributeError):
            continue
        t = device.get("cuda_tuning") if isinstance(device, dict) else None
        if t:
            # The engine's own switches (`ft run --fetch-chunks`, `--fold-combine`, `--gate-last-chunk`,
            # `--fetch-chunking`) beside the device's paths, where the report has them.
            for key in ("fetch_chunks", "fold_combine", "gate_last_chunk", "fetch_chunking"):
                if key in report:
                    t = {**t, key: report[key]}
            tunings.add(json.dumps(t, sort_keys=True))
    if tunings:
        return "; ".join(sorted(tunings))
    env = folder / "env.txt"
    if env.is_file():
        for line in env.read_text().splitlines():
            if line.startswith("kernel and copy switches:"):
                rest = line.split(":", 1)[1].strip()
                return f"switches: {rest or 'none (defaults)'}"
    return "not recorded"


def compare(base, new):
    rows = []
    for k in sorted(set(base) | set(new), key=lambda k: tuple("" if x is None else x for x in k)):
        a, b = base.get(k), new.get(k)
        if a is None or b is None:
            rows.append({"key": k, "missing": "base" if a is None else "new"})
            continue
        ta, tb = num(a.get("tok_s_total")), num(b.get("tok_s_total"))
        ratio = tb / ta if ta and tb else None
        spreads = [s for s in (num(a.get("round_spread")), num(b.get("round_spread")))
                   if s is not None]
        noise = max(spreads) if spreads else NOISE_FLOOR
        if ratio is None:
            verdict = "?"
        elif abs(ratio - 1.0) <= noise:
            verdict = "same"
        else:
            verdict = "faster" if ratio > 1.0 else "slower"
        rows.append({
            "key": k,
            "base_tok_s": ta,
            "new_tok_s": tb,
            "ratio": ratio,
            "noise": noise,
            "verdict": verdict,
            "base_share_of_pcie_bound": num(a.get("share_of_pcie_bound")),
            "new_share_of_pcie_bound": num(b.get("share_of_pcie_bound")),
            "base_link_idle_layer_us": num(a.get("link_idle_layer_us")),
            "new_link_idle_layer_us": num(b.get("link_idle_layer_us")),
            "base_stream_read_gbs": num(a.get("stream_read_gbs")),
            "new_stream_read_gbs": num(b.get("stream_read_gbs")),
        })
    return rows


def summary_of(rows):
    by = {}
    for r in rows:
        if r.get("ratio") is None:
            continue
        s = by.setdefault(r["key"][0], {"points": 0, "log_sum": 0.0, "faster": 0, "slower": 0})
        s["points"] += 1
        s["log_sum"] += math.log(r["ratio"])
        if r["verdict"] in ("faster", "slower"):
            s[r["verdict"]] += 1
    return {k: {"points": v["points"], "geomean_ratio": math.exp(v["log_sum"] / v["points"]),
                "faster": v["faster"], "slower": v["slower"]} for k, v in sorted(by.items())}


def label(k):
    strategy, f, streams, share = k
    name = strategy if strategy != "hybrid" else f"hybrid({f:.2f})"
    cache = "" if share is None else f"{share:.2f}"
    return name, streams, cache


def pct(x):
    return "" if x is None else f"{100 * x:.1f}%"


def us(x):
    return "" if x is None else f"{x:.0f}"


def print_table(base_dir, new_dir, rows, summary):
    print(f"base: {base_dir} ({paths_of(base_dir)})")
    print(f"new:  {new_dir} ({paths_of(new_dir)})")
    print(f"{'strategy':>14} {'B':>2} {'cache':>5} {'base tok/s':>11} {'new tok/s':>10} "
          f"{'new/base':>8} {'noise':>6} {'verdict':>7} {'PCIe bound':>15} {'idle us/layer':>13} "
          f"{'STREAM GB/s':>13}")
    for r in rows:
        name, streams, cache = label(r["key"])
        if "missing" in r:
            print(f"{name:>14} {streams:>2} {cache:>5}   (only in {'new' if r['missing'] == 'base' else 'base'})")
            continue
        share = ""
        if r["base_share_of_pcie_bound"] is not None or r["new_share_of_pcie_bound"] is not None:
            share = f"{pct(r['base_share_of_pcie_bound'])}->{pct(r['new_share_of_pcie_bound'])}"
        idle = ""
        if r["base_link_idle_layer_us"] is not None and r["new_link_idle_layer_us"] is not None:
            idle = f"{us(r['base_link_idle_layer_us'])}->{us(r['new_link_idle_layer_us'])}"
        stream = ""
        if r["base_stream_read_gbs"] is not None and r["new_stream_read_gbs"] is not None:
            stream = f"{r['base_stream_read_gbs']:.0f}->{r['new_stream_read_gbs']:.0f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
        base_t = "" if r["base_tok_s"] is None else f"{r['base_tok_s']:.1f}"
        new_t = "" if r["new_tok_s"] is None else f"{r['new_tok_s']:.1f}"
        print(f"{name:>14} {streams:>2} {cache:>5} {base_t:>11} {new_t:>10} {ratio:>8} "
              f"{pct(r['noise']):>6} {r['verdict']:>7} {share:>15} {idle:>13} {stream:>13}")
    print()
    for strategy, s in summary.items():
        print(f"{strategy}: {s['points']} point(s), geometric mean new/base {s['geomean_ratio']:.3f}, "
              f"{s['faster']} faster and {s['slower']} slower beyond their noise")


def main(argv):
    args = [a for a in argv if a != "--json"]
    if len(args) != 2:
        sys.exit("usage: compare.py BASE NEW [--json]")
    base_dir, base = load(args[0])
    new_dir, new = load(args[1])
    rows = compare(base, new)
    summary = summary_of(rows)
    if "--json" in argv:
        out = {
            "base": {"path": str(base_dir), "paths": paths_of(base_dir)},
            "new": {"path": str(new_dir), "paths": paths_of(new_dir)},
            "points": [dict(r, key=dict(zip(["strategy", "fetch_fraction", "streams",
                                             "cache_share"], r["key"]))) for r in rows],
            "summary": summary,
        }
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print_table(base_dir, new_dir, rows, summary)


if __name__ == "__main__":
    main(sys.argv[1:])
