#!/usr/bin/env python3
"""validate-h200 drift.sh's analysis: each `cpu` run's time per layer over the first probe's
end-to-end `cpu` blocks of the same streams and threads (their median), in run order with
the time since the first probe ended and the run's own CPU ceiling (`cpu.stream_read_gbs`);
then per variant (layers, streams) the median and range of that ratio, how many runs were
off by more than 10%, the first and last minute apart, and the second probe's blocks over
the first's. Usage: drift.py OUT_DIR (drift.sh's folder). Standard library and diagnose.py only.
"""
import csv, json, os, statistics, sys

from diagnose import cpu_blocks_us  # the same folder

def main(d):
    p1 = cpu_blocks_us(os.path.join(d, "probe-1.profile.json"))
    probes = {r["probe"]: r for r in csv.DictReader(open(os.path.join(d, "probes.csv")))}
    t_probe = float(probes["probe-1"]["end_s"])
    rows = []
    for r in csv.DictReader(open(os.path.join(d, "runs.csv"))):
        path = os.path.join(d, "runs", f"{r['run']}.json")
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            continue
        doc = json.load(open(path))
        n, layers = int(r["streams"]), int(r["layers"])
        if n not in p1:
            continue
        per_layer = doc["summary"]["step_us"]["mean"] / layers
        ceiling = (doc.get("cpu") or {}).get("stream_read_gbs")
        rows.append((float(r["start_s"]) - t_probe, layers, n, per_layer, per_layer / p1[n], ceiling))
    print("probe 1: cpu blocks " + ", ".join(f"{n} stream(s) {us:.0f} us/layer" for n, us in sorted(p1.items())))
    print(f"{'after probe s':>13} {'layers':>6} {'streams':>7} {'us/layer':>9} {'run/probe':>9} {'ceiling GB/s':>12}")
    for t, layers, n, us, ratio, ceiling in rows:
        c = f"{ceiling:12.1f}" if ceiling else f"{'-':>12}"
        print(f"{t:13.1f} {layers:6d} {n:7d} {us:9.0f} {ratio:9.3f} {c}")
    print()
    print("per variant: run over probe 1 (median, range), off by more than 10%, first and last minute")
    for key in sorted({(r[1], r[2]) for r in rows}):
        mine = [r for r in rows if (r[1], r[2]) == key]
        ratios = [r[4] for r in mine]
        first = [r[4] for r in mine if r[0] < 60]
        last = [r[4] for r in mine if r[0] >= mine[-1][0] - 60]
        fmt = lambda v: f"{statistics.median(v):.3f}" if v else "-"
        print(f"{key[0]} layers, {key[1]} stream(s): {len(ratios)} runs, median {statistics.median(ratios):.3f}"
              f" ({min(ratios):.3f} to {max(ratios):.3f}), off > 10%: {sum(abs(x - 1) > 0.1 for x in ratios)};"
              f" first minute {fmt(first)}, last minute {fmt(last)}")
    p2_path = os.path.join(d, "probe-2.profile.json")
    if os.path.exists(p2_path):
        p2 = cpu_blocks_us(p2_path)
        print("probe 2 over probe 1, cpu blocks: " + ", ".join(
            f"{n} stream(s) {p2[n] / p1[n]:.3f}" for n in sorted(p1) if n in p2))
        for name in ("probe-1", "probe-2"):
            o = json.load(open(os.path.join(d, f"{name}.json")))["outcome"]
            print(f"{name}: bank read {o.get('stream_read_start_gbs') or 0:.1f} -> {o['stream_read_gbs']:.1f} GB/s,"
                  f" steal {o.get('host_steal_fraction') or 0:.4f}, attempts {o.get('attempts', 1)}")

if __name__ == "__main__":
    main(sys.argv[1])
