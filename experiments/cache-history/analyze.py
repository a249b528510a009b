#!/usr/bin/env python3
"""cache-history analysis: per-window miss rates and tok/s rebuilt from cumulative runs,
the cold and warm comparison, and the conclusions the CI test checks.

Reads OUTDIR/raw/{cold,warm}.<name>.csv (name: field, and gpu where the runtime half ran,
with raw/runtime.csv); writes OUTDIR/trajectory.<name>.csv, summary.md, conclusions.json.
"""
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

# A strategy's cache has "warmed" once its window miss rate is within this many points of
# its warm (steady-state) miss rate.
WARM_WITHIN = 0.02
# The first request of the field report's fresh service: 256 decode steps.
FIRST_REQUEST = 256

out = Path(sys.argv[1])
raw = out / "raw"


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cumulative(rows):
    """(strategy, streams) -> sorted [(steps, step_ms, miss_rate, tok_s_per_stream)]."""
    by = defaultdict(list)
    for r in rows:
        by[(r["strategy"], int(r["streams"]))].append(
            (int(r["steps"]), float(r["step_ms"]), float(r["miss_rate"]), float(r["tok_s_per_stream"])))
    return {k: sorted(v) for k, v in by.items()}


def windows(points):
    """Per window between consecutive runs: (end step, miss rate, tok/s per stream)."""
    out, prev = [], (0, 0.0, 0.0, 0.0)
    for n, t, m, _ in points:
        n0, t0, m0, _ = prev
        dt = (n * t - n0 * t0) / (n - n0)
        dm = (n * m - n0 * m0) / (n - n0)
        out.append((n, min(max(dm, 0.0), 1.0), 1e3 / dt))
        prev = (n, t, m, 0.0)
    return out


md, concl = [], {}
for name in ("field", "gpu"):
    if not (raw / f"cold.{name}.csv").exists():
        continue
    cold = cumulative(read(raw / f"cold.{name}.csv"))
    warm = cumulative(read(raw / f"warm.{name}.csv"))
    # Runtime half: per-step records of one cold run per (strategy, streams), summed into
    # the same windows as the simulator's.
    measured, whole = {}, []
    if name == "gpu" and (raw / "runtime.csv").exists():
        for r in read(raw / "runtime.csv"):
            doc = json.loads((raw / r["json"]).read_text())
            summ = doc.get("summary", {})
            whole.append((r["phase"], r["strategy"], int(r["streams"]), doc.get("layers"), doc.get("cache_slots"),
                          summ.get("steps"), summ.get("tok_s_per_stream"), summ.get("miss_rate")))
            if r["phase"] != "cold":
                continue
            steps = [s for s in doc.get("step_records", []) if not s.get("warmup")]
            measured[(r["strategy"], int(r["streams"]))] = steps
    rows = []
    for key in sorted(cold):
        s, b = key
        cw, ww = windows(cold[key]), windows(warm[key])
        mc = []
        if measured.get(key):
            steps, prev = measured[key], 0
            for n, *_ in cold[key]:
                win = steps[prev:n]
                if not win:
                    break
                hits = sum(x["totals"]["hits"] for x in win)
                misses = sum(x["totals"]["misses"] for x in win)
                wall = sum(x["wall_us"] for x in win) / len(win)
                mc.append((n, misses / max(1, hits + misses), 1e6 / wall))
                prev = n
        for i, (n, m, tok) in enumerate(cw):
            row = {
                "strategy": s,
                "streams": b,
                "step": n,
                "cold_window_miss_rate": round(m, 4),
                "cold_window_tok_s": round(tok, 3),
                "cold_cumulative_miss_rate": round(cold[key][i][2], 4),
                "cold_cumulative_tok_s": round(cold[key][i][3], 3),
                "warm_window_miss_rate": round(ww[i][1], 4),
                "warm_window_tok_s": round(ww[i][2], 3),
            }
            if i < len(mc):
                row["measured_cold_window_miss_rate"] = round(mc[i][1], 4)
                row["measured_cold_window_tok_s"] = round(mc[i][2], 3)
            rows.append(row)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / f"trajectory.{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)

    def at(s, b, n, which):
        return next(p for p in which[(s, b)] if p[0] == n)

    longest = max(p[0] for p in cold[("offload", 1)])
    first = min((p[0] for p in cold[("offload", 1)] if p[0] >= FIRST_REQUEST), default=longest)
    md.append(f"**{name}** host: cumulative means over the first N decode steps (cold) and over N steps "
              f"after a warm-up (warm); hybrid at f = {float(read(raw / f'cold.{name}.csv')[1]['fetch_fraction']):.3f}")
    md.append("")
    md.append("| streams | N | offload cold: tok/s, miss | hybrid cold: tok/s, miss | hybrid over offload, cold | offload warm | hybrid warm | hybrid over offload, warm |")
    md.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
    stats = {}
    for b in (1, 2):
        for n in sorted({first, longest}):
            oc, hc = at("offload", b, n, cold), at("hybrid", b, n, cold)
            ow, hw = at("offload", b, n, warm), at("hybrid", b, n, warm)
            gc, gw = 100 * (hc[3] / oc[3] - 1), 100 * (hw[3] / ow[3] - 1)
            stats[(b, n)] = (oc, hc, ow, hw, gc, gw)
            md.append(f"| {b} | {n} | {oc[3]:.1f}, {100 * oc[2]:.1f}% | {hc[3]:.1f}, {100 * hc[2]:.1f}% | {gc:+.1f}% | "
                      f"{ow[3]:.1f}, {100 * ow[2]:.1f}% | {hw[3]:.1f}, {100 * hw[2]:.1f}% | {gw:+.1f}% |")
    md.append("")

    def warmed_by(s, b):
        """First window end whose cold miss rate is within WARM_WITHIN of the warm one."""
        steady = at(s, b, longest, warm)[2]
        for n, m, _ in windows(cold[(s, b)]):
            if m <= steady + WARM_WITHIN:
                return n
        return None

    if whole:
        md.append(f"Runtime (GPU machine, `ft run`, {whole[0][3]} layers, {whole[0][4]} cache slots) over its whole "
                  f"run of {whole[0][5]} steps, beside the simulator of the same configuration:")
        md.append("")
        md.append("| phase | strategy | streams | measured tok/s per stream | simulator | measured miss rate | simulator |")
        md.append("|---|---|---:|---:|---:|---:|---:|")
        for phase, s, b, _, _, n, tok, miss in sorted(whole):
            sim = at(s, b, longest, cold if phase == "cold" else warm)
            fmt = lambda v, spec: "" if v is None else format(v, spec)
            md.append(f"| {phase} | {s} | {b} | {fmt(tok, '.1f')} | {sim[3]:.1f} | {fmt(miss, '.3f')} | {sim[2]:.3f} |")
        md.append("")
    md.append("| streams | steady miss rate: offload / hybrid | cold window within 2 points of it by step: offload / hybrid |")
    md.append("|---:|---:|---:|")
    for b in (1, 2):
        so, sh = at("offload", b, longest, warm)[2], at("hybrid", b, longest, warm)[2]
        md.append(f"| {b} | {100 * so:.1f}% / {100 * sh:.1f}% | {warmed_by('offload', b)} / {warmed_by('hybrid', b)} |")
    md.append("")
    if name == "field":
        oc, hc, ow, hw, gc, gw = stats[(1, first)]
        wo, wh = warmed_by("offload", 1), warmed_by("hybrid", 1)
        concl = {
            "first_request_steps": first,
            "warm_hybrid_misses_more_than_offload": all(at("hybrid", b, longest, warm)[2] > at("offload", b, longest, warm)[2] for b in (1, 2)),
            "hybrid_warms_slower_than_offload": (wh is None) or (wo is not None and wh > wo),
            "offload_warm_faster_than_cold": all(stats[(b, first)][2][3] > stats[(b, first)][0][3] for b in (1, 2)),
            "hybrid_warm_faster_than_cold": all(stats[(b, first)][3][3] > stats[(b, first)][1][3] for b in (1, 2)),
            "winner_cold_1_stream": "hybrid" if gc > 0 else "offload",
            "winner_warm_1_stream": "hybrid" if gw > 0 else "offload",
            "hybrid_gain_cold_1_stream_pct": round(gc, 1),
            "hybrid_gain_warm_1_stream_pct": round(gw, 1),
            "hybrid_gain_larger_warm_than_cold_1_stream": gw > gc,
            "steady_miss_rate_offload_2_streams": round(at("offload", 2, longest, warm)[2], 3),
            "steady_miss_rate_hybrid_2_streams": round(at("hybrid", 2, longest, warm)[2], 3),
        }
(out / "summary.md").write_text("\n".join(md))
(out / "conclusions.json").write_text(json.dumps(concl, indent=2) + "\n")
print(json.dumps(concl, indent=2))
