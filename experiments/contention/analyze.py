#!/usr/bin/env python3
"""contention analysis: the model's contended parameters and the bench pair they imply,
beside `ft bench bw`'s measurements where the GPU half ran, and the conclusions the CI test
checks.

Reads OUTDIR/raw/model.jsonl, OUTDIR/hosts/*.toml and raw/bench-bw.<threads>.json; writes
OUTDIR/assumptions.csv (one row per preset), threads.csv (per thread count, model and
measured), summary.md and conclusions.json.
"""
import csv
import json
import sys
import tomllib
from pathlib import Path

GPU_HOST = "h200-xeon-emr"
# ft-model's DEFAULT_DRAM_OVER_STREAM (model/src/host.rs): the shared DRAM read bandwidth
# over STREAM read when a preset gives none, from the H200 machine's 105 GB/s alone and
# 90 GB/s during a 50 GB/s gather under proportional sharing.
DEFAULT_DRAM_OVER_STREAM = 90.0 * (105.0 + 50.0) / (105.0 * 105.0)

out = Path(sys.argv[1])
raw = out / "raw"
model = [json.loads(l) for l in (raw / "model.jsonl").read_text().splitlines()]


def loss(alone, together):
    return round(100 * (1 - together / alone), 2)


assumptions = []
for m in (m for m in model if m["threads"] == "engine"):
    spec = tomllib.loads((out / "hosts" / f"{m['label']}.toml").read_text())
    eng = spec.get("engine", {})
    stream = spec["cpu"]["stream_read_gbs"]
    dram = eng.get("dram_gbs")
    l, c = m["legacy"], m["contention"]
    assumptions.append({
        "host": m["label"],
        "cpu_threads": eng.get("cpu_threads", spec["cpu"]["cores"]),
        "stream_read_gbs": stream,
        "dram_gbs": dram if dram is not None else round(DEFAULT_DRAM_OVER_STREAM * stream, 2),
        "dram_gbs_source": "preset" if dram is not None else "default (1.266 x STREAM read)",
        "dma_dram_weight": eng.get("dma_dram_weight", 1.0),
        "cpu_moe_gbs": round(l["cpu_moe_gbs"], 2),
        "cpu_moe_contended_gbs": round(c["cpu_gbs"], 2),
        "cpu_loss_pct": loss(l["cpu_moe_gbs"], c["cpu_gbs"]),
        "pcie_gather_gbs": round(l["pcie_gather_gbs"], 2),
        "pcie_gather_contended_gbs": round(c["gather_gbs"], 2),
        "gather_loss_pct": loss(l["pcie_gather_gbs"], c["gather_gbs"]),
        "demand_over_dram": round((l["cpu_moe_gbs"] + l["pcie_gather_gbs"]) / (dram or DEFAULT_DRAM_OVER_STREAM * stream), 3),
        "legacy_fetch_fraction": round(l["fetch_fraction"], 4),
    })
with open(out / "assumptions.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(assumptions[0]))
    w.writeheader()
    w.writerows(assumptions)

threads = []
for m in (m for m in model if m["threads"] != "engine"):
    l, c = m["legacy"], m["contention"]
    threads.append({
        "source": "model", "geometry": "tuning", "threads": int(m["threads"]),
        "cpu_moe_gbs": round(l["cpu_moe_gbs"], 2), "cpu_moe_contended_gbs": round(c["cpu_gbs"], 2),
        "pcie_gather_gbs": round(l["pcie_gather_gbs"], 2), "pcie_gather_contended_gbs": round(c["gather_gbs"], 2),
        "cpu_loss_pct": loss(l["cpu_moe_gbs"], c["cpu_gbs"]), "gather_loss_pct": loss(l["pcie_gather_gbs"], c["gather_gbs"]),
        "stream_read_gbs": "",
    })
for p in sorted(raw.glob("bench-bw.*.json"), key=lambda p: int(p.name.split(".")[1])):
    doc = json.loads(p.read_text())
    t = int(p.name.split(".")[1])
    for r in doc.get("rows", []):
        threads.append({
            "source": "measured", "geometry": "tuning" if r.get("model") == "bench-nvfp4" else "served",
            "threads": t,
            "cpu_moe_gbs": round(r["cpu_moe_gbs"], 2), "cpu_moe_contended_gbs": round(r["cpu_moe_contended_gbs"], 2),
            "pcie_gather_gbs": round(r["pcie_gather_gbs"], 2), "pcie_gather_contended_gbs": round(r["pcie_gather_contended_gbs"], 2),
            "cpu_loss_pct": loss(r["cpu_moe_gbs"], r["cpu_moe_contended_gbs"]),
            "gather_loss_pct": loss(r["pcie_gather_gbs"], r["pcie_gather_contended_gbs"]),
            "stream_read_gbs": round(r["stream_read_gbs"], 2) if r.get("stream_read_gbs") is not None else "",
        })
threads.sort(key=lambda r: (r["source"], r["geometry"], r["threads"]))
with open(out / "threads.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(threads[0]))
    w.writeheader()
    w.writerows(threads)

md = ["What the model assumes, per host preset (the bench pair at the tuning geometry, alone and contended, "
      "as `ft explain` derives it from the preset):", "",
      "| host | threads | DRAM shared (GB/s) | DMA weight | CPU-MoE alone / contended (loss) | gather alone / contended (loss) | demand over DRAM | legacy fetch fraction |",
      "|---|---:|---:|---:|---:|---:|---:|---:|"]
for a in assumptions:
    md.append(f"| {a['host']} | {a['cpu_threads']} | {a['dram_gbs']} ({a['dram_gbs_source']}) | {a['dma_dram_weight']} | "
              f"{a['cpu_moe_gbs']} / {a['cpu_moe_contended_gbs']} ({a['cpu_loss_pct']}%) | "
              f"{a['pcie_gather_gbs']} / {a['pcie_gather_contended_gbs']} ({a['gather_loss_pct']}%) | {a['demand_over_dram']} | {a['legacy_fetch_fraction']} |")
md += ["", f"{GPU_HOST} across CPU threads (model; measured where the GPU half ran):", "",
       "| source | geometry | threads | CPU-MoE alone / contended (loss) | gather alone / contended (loss) | STREAM read |",
       "|---|---|---:|---:|---:|---:|"]
for r in threads:
    md.append(f"| {r['source']} | {r['geometry']} | {r['threads']} | {r['cpu_moe_gbs']} / {r['cpu_moe_contended_gbs']} ({r['cpu_loss_pct']}%) | "
              f"{r['pcie_gather_gbs']} / {r['pcie_gather_contended_gbs']} ({r['gather_loss_pct']}%) | {r['stream_read_gbs']} |")
(out / "summary.md").write_text("\n".join(md) + "\n")

field = next(a for a in assumptions if a["host"] == "rtx4090-2x-xeon4310")
gpu = next(a for a in assumptions if a["host"] == GPU_HOST)
mt = [r for r in threads if r["source"] == "model"]
conclusions = {
    "field_host_cpu_loss_pct": field["cpu_loss_pct"],
    "field_host_gather_loss_pct": field["gather_loss_pct"],
    "field_host_contended": field["cpu_loss_pct"] > 0 and field["gather_loss_pct"] > 0,
    "gpu_host_cpu_loss_pct": gpu["cpu_loss_pct"],
    "gpu_host_gather_loss_pct": gpu["gather_loss_pct"],
    "gpu_host_demand_below_dram": gpu["demand_over_dram"] < 1,
    "model_loss_grows_with_threads": mt[-1]["cpu_loss_pct"] + mt[-1]["gather_loss_pct"] >= mt[0]["cpu_loss_pct"] + mt[0]["gather_loss_pct"],
    "model_no_contention_at_1_thread": mt[0]["cpu_loss_pct"] < 0.5 and mt[0]["gather_loss_pct"] < 0.5,
}
measured = [r for r in threads if r["source"] == "measured" and r["geometry"] == "tuning"]
if measured:
    conclusions["measured_cpu_loss_pct_at_most_threads"] = measured[-1]["cpu_loss_pct"]
    conclusions["measured_gather_loss_pct_at_most_threads"] = measured[-1]["gather_loss_pct"]
(out / "conclusions.json").write_text(json.dumps(conclusions, indent=2) + "\n")
print(json.dumps(conclusions, indent=2))
