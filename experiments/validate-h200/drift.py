#!/usr/bin/env python3
"""validate-h200 drift.sh's analysis: each `cpu` run's time per layer over the first probe's
end-to-end `cpu` blocks of the same streams and threads (their median), in run order with
the time since the first probe ended and the run's own CPU ceiling (`cpu.stream_read_gbs`);
then per variant (layers, streams) the median and range of that ratio, how many runs were
off by more than 10%, the first and last minute apart, and the second probe's blocks over
the first's. Where the runs and the first probe's profile hold the CPU check (builds from
2026-12-05T14Z on: `cpu.cpu_check`, the profile's `cpu_checks`), each run's CPU speed against the
probe (the probe's check time over the run's), the ratio once scaled by it (what a prediction
scaled by the check would have missed), and how the ratio correlates with the ceiling and
with the check. Usage: drift.py OUT_DIR (drift.sh's folder). Standard library and
diagnose.py only.
"""
import csv, json, os, statistics, sys

from diagnose import check_speed, cpu_blocks_us, over_first_round  # the same folder


def pearson(xs, ys):
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else None


def main(d):
    p1 = cpu_blocks_us(os.path.join(d, "probe-1.profile.json"))
    probe_checks = json.load(open(os.path.join(d, "probe-1.profile.json"))).get("cpu_checks", [])
    probes = {r["probe"]: r for r in csv.DictReader(open(os.path.join(d, "probes.csv")))}
    t_probe = float(probes["probe-1"]["end_s"])
    rows, rows_by_run = [], {}
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
        speed = check_speed(doc, probe_checks)
        rows.append((float(r["start_s"]) - t_probe, layers, n, per_layer, per_layer / p1[n], ceiling, speed))
        rows_by_run[int(r["run"])] = doc
    print("probe 1: cpu blocks " + ", ".join(f"{n} stream(s) {us:.0f} us/layer" for n, us in sorted(p1.items())))
    print(f"{'after probe s':>13} {'layers':>6} {'streams':>7} {'us/layer':>9} {'run/probe':>9} {'ceiling GB/s':>12}"
          f" {'check speed':>11} {'scaled':>7}")
    for t, layers, n, us, ratio, ceiling, speed in rows:
        c = f"{ceiling:12.1f}" if ceiling else f"{'-':>12}"
        k = f"{speed:11.3f} {ratio * speed:7.3f}" if speed else f"{'-':>11} {'-':>7}"
        print(f"{t:13.1f} {layers:6d} {n:7d} {us:9.0f} {ratio:9.3f} {c} {k}")
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
    checked = [r for r in rows if r[6]]
    if checked:
        ratios = [r[4] for r in checked]
        scaled = [r[4] * r[6] for r in checked]
        with_ceiling = [r for r in checked if r[5]]
        fmt = lambda c: "n/a" if c is None else f"{c:+.2f}"
        print(f"the CPU check ({len(checked)} runs): run over probe 1 off by more than 10% in"
              f" {sum(abs(x - 1) > 0.1 for x in ratios)}, scaled by the check's speed in"
              f" {sum(abs(x - 1) > 0.1 for x in scaled)} (median {statistics.median(scaled):.3f},"
              f" {min(scaled):.3f} to {max(scaled):.3f}); run over probe against 1 / check speed"
              f" {fmt(pearson(ratios, [1 / r[6] for r in checked]))}, against the ceiling"
              f" {fmt(pearson([r[4] for r in with_ceiling], [r[5] for r in with_ceiling]))}")
    predict_checks(d, rows_by_run)
    p2_path = os.path.join(d, "probe-2.profile.json")
    if os.path.exists(p2_path):
        p2 = cpu_blocks_us(p2_path)
        print("probe 2 over probe 1, cpu blocks: " + ", ".join(
            f"{n} stream(s) {p2[n] / p1[n]:.3f}" for n in sorted(p1) if n in p2))
        for name in ("probe-1", "probe-2"):
            o = json.load(open(os.path.join(d, f"{name}.json")))["outcome"]
            print(f"{name}: bank read {o.get('stream_read_start_gbs') or 0:.1f} -> {o['stream_read_gbs']:.1f} GB/s,"
                  f" steal {o.get('host_steal_fraction') or 0:.4f}, attempts {o.get('attempts', 1)}")

def predict_checks(d, runs):
    """`ft predict --cpu-check`'s check (checks/<i>-<name>.json, taken before run i) over run
    i's own check of the same work before its first round (diagnose.over_first_round): how
    far a check taken in a process of its own sits from the one the run's engine takes
    seconds later, per name (drift.sh's FT_DRIFT_PREDICT_CHECK; the run of 2026-12-05T16:47Z
    had two, probe-bank and small-bank)."""
    folder = os.path.join(d, "checks")
    if not os.path.isdir(folder):
        return
    by_bank = {}
    for name in sorted(os.listdir(folder)):
        i, _, bank = name[:-len(".json")].partition("-")
        try:
            now = json.load(open(os.path.join(folder, name)))["cpu_check"]["now"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        ratio = over_first_round(now, runs.get(int(i)) or {})
        if ratio is not None:
            by_bank.setdefault(bank, []).append((ratio, now.get("bank_bytes", 0)))
    for bank, xs in sorted(by_bank.items()):
        ratios = sorted(x for x, _ in xs)
        walked = f" ({xs[0][1] / 2**30:.2f} GiB walked)" if xs[0][1] else ""
        print(f"ft predict --cpu-check, {bank}{walked}: its time over the next run's"
              f" check, {len(ratios)} pairs: median {statistics.median(ratios):.3f}, p10 {ratios[len(ratios) // 10]:.3f},"
              f" p90 {ratios[(9 * len(ratios)) // 10]:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
