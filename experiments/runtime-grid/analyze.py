#!/usr/bin/env python3
"""runtime-grid: turn the `ft run --json` documents of run.sh into grid.csv and summary.txt.

Standard library only. Usage: analyze.py OUTDIR (the folder run.sh wrote: json/, traces/).

Targets checked (README.md explains them):
1. offload reaches at least 90% of its own PCIe bound whenever the step is PCIe-bound. The
   bound is the step's gathered bytes over the same run's linear H2D bandwidth; "PCIe-bound"
   means the link is the busiest resource of the step (PCIe busy >= GPU busy and CPU busy).
2. hybrid beats offload wherever the CPU and the link add up in its favour: with `a` the
   link's time per fetched expert (offload's PCIe busy per layer over its fetched experts per
   layer) and `b` the CPU's time per expert (the cpu run's CPU busy per layer over its CPU
   experts per layer), a hybrid run at fetch fraction `f` with `m` misses per layer (its own:
   its cache admits only what it fetches) should take `max(f m a, (1 - f) m b + fixed)`, the
   probe's fixed cost per layer on the CPU side, plus the part of offload's layer that does
   not overlap its link (layer minus link busy: the dense part, the tail), which both share.
   The run is "favoured" where that is below offload's measured layer time by more than the
   two runs' noise (the larger round spread), not favoured where it is above by as much, and
   "marginal" in between; hybrid wins or loses only beyond the same noise, else it ties, and
   only a favoured loss is unexpected. The best split of offload's misses
   (`f = b / (a + b)`, `m a b / (a + b)` plus the fixed cost) is reported beside it.
3. where hybrid loses, the per-layer timeline says why: per layer, the CPU pool's busy time,
   the host's wait for the activations (the round trip), the link's busy time, and the GPU's.
"""
import csv
import json
import statistics
import sys
from pathlib import Path

PCIE_TARGET = 0.90


def load(out):
    runs, probes = [], {}
    for p in sorted((out / "json").glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError:
            print(f"analyze: {p.name} is not JSON, skipped", file=sys.stderr)
            continue
        if p.stem.startswith("probe-"):
            probes[p.stem[len("probe-"):]] = doc
        else:
            doc["_name"] = p.stem
            runs.append(doc)
    return runs, probes


def kind_of(strategy):
    return strategy.split("(")[0]


def per_layer(doc):
    """Mean per-layer busy times over the measured steps (us)."""
    keys = ["gpu_busy_us", "pcie_busy_us", "cpu_busy_us", "host_wait_us", "host_submit_us"]
    sums = {k: 0.0 for k in keys}
    n = 0
    for st in doc["step_records"]:
        if st["warmup"]:
            continue
        layers = st["layers"]
        # The last layer also holds the step's final wait for its outputs: leave it out.
        for l in layers[:-1] if len(layers) > 1 else layers:
            for k in keys:
                sums[k] += l[k]
            n += 1
    return {k: v / max(n, 1) for k, v in sums.items()}


def row_of(doc):
    s = doc["summary"]
    u = s["utilisation"]
    layers = doc["layers"]
    busy = {"gpu": s["gpu_busy_us"], "pcie": s["pcie_busy_us"], "cpu": s["cpu_busy_us"]}
    bound_by = max(busy, key=busy.get)
    pcie = doc.get("pcie") or {}
    cpu = doc.get("cpu") or {}
    total_experts = layers * 512
    pl = per_layer(doc)
    row = {
        "name": doc["_name"],
        "strategy": kind_of(doc["strategy"]),
        "fetch_fraction": doc["fetch_fraction"],
        "streams": doc["streams"],
        "cache_slots": doc["cache_slots"],
        "cache_share": round(doc["cache_slots"] / total_experts, 4) if doc["cache_slots"] else 0,
        "layers": layers,
        "tok_s_per_stream": s["tok_s_per_stream"],
        "tok_s_total": s["tok_s_total"],
        "step_us_mean": s["step_us"]["mean"],
        "step_us_p50": s["step_us"]["p50"],
        "layer_us": s["step_us"]["mean"] / layers,
        "miss_rate": s["miss_rate"],
        "hits_per_layer": s["hits_per_layer"],
        "misses_per_layer": s["misses_per_layer"],
        "fetched_per_layer": s["fetched_per_layer"],
        "cpu_per_layer": s["cpu_per_layer"],
        "gathered_mb_per_step": s["gathered_bytes_per_step"] / 1e6,
        "gpu_util": u["gpu"],
        "pcie_util": u["pcie"],
        "cpu_util": u["cpu"],
        "host_wait_util": u["host_wait"],
        "gpu_busy_layer_us": pl["gpu_busy_us"],
        "pcie_busy_layer_us": pl["pcie_busy_us"],
        "cpu_busy_layer_us": pl["cpu_busy_us"],
        "host_wait_layer_us": pl["host_wait_us"],
        "linear_h2d_gbs": pcie.get("linear_h2d_gbs", ""),
        "pcie_bound_step_us": pcie.get("bound_step_us", ""),
        "share_of_pcie_bound": pcie.get("share_of_bound", ""),
        "stream_read_gbs": cpu.get("stream_read_gbs", ""),
        "cpu_gbs_while_busy": cpu.get("cpu_gbs_while_busy", ""),
        "cpu_share_of_stream": cpu.get("share_of_stream", ""),
        "bound_by": bound_by,
        **rounds_columns(doc),
        **link_idle_columns(s),
    }
    row.update(tail_free_columns(row))
    return row


def rounds_columns(doc):
    """The interleaved rounds behind a run (`ft run --repeat`): how many, and the spread of
    their total tok/s as (max - min) / median; empty for a single round."""
    reps = sorted(doc.get("repeats") or [])
    if len(reps) < 2:
        return {"rounds": len(reps) or 1, "round_spread": ""}
    med = statistics.median(reps)
    return {"rounds": len(reps), "round_spread": (reps[-1] - reps[0]) / med if med > 0 else ""}


IDLE_CAUSES = ["dense", "prepare", "hit_experts", "fetched_experts", "combine", "cpu", "copies",
               "host", "gaps"]


def link_idle_columns(summary):
    """Per layer: the time no gather was on the link, and what held the step meanwhile
    (`LinkIdle` of ft_runtime::instrument; empty for runs without gathers or from older builds)."""
    idle = summary.get("link_idle_per_layer") or {}
    cols = {"link_idle_layer_us": idle.get("total_us", "")}
    for c in IDLE_CAUSES:
        cols[f"idle_{c}_us"] = idle.get(f"{c}_us", "")
    return cols


def tail_free_columns(r):
    """For a run that gathers: the link's rate while busy as a share of the linear rate (the
    bound's bytes over the busy time), and the most of the PCIe bound the run could reach with
    nothing after its last copy: the dense part up to the router precedes every gather (the
    router needs it) and the copies keep their busy rate, so a layer takes at least the link's
    busy time plus that dense part. Empty where a column is missing."""
    try:
        bound = float(r["pcie_bound_step_us"]) / r["layers"]
        busy = float(r["pcie_busy_layer_us"])
        dense = float(r["idle_dense_us"])
    except (TypeError, ValueError, KeyError):
        return {"link_busy_rate": "", "tail_free_ceiling": ""}
    if busy <= 0 or bound <= 0:
        return {"link_busy_rate": "", "tail_free_ceiling": ""}
    return {"link_busy_rate": bound / busy, "tail_free_ceiling": bound / (busy + dense)}


def spread_of(r):
    """A run's noise: the spread of its interleaved rounds (0 for a single round)."""
    return r["round_spread"] if r["round_spread"] != "" else 0.0


def outcome(vs, noise):
    """hybrid against offload: a win or a loss only beyond the runs' noise, else a tie."""
    if vs > noise:
        return "wins"
    if vs < -noise:
        return "loses"
    return "ties"


def idle_note(r):
    """'57 us idle link per layer: dense 30, fetched experts 12, ...' for a row that has it."""
    if r["link_idle_layer_us"] == "":
        return ""
    parts = sorted(((r[f"idle_{c}_us"], c.replace("_", " ")) for c in IDLE_CAUSES), reverse=True)
    top = ", ".join(f"{name} {us:.0f}" for us, name in parts if us >= 0.5)
    return f"link idle {r['link_idle_layer_us']:.0f} us per layer ({top})"


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    runs, probes = load(out)
    if not runs:
        sys.exit(f"analyze: no run documents under {out / 'json'}")
    rows = [row_of(d) for d in runs]
    overhead = probes.get("spin", {}).get("overhead_layer_us", 0.0)

    by = {}
    for r in rows:
        by.setdefault((r["strategy"], r["streams"], r["cache_slots"]), []).append(r)
    cpu_rate = {}  # streams -> CPU us per expert
    for r in rows:
        if r["strategy"] == "cpu" and r["cpu_per_layer"] > 0:
            cpu_rate[r["streams"]] = r["cpu_busy_layer_us"] / r["cpu_per_layer"]

    lines = []
    for r in rows:
        r["pcie_bound"] = ""
        r["meets_pcie_target"] = ""
        r["offload_tok_s_per_stream"] = ""
        r["vs_offload"] = ""
        r["ideal_fraction"] = ""
        r["ideal_hybrid_layer_us"] = ""
        r["expected_hybrid_layer_us"] = ""
        r["favoured"] = ""
        r["diagnosis"] = ""
        r["outcome"] = ""
        if r["strategy"] == "offload":
            bound = r["bound_by"] == "pcie"
            r["pcie_bound"] = bound
            if bound and r["share_of_pcie_bound"] != "":
                r["meets_pcie_target"] = r["share_of_pcie_bound"] >= PCIE_TARGET
        if r["strategy"] == "hybrid":
            off = by.get(("offload", r["streams"], r["cache_slots"]), [None])[0]
            if off is None:
                continue
            r["offload_tok_s_per_stream"] = off["tok_s_per_stream"]
            r["vs_offload"] = r["tok_s_per_stream"] / off["tok_s_per_stream"] - 1
            # The two runs' noise: within it either way, neither the bandwidths nor the
            # measurement decide between them.
            noise = max(spread_of(r), spread_of(off))
            b = cpu_rate.get(r["streams"])
            if off["fetched_per_layer"] > 0 and b:
                a = off["pcie_busy_layer_us"] / off["fetched_per_layer"]
                # The best split of offload's misses (fetch b / (a + b) of them) ...
                m = off["misses_per_layer"]
                r["ideal_fraction"] = b / (a + b)
                r["ideal_hybrid_layer_us"] = m * a * b / (a + b) + overhead
                # ... and what this run's own split of its own misses (hybrid's cache admits
                # only what it fetches, so they differ from offload's) should take: favoured
                # where that beats offload's measured layer.
                # Both strategies share the part of a layer that does not overlap the
                # link (the dense part before the router, the tail after the last copy):
                # offload's layer minus its link time.
                serial = max(off["layer_us"] - off["pcie_busy_layer_us"], 0.0)
                mh, f = r["misses_per_layer"], r["fetch_fraction"]
                expected = max(f * mh * a, (1 - f) * mh * b + overhead) + serial
                r["expected_hybrid_layer_us"] = expected
                if expected < off["layer_us"] * (1 - noise):
                    r["favoured"] = True
                elif expected > off["layer_us"] * (1 + noise):
                    r["favoured"] = False
                else:
                    r["favoured"] = "marginal"
            r["outcome"] = outcome(r["vs_offload"], noise)
            if r["vs_offload"] < 0:
                cpu_path = r["cpu_busy_layer_us"] + r["host_wait_layer_us"]
                if cpu_path > r["pcie_busy_layer_us"]:
                    why = (f"CPU share on the critical path: {r['cpu_busy_layer_us']:.0f} us CPU busy + "
                           f"{r['host_wait_layer_us']:.0f} us waiting for the activations per layer, "
                           f"against {r['pcie_busy_layer_us']:.0f} us of link")
                else:
                    why = (f"link still the bound: {r['pcie_busy_layer_us']:.0f} us of PCIe per layer "
                           f"for {r['fetched_per_layer']:.1f} fetched experts (offload's miss rate "
                           f"{off['miss_rate']:.0%}, hybrid's {r['miss_rate']:.0%})")
                fixed = r["layer_us"] - max(r["cpu_busy_layer_us"] + r["host_wait_layer_us"],
                                            r["pcie_busy_layer_us"], r["gpu_busy_layer_us"])
                r["diagnosis"] = f"{why}; {fixed:.0f} us per layer beyond the busiest resource"
                idle = idle_note(r)
                if idle:
                    r["diagnosis"] += "; " + idle

    fields = list(rows[0].keys())
    with open(out / "grid.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in sorted(rows, key=lambda r: (r["streams"], r["cache_slots"], r["strategy"], r["fetch_fraction"])):
            w.writerow(r)

    lines.append("runtime-grid summary")
    for wait, p in sorted(probes.items()):
        lines.append(
            f"hybrid fixed cost per layer ({wait}): {p['overhead_layer_us']:.1f} us beyond the work "
            f"(target {p['target_us']:.0f} us: {'met' if p['overhead_layer_us'] <= p['target_us'] else 'MISSED'}); "
            f"pool job alone {p['pool_job_spin_us']:.1f} us spinning (host computing), "
            f"{p.get('pool_job_spin_beside_us', float('nan')):.1f} us spinning (host idle beside), "
            f"{p['pool_job_park_us']:.1f} us parked")
    lines.append("")
    lines.append(f"{'streams':>7} {'cache':>6} {'strategy':>14} {'tok/s/str':>9} {'vs off':>7} "
                 f"{'miss':>5} {'bound':>5} {'%bound':>6} {'favoured':>8}  note")
    for r in sorted(rows, key=lambda r: (r["streams"], r["cache_share"], r["strategy"], r["fetch_fraction"])):
        label = r["strategy"] if r["strategy"] != "hybrid" else f"hybrid({r['fetch_fraction']:.2f})"
        share = r["share_of_pcie_bound"]
        vs = r["vs_offload"]
        note = ""
        if r["strategy"] == "offload" and r["pcie_bound"]:
            note = "meets 90% of its PCIe bound" if r["meets_pcie_target"] else "BELOW 90% of its PCIe bound"
            idle = idle_note(r)
            if idle:
                note += "; " + idle
            if not r["meets_pcie_target"] and r["tail_free_ceiling"] != "":
                note += (f"; at most {r['tail_free_ceiling']:.0%} with nothing after the last copy "
                         f"(the link at {r['link_busy_rate']:.0%} of its linear rate while busy)")
        if r["diagnosis"]:
            unexpected = r["favoured"] is True and r["outcome"] == "loses"
            note = ("UNEXPECTED LOSS: " if unexpected else f"{r['outcome']}: ") + r["diagnosis"]
        lines.append(
            f"{r['streams']:>7} {r['cache_share']:>6.2f} {label:>14} {r['tok_s_per_stream']:>9.2f} "
            f"{(f'{vs:+.0%}' if vs != '' else ''):>7} {r['miss_rate']:>5.0%} {r['bound_by']:>5} "
            f"{(f'{share:.0%}' if share != '' else ''):>6} {str(r['favoured']):>8}  {note}")
    hybrid = [r for r in rows if r["strategy"] == "hybrid" and r["favoured"] != ""]
    lines.append("")
    for fav in (True, "marginal", False):
        sel = [r for r in hybrid if r["favoured"] == fav]
        if sel:
            counts = ", ".join(f"{sum(r['outcome'] == o for r in sel)} {o}" for o in ("wins", "ties", "loses"))
            what = {True: "favoured by the bandwidths beyond the runs' noise",
                    "marginal": "within the runs' noise of even", False: "not favoured beyond the runs' noise"}[fav]
            lines.append(f"hybrid {what}: {len(sel)} run(s): {counts}")
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
