#!/usr/bin/env python3
"""validate-h200: diagnostics beside `ft validate analyze`, from a result folder's runs.

1. The model's errors against each run's median step as well as its mean (`ft validate
   analyze` takes the run's total tok/s, i.e. its mean step): streams / median step of the
   reported round, so that steps stalled by the machine (the 15-thread runs on the H200 VM)
   weigh no more than one step each.
2. Hybrid's busy time per resource (PCIe, GPU, CPU) per layer, measured over predicted
   (the prediction's `busy`), as 10th, 50th and 90th percentiles over the grid; and the
   host's side of it: the host thread's own time plus its wait for the activations per
   layer (the runs' `host_submit_us` and `host_wait_us`) over the prediction's `sync` (the
   round trip and the host's time beyond the dense part).
3. Model-free: the probe's own end-to-end `cpu` blocks against the grid's `cpu` runs of the
   same geometry, threads and streams (context 1024, the probe's; every expert on the CPU
   in both, so a layer does the same work; only the step's own costs are shared by another
   number of layers where the probe ran more or fewer): the runs' time per layer over the median of the
   probe's blocks (its `step` samples). What a profile cannot know: where the machine ran
   the runs faster or slower than it ran the probe, no model fitted to that probe predicts
   those runs closer than this ratio says.
Percentiles are nearest-rank (they can differ from `ft validate analyze`'s by a point).
Usage: diagnose.py RESULT_DIR (grid.csv, and runs/ and predictions/ or the folder's
runs-predictions-probes.tar.xz or .tar.gz, profiles/ or its profiles.tar.gz). Standard
library only.
"""
import csv, json, statistics, sys, tarfile, tempfile, os

def archive(d, stem):
    """The packed form of a result folder's `stem` (e.g. `runs-predictions-probes`):
    `stem.tar.xz` (grids committed since 2026-12-05T20Z, and the older ones recompressed
    then) or `stem.tar.gz`; None where neither is there."""
    for ext in (".tar.xz", ".tar.gz"):
        path = os.path.join(d, stem + ext)
        if os.path.exists(path):
            return path
    return None

def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]

def main(d):
    runs = os.path.join(d, "runs")
    tmp = None
    if not os.path.isdir(runs):
        tmp = tempfile.TemporaryDirectory()
        with tarfile.open(archive(d, "runs-predictions-probes")) as t:
            t.extractall(tmp.name, members=[m for m in t.getmembers()
                                             if m.name.startswith(("runs/", "predictions/"))])
        runs = os.path.join(tmp.name, "runs")
    predictions = os.path.join(os.path.dirname(runs), "predictions")
    profiles = os.path.join(d, "profiles")
    if not os.path.isdir(profiles) and archive(d, "profiles"):
        tmp_profiles = tempfile.TemporaryDirectory()
        with tarfile.open(archive(d, "profiles")) as t:
            t.extractall(tmp_profiles.name)
        profiles = os.path.join(tmp_profiles.name, "profiles")
    groups = {}
    busy = {"pcie": [], "gpu": [], "cpu": [], "host": []}
    for r in csv.DictReader(open(os.path.join(d, "grid.csv"))):
        doc = json.load(open(os.path.join(runs, f"{r['config']}-{r['strategy']}.json")))
        median_tok_s = doc["streams"] / (doc["summary"]["step_us"]["p50"] * 1e-6)
        pred, mean_tok_s = float(r["predicted_tok_s"]), float(r["measured_tok_s"])
        for key in ("all", f"threads {r['threads']}", r["strategy"]):
            g = groups.setdefault(key, ([], []))
            g[0].append(abs(pred / mean_tok_s - 1))
            g[1].append(abs(pred / median_tok_s - 1))
        if r["strategy"] == "hybrid":
            p = json.load(open(os.path.join(predictions, f"{r['config']}.json")))["prediction"]
            hy = next(s for s in p["strategies"] if s["kind"] == "hybrid")["busy"]
            for k in ("pcie", "gpu", "cpu"):
                if hy[f"{k}_us"] > 0:
                    busy[k].append(doc["summary"][f"{k}_busy_us"] / hy[f"{k}_us"] - 1)
            layers = [l for st in doc["step_records"] if not st.get("warmup")
                      for l in st["layers"]]
            host = sum(l["host_submit_us"] + l["host_wait_us"] for l in layers)
            steps = len(layers) / max(1, doc["layers"])
            if hy["sync_us"] > 0 and steps > 0:
                busy["host"].append(host / steps / hy["sync_us"] - 1)
    print(f"{'rows':<16} {'n':>4} {'mean step: median':>18} {'p90':>7} {'median step: median':>20} {'p90':>7}")
    for key, (m, s) in groups.items():
        print(f"{key:<16} {len(m):>4} {100 * statistics.median(m):>17.1f}% {100 * q(m, .9):>6.1f}%"
              f" {100 * statistics.median(s):>19.1f}% {100 * q(s, .9):>6.1f}%")
    print()
    print("hybrid busy per resource, measured over predicted - 1 (p10 / median / p90;")
    print("host: the host's own time and wait over the predicted sync)")
    for k, v in busy.items():
        print(f"{k:<6} {len(v):>3} runs {100 * q(v, .1):+6.0f}% {100 * q(v, .5):+6.0f}% {100 * q(v, .9):+6.0f}%")

    drift = probe_against_runs(d, runs, profiles)
    if drift:
        print()
        print("the probe's own cpu blocks against the grid's cpu runs (model-free): runs' time per")
        print("layer over the probe's median block, per geometry, threads and streams (context 1024)")
        for (g, t, n), (probe_us, ratios) in sorted(drift.items()):
            print(f"{g:<20} {t:>2} threads {n} streams: probe {probe_us:7.0f} us/layer, runs "
                  + " ".join(f"{x:.2f}" for x in ratios))
        every = [x for _, ratios in drift.values() for x in ratios]
        print(f"all {len(every)} runs: median {statistics.median(every):.2f}, "
              f"{min(every):.2f} to {max(every):.2f}; off by more than 10%: "
              f"{sum(abs(x - 1) > 0.1 for x in every)}")
    where = check_context(runs, predictions)
    if where:
        print()
        print("where the CPU check is taken: `ft predict --cpu-check`'s check (a process of its own,")
        print("just before the runs) over the runs' engine check before their first round, per config")
        print(f"{len(where)} configurations: median {statistics.median(where):.3f}, p10 {q(where, .1):.3f},"
              f" p90 {q(where, .9):.3f} (below 1: the separate process timed the CPU side faster)")

# What makes two CPU checks time the same work (`CpuCheck::same_work`).
CHECK_WORK = ("experts", "tokens_per_expert", "expert_bytes", "threads")


def same_work(a, b):
    """True when two CPU checks (JSON) timed the same work (`CpuCheck::same_work`)."""
    return all(a.get(k) == b.get(k) for k in CHECK_WORK)


def check_speed(run_doc, references, first_round=False):
    """How many times faster the CPU side ran in a run (`ft run --json`) than in the
    reference check of the same work (a profile's `cpu_checks`): the reference's time over
    the run's `cpu.cpu_check` (the median of its rounds' checks), or with `first_round` over
    the check before its first round (`cpu_check_rounds_us[0]`, taken before any measured
    step: what `ft run` decides an auto fraction at); None without both
    (`CpuCheck::speed_against`)."""
    cpu = run_doc.get("cpu") or {}
    check = cpu.get("cpu_check")
    if check and first_round:
        rounds = cpu.get("cpu_check_rounds_us") or []
        check = dict(check, time_us=rounds[0]) if rounds else None
    if not check or check["time_us"] <= 0:
        return None
    for ref in references:
        if same_work(ref, check) and ref["time_us"] > 0:
            return ref["time_us"] / check["time_us"]
    return None

def over_first_round(now, run_doc):
    """A CPU check's time (`now`, JSON) over a run's check of the same work before its first
    round (`cpu_check_rounds_us[0]`, on the run's own engine); None where the run has none or
    timed other work."""
    cpu = run_doc.get("cpu") or {}
    rounds = cpu.get("cpu_check_rounds_us") or []
    if rounds and rounds[0] > 0 and same_work(cpu.get("cpu_check") or {}, now):
        return now["time_us"] / rounds[0]
    return None

def check_context(runs, predictions):
    """Per configuration predicted with `ft predict --cpu-check` (FT_CPU_CHECK=predict): its
    check's time over the hybrid run's check before its first round ([`over_first_round`]:
    the same work on the runs' own engine seconds later)."""
    out = []
    if not os.path.isdir(predictions):
        return out
    for name in sorted(os.listdir(predictions)):
        try:
            now = (json.load(open(os.path.join(predictions, name))).get("cpu_check") or {})["now"]
            run = json.load(open(os.path.join(runs, name.replace(".json", "-hybrid.json"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        ratio = over_first_round(now, run)
        if ratio is not None:
            out.append(ratio)
    return out

def cpu_blocks_us(profile_path, threads=None):
    """streams -> median us per layer of a probe's end-to-end `cpu` blocks (calibration and
    validation) at `threads` (default: the probe's serving threads), from its profile."""
    prof = json.load(open(profile_path))
    serving = prof["params"]["cpu_threads"]
    threads = serving if threads is None else threads
    by = {}
    for s in prof["samples"]["step"]:
        if s["strategy"] == "cpu" and s.get("threads", serving) == threads:
            by.setdefault(int(s["shape"]["streams"]), []).append(s["time_us"] / len(s["layers"]))
    return {n: statistics.median(v) for n, v in by.items()}

def probe_against_runs(d, runs, profiles):
    """(geometry, threads, streams) -> (probe's median us per layer, [run / probe])."""
    out = {}
    blocks = {}
    rows = [r for r in csv.DictReader(open(os.path.join(d, "grid.csv")))
            if r["strategy"] == "cpu" and r["context"] == "1024"]
    for r in rows:
        path = os.path.join(profiles, f"{r['geometry']}.json")
        if not os.path.exists(path):
            continue
        t, n = int(r["threads"]), int(r["streams"])
        if (r["geometry"], t) not in blocks:
            blocks[(r["geometry"], t)] = cpu_blocks_us(path, t)
        probe_us = blocks[(r["geometry"], t)].get(n)
        if probe_us is None:
            continue
        doc = json.load(open(os.path.join(runs, f"{r['config']}-cpu.json")))
        run_us = doc["summary"]["step_us"]["mean"] / doc["layers"]
        out.setdefault((r["geometry"], t, n), (probe_us, []))[1].append(run_us / probe_us)
    return out

if __name__ == "__main__":
    main(sys.argv[1])
