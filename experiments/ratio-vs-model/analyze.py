#!/usr/bin/env python3
"""ratio-vs-model analysis: score the legacy ratio rule and the analytic model's pick
against the simulated timeline, per configuration (host, model, streams, cache).

Reads OUTDIR/raw/ (what run.sh wrote) and writes into OUTDIR:
  decisions.csv     one row per configuration: both rules' picks, the simulated tok/s of
                    each option, each rule's regret
  regret.csv        long form (rule, regret_pct, ...) for the distribution plots
  summary.md        the tables the README quotes
  conclusions.json  the committed conclusions (checked by tests/experiments_reproduce.rs)
"""
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

# A pick is "wrong" only when the other option is faster by more than this share: smaller
# gaps are within the simulator's step-to-step noise and no rule should be blamed for them.
TIE = 0.01

out = Path(sys.argv[1])
raw = out / "raw"


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


legacy = {p.name.split(".legacy.json")[0]: json.loads(p.read_text()) for p in raw.glob("*.legacy.json")}
gpu_slots = {}
with open(raw / "gpu_slots.csv") as f:
    for host, model, slots in csv.reader(f):
        gpu_slots[(host, model)] = int(slots)

configs = defaultdict(dict)
for path in sorted(raw.glob("*.model.csv")):
    for r in rows(path):
        key = (r["host"], r["model"], int(r["streams"]), int(r["cache_slots"]))
        configs[key][r["strategy"]] = r
for path in sorted(raw.glob("*.legacy.csv")):
    for r in rows(path):
        key = (r["host"], r["model"], int(r["streams"]), int(r["cache_slots"]))
        configs[key]["hybrid_legacy"] = r

decisions = []
for (host, model, streams, slots), c in sorted(configs.items()):
    off, hyb, leg = c["offload"], c["hybrid"], c["hybrid_legacy"]
    sim = {
        "offload": float(off["tok_s_total"]),
        "hybrid": float(hyb["tok_s_total"]),
        "hybrid_legacy": float(leg["tok_s_total"]),
    }
    model_tok = {"offload": float(off["model_tok_s_total"]), "hybrid": float(hyb["model_tok_s_total"])}
    best = max(sim.values())
    # The ratio rule runs hybrid at its own fraction; the model at its optimum. A tie in the
    # model's numbers (hybrid at a fraction that fetches every miss is offload) is offload.
    ratio_pick = legacy[host]["verdict"]
    ratio_tok = sim["offload"] if ratio_pick == "offload" else sim["hybrid_legacy"]
    ratio_other = sim["hybrid_legacy"] if ratio_pick == "offload" else sim["offload"]
    model_pick = "hybrid" if model_tok["hybrid"] > model_tok["offload"] * (1 + 1e-9) else "offload"
    model_tok_sim = sim[model_pick]
    model_other = sim["offload"] if model_pick == "hybrid" else sim["hybrid"]
    share = slots / gpu_slots[(host, model)]
    decisions.append({
        "host": host,
        "model": model,
        "streams": streams,
        "cache_slots": slots,
        "cache_share_of_gpu": round(share, 3),
        "offload_miss_rate": round(float(off["miss_rate"]), 4),
        "legacy_ratio": round(legacy[host]["ratio"], 3),
        "ratio_pick": ratio_pick,
        "model_pick": model_pick,
        "model_fetch_fraction": float(hyb["fetch_fraction"]),
        "legacy_fetch_fraction": round(float(leg["fetch_fraction"]), 4),
        "sim_offload": round(sim["offload"], 3),
        "sim_hybrid_model_f": round(sim["hybrid"], 3),
        "sim_hybrid_legacy_f": round(sim["hybrid_legacy"], 3),
        "model_offload": round(model_tok["offload"], 3),
        "model_hybrid": round(model_tok["hybrid"], 3),
        "ratio_wrong": int(ratio_tok < ratio_other * (1 - TIE)),
        "model_wrong": int(model_tok_sim < model_other * (1 - TIE)),
        "ratio_regret_pct": round(100 * (best / ratio_tok - 1), 3),
        "model_regret_pct": round(100 * (best / model_tok_sim - 1), 3),
    })

with open(out / "decisions.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(decisions[0]))
    w.writeheader()
    w.writerows(decisions)
with open(out / "regret.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["rule", "regret_pct", "host", "model", "streams", "cache_slots"])
    for d in decisions:
        for rule, col in (("legacy ratio", "ratio_regret_pct"), ("analytic model", "model_regret_pct")):
            w.writerow([rule, d[col], d["host"], d["model"], d["streams"], d["cache_slots"]])


def quantile(v, q):
    """Nearest-rank quantile (as `ft plot` reports it)."""
    v = sorted(v)
    k = max(1, math.ceil(q * len(v)))
    return v[min(k, len(v)) - 1]


def stats(ds):
    n = len(ds)
    rr = [d["ratio_regret_pct"] for d in ds]
    mr = [d["model_regret_pct"] for d in ds]
    return {
        "configs": n,
        "ratio_wrong": sum(d["ratio_wrong"] for d in ds),
        "ratio_wrong_share": sum(d["ratio_wrong"] for d in ds) / n,
        "model_wrong": sum(d["model_wrong"] for d in ds),
        "model_wrong_share": sum(d["model_wrong"] for d in ds) / n,
        "ratio_mean_regret_pct": sum(rr) / n,
        "ratio_p90_regret_pct": quantile(rr, 0.9),
        "ratio_max_regret_pct": max(rr),
        "model_mean_regret_pct": sum(mr) / n,
        "model_p90_regret_pct": quantile(mr, 0.9),
        "model_max_regret_pct": max(mr),
    }


def table(title, key):
    groups = defaultdict(list)
    for d in decisions:
        groups[key(d)].append(d)
    lines = [f"| {title} | configs | ratio wrong | ratio regret mean / p90 / max | model wrong | model regret mean / p90 / max |",
             "|---|---:|---:|---:|---:|---:|"]
    for k in sorted(groups):
        s = stats(groups[k])
        lines.append(
            f"| {k} | {s['configs']} | {s['ratio_wrong']} ({100 * s['ratio_wrong_share']:.0f}%) | "
            f"{s['ratio_mean_regret_pct']:.1f}% / {s['ratio_p90_regret_pct']:.1f}% / {s['ratio_max_regret_pct']:.0f}% | "
            f"{s['model_wrong']} ({100 * s['model_wrong_share']:.0f}%) | "
            f"{s['model_mean_regret_pct']:.1f}% / {s['model_p90_regret_pct']:.1f}% / {s['model_max_regret_pct']:.0f}% |")
    return "\n".join(lines)


total = stats(decisions)
# Both directions: the ratio keeps offload where hybrid is faster, and picks hybrid where
# offload is faster.
wrong_offload = sum(1 for d in decisions if d["ratio_wrong"] and d["ratio_pick"] == "offload")
wrong_hybrid = sum(1 for d in decisions if d["ratio_wrong"] and d["ratio_pick"] == "hybrid")
worst = max(decisions, key=lambda d: d["ratio_regret_pct"])

md = [
    f"All {total['configs']} configurations: the legacy ratio rule picks the slower strategy in "
    f"{total['ratio_wrong']} ({100 * total['ratio_wrong_share']:.0f}%), the analytic model in "
    f"{total['model_wrong']} ({100 * total['model_wrong_share']:.0f}%). Mean regret: ratio "
    f"{total['ratio_mean_regret_pct']:.1f}%, model {total['model_mean_regret_pct']:.1f}%.",
    "",
    f"The ratio's wrong picks: {wrong_offload} keep offload where hybrid is faster, {wrong_hybrid} pick "
    f"hybrid where offload is faster. Its worst case: {worst['host']} / {worst['model']} at "
    f"{worst['streams']} stream(s), cache {worst['cache_slots']} slots: ratio says {worst['ratio_pick']}, "
    f"regret {worst['ratio_regret_pct']:.0f}%.",
    "",
    table("host (legacy ratio, verdict)", lambda d: f"{d['host']} ({d['legacy_ratio']}, {d['ratio_pick']})"),
    "",
    table("model", lambda d: d["model"]),
    "",
    table("streams", lambda d: f"{d['streams']:>2}"),
    "",
    table("cache (share of what the GPU holds)", lambda d: f"{d['cache_share_of_gpu']:.2f}" if d['cache_share_of_gpu'] < 0.99 else "1.00"),
]
(out / "summary.md").write_text("\n".join(md) + "\n")

conclusions = {
    "configs": total["configs"],
    "ratio_rule_wrong_share": round(total["ratio_wrong_share"], 3),
    "model_wrong_share": round(total["model_wrong_share"], 3),
    "model_wrong_less_often_than_ratio": total["model_wrong_share"] < total["ratio_wrong_share"],
    "ratio_mean_regret_pct": round(total["ratio_mean_regret_pct"], 2),
    "model_mean_regret_pct": round(total["model_mean_regret_pct"], 2),
    "model_regret_below_ratio": total["model_mean_regret_pct"] < total["ratio_mean_regret_pct"],
    "ratio_wrong_keeping_offload": wrong_offload > 0,
    "ratio_wrong_picking_hybrid": wrong_hybrid > 0,
}
(out / "conclusions.json").write_text(json.dumps(conclusions, indent=2) + "\n")
print(json.dumps(conclusions, indent=2))
