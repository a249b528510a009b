#!/usr/bin/env python3
"""What the default routing's change (issue 43) does to the GPU experiments' conclusions.

The GPU experiments (runtime-grid, validate-h200, serve-ab, pool-wait, host-submit) were
measured on the engine at the routing of their time, the shape now kept as the preset
`legacy-typical`; they cannot be re-run here. This script takes the configurations their
committed conclusions rest on (model, layers, streams, cache, strategy, steps, seed) and
asks `ft predict` (and, for serve-ab, `ft serve --predict-only`, the same decision path as
the service) on the host each ran on, once per routing, what moves: the miss rate, the CPU
and fetched experts per step, the predicted tok/s of each strategy and the model's pick.

Hosts: the probed profile the experiment's own call wrote where one exists (serve-ab's
`cache/profiles/`, in the tree), else the validation grid's probe from the same call or
the same kind of machine, read from the repository's history (`git show COMMIT:PATH`).
Those profiles predate the rule that fitted fixed costs are non-negative (the current
`ft` refuses them); negative `overhead` terms are set to 0 here, the same for both
routings, and the clamped values are listed in the output. Absolute tok/s then differ from
what the experiments' own predictions said (the model has also changed since); the
comparison that matters is between the two routings at one profile and one binary.

Usage: gpu-experiments.py OUTDIR (env FT: the ft binary; run from anywhere in the
checkout). Writes OUTDIR/rows.csv (one row per prediction), OUTDIR/summary.md (the tables
the experiments README quotes) and OUTDIR/env.txt. About a minute on an idle 2-core box.
Needs python3 (standard library) and git.
"""

import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROUTINGS = ("legacy-typical", "typical")
HERE = Path(__file__).resolve().parent
EXP = HERE.parent
REPO = EXP.parent

# Profiles from history: (label, commit, tarball path, file inside it).
PROFILE_SOURCES = {
    # validate-h200's H100 grid of 2026-12-05T09:06Z: the call that also ran host-submit.
    "h100-0906": ("42d84e7", "experiments/validate-h200/results/20261205T0906Z-h100/profiles.tar.gz"),
    # validate-h200's H200 grid of 2026-12-05T02:02Z: 11 minutes before pool-wait's H200 run.
    "h200-0202": ("42d84e7", "experiments/validate-h200/results/20261205T0202Z/profiles.tar.gz"),
}
SERVE_AB = EXP / "serve-ab/results/20261204T0225Z"
SERVE_PROFILE = SERVE_AB / "cache/profiles/qwen3.8-flash-next-nvfp4-c1b217483cc841e5.json"
VALIDATE = EXP / "validate-h200/results/20261205T0906Z-h100"
RUNTIME_GRID = EXP / "runtime-grid/results/20261206T0419Z-h100-full"
POOL_WAIT = EXP / "pool-wait/results/20261205T0213Z-h200"
HOST_SUBMIT = EXP / "host-submit/results/20261205T0905Z-h100"

ROW_FIELDS = [
    "experiment", "config", "host", "routing", "layers", "streams", "cache_slots", "context",
    "steps", "warmup", "strategy", "fetch_fraction", "miss_rate", "fetched_per_layer",
    "cpu_per_layer", "tok_s_per_stream", "tok_s_total", "step_us", "link_bytes_per_step",
    "bound", "pick", "pick_fetch_fraction", "cpu_speed",
]


def ft_binary():
    ft = os.environ.get("FT")
    if not ft:
        sys.exit("gpu-experiments.py: set FT to the ft binary")
    return ft


class Profiles:
    """Profiles read from history into a scratch folder, negative fixed costs set to 0."""

    def __init__(self, tmp):
        self.tmp = Path(tmp)
        self.clamped = []  # (profile, term, value) set to 0

    def _clamp(self, src, dst, label):
        p = json.loads(Path(src).read_text())
        over = p["params"]["overhead"]
        for term, v in sorted(over.items()):
            if isinstance(v, (int, float)) and v < 0:
                self.clamped.append((label, term, v))
                over[term] = 0.0
        Path(dst).write_text(json.dumps(p))
        return str(dst)

    def historic(self, source, name):
        commit, tarball = PROFILE_SOURCES[source]
        folder = self.tmp / source
        if not folder.exists():
            blob = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{tarball}"],
                                  check=True, capture_output=True).stdout
            folder.mkdir(parents=True)
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
                tar.extractall(folder / "raw", filter="data")
        dst = folder / name
        if not dst.exists():
            self._clamp(folder / "raw/profiles" / name, dst, f"{source}/{name}")
        return str(dst)

    def in_tree(self, path, label):
        dst = self.tmp / f"{label}.json"
        if not dst.exists():
            self._clamp(path, dst, label)
        return str(dst)


def layers_model(tmp, base_toml, layers):
    """A copy of a model TOML with `moe_layers` set (the runs' `--layers N` cut)."""
    text = Path(base_toml).read_text()
    out = []
    for line in text.splitlines():
        if line.strip().startswith("moe_layers"):
            line = f"moe_layers = {layers}"
        out.append(line)
    dst = Path(tmp) / f"{Path(base_toml).stem}-L{layers}.toml"
    dst.write_text("\n".join(out) + "\n")
    return str(dst)


def predict(ft, profile, model, *, streams, cache_slots, context, steps, warmup, seed,
            routing, fraction="auto", cpu_speed=1.0):
    cmd = [ft, "predict", "--cpu-speed", f"{cpu_speed:.4f}", "--profile", profile, "--model", model, "--streams", str(streams),
           "--context", str(context), "--cache-slots", str(cache_slots), "--steps", str(steps),
           "--warmup", str(warmup), "--routing", routing, "--fetch-fraction", str(fraction),
           "--json"]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gpu-experiments.py: {' '.join(cmd)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def strategy_rows(doc, base, layers, wanted):
    """Rows for the strategies in `wanted` (kind -> label) of one `ft predict` document."""
    pred = doc["prediction"]
    choice = doc["decision"]["choice"]
    pick = choice["kind"]
    pick_f = choice.get("fetch", {}).get("fixed", "") if pick == "hybrid" else ""
    rows = []
    for s in pred["strategies"]:
        kind = s["strategy"]["kind"]
        if kind not in wanted or not s.get("feasible", True):
            continue
        f = s["strategy"].get("fetch", {}).get("fixed", "") if kind == "hybrid" else ""
        c = s["counts"]
        rows.append(dict(base, strategy=wanted[kind], fetch_fraction=f,
                         miss_rate=s["miss_rate"], fetched_per_layer=c["fetched"] / layers,
                         cpu_per_layer=c["cpu"] / layers,
                         tok_s_per_stream=s["tok_s_per_stream"], tok_s_total=s["tok_s_total"],
                         step_us=s["step_us"], link_bytes_per_step=s["link_bytes_per_step"],
                         bound=s["bound"], pick=pick, pick_fetch_fraction=pick_f,
                         cpu_speed=base.get("cpu_speed", 1.0)))
    return rows


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- validate-h200: the 48 configurations of the 09:06Z H100 grid -------------------------

def run_validate(ft, profiles, rows):
    grid = read_csv(VALIDATE / "grid.csv")
    legacy_f = {r["config"]: r["fetch_fraction"] for r in grid if r["strategy"] == "hybrid-legacy"}
    for cfg in read_csv(VALIDATE / "plan.csv"):
        model = str(VALIDATE / cfg["model_toml"])
        prof = profiles.historic("h100-0906", f"{cfg['geometry']}-t{cfg['threads']}.json")
        layers = int(cfg["layers"])
        for routing in ROUTINGS:
            base = dict(experiment="validate-h200", config=cfg["config"], host="h100-0906",
                        routing=routing, layers=layers, streams=cfg["streams"],
                        cache_slots=cfg["cache_slots"], context=cfg["context"], steps=48,
                        warmup=24)
            kw = dict(streams=cfg["streams"], cache_slots=cfg["cache_slots"],
                      context=cfg["context"], steps=48, warmup=24, seed=0, routing=routing)
            doc = predict(ft, prof, model, **kw)
            rows += strategy_rows(doc, base, layers,
                                  {"offload": "offload", "hybrid": "hybrid", "cpu": "cpu"})
            doc = predict(ft, prof, model, fraction=legacy_f[cfg["config"]], **kw)
            rows += strategy_rows(doc, base, layers, {"hybrid": "hybrid-legacy"})


def summarize_validate(rows, out):
    measured = read_csv(VALIDATE / "grid.csv")
    meas_miss = {r["config"]: float(r["measured_miss_rate"])
                 for r in measured if r["strategy"] == "offload"}
    by = {}
    for r in rows:
        if r["experiment"] == "validate-h200":
            by.setdefault((r["config"], r["routing"]), {})[r["strategy"]] = r
    configs = sorted({c for c, _ in by})
    out.append("## validate-h200 (48 configurations of `20261205T0906Z-h100`, its probes)\n")
    out.append("Predicted with each run's own steps (48 after 24 warm-up) and seed (0). The "
               "ratio rule said offload in all 48 (measured at the time: wrong in all 48, "
               "mean loss 31.6%).\n")
    out.append("| routing | offload miss, mean (min-max) | model's pick: offload / hybrid / cpu "
               "| hybrid (model's f) ahead of offload by > 1% | ratio's offload: predicted "
               "mean / max loss against the best |")
    out.append("|---|---|---|---|---|")
    picks = {}
    for routing in ROUTINGS:
        miss, losses, ahead, count = [], [], 0, {"offload": 0, "hybrid": 0, "cpu": 0}
        for c in configs:
            s = by[(c, routing)]
            miss.append(s["offload"]["miss_rate"])
            pick = s["offload"]["pick"]
            count[pick] = count.get(pick, 0) + 1
            picks[(c, routing)] = pick
            best = max(v["tok_s_total"] for v in s.values())
            losses.append(1 - s["offload"]["tok_s_total"] / best)
            if s["hybrid"]["tok_s_total"] > 1.01 * s["offload"]["tok_s_total"]:
                ahead += 1
        out.append(f"| `{routing}` | {100 * statistics.mean(miss):.1f}% "
                   f"({100 * min(miss):.1f}-{100 * max(miss):.1f}%) | {count['offload']} / "
                   f"{count['hybrid']} / {count['cpu']} | {ahead} of {len(configs)} | "
                   f"{100 * statistics.mean(losses):.1f}% / {100 * max(losses):.1f}% |")
    flips = [c for c in configs if picks[(c, ROUTINGS[0])] != picks[(c, ROUTINGS[1])]]
    drift = [abs(by[(c, ROUTINGS[0])]["offload"]["miss_rate"] - meas_miss[c]) for c in configs]
    out.append("")
    out.append(f"Picks that change with the routing: {len(flips)} of {len(configs)}"
               + (f" ({', '.join(flips)})" if flips else "") + ". Today's `legacy-typical` "
               f"re-draws the runs' offload miss rates within {100 * statistics.mean(drift):.1f} "
               f"points on average (max {100 * max(drift):.1f}; the process code changed, so "
               "the draws are not the runs' own).\n")


# --- runtime-grid: the whole H100 grid of 2026-12-06T04:19Z --------------------------------

def run_runtime_grid(ft, profiles, tmp, rows):
    base_toml = VALIDATE / "models/qwen3.8-flash-next-L2.toml"
    model = layers_model(tmp, base_toml, 12)
    grid = read_csv(RUNTIME_GRID / "grid.csv")
    points = sorted({(int(r["streams"]), int(r["cache_slots"])) for r in grid
                     if r["strategy"] == "offload"})
    host = "h100-0906"
    prof = profiles.historic(host, "qwen3.8-flash-next-t15.json")
    # The probe (a day older than the grid's build) puts the CPU side 20-30% slower than
    # the grid's own `cpu` runs measured it: each stream count's CPU speed is set so that the
    # predicted `cpu` strategy matches that run (two fixed-point steps; `cpu` does not
    # depend on the cache, and the same speed serves both routings).
    speeds = {}
    for streams in sorted({s for s, _ in points}):
        cpu_run = next(r for r in grid if r["strategy"] == "cpu" and int(r["streams"]) == streams)
        speed = 1.0
        for _ in range(2):
            doc = predict(ft, prof, model, streams=streams, cache_slots=points[0][1],
                          context=1024, steps=32, warmup=8, seed=0, routing=ROUTINGS[0],
                          cpu_speed=speed)
            pred = next(s for s in doc["prediction"]["strategies"] if s["strategy"]["kind"] == "cpu")
            speed *= float(cpu_run["tok_s_per_stream"]) / pred["tok_s_per_stream"]
        speeds[streams] = speed
    for streams, slots in points:
        for routing in ROUTINGS:
            base = dict(experiment="runtime-grid", config=f"b{streams}-s{slots}", host=host,
                        routing=routing, layers=12, streams=streams, cache_slots=slots,
                        context=1024, steps=32, warmup=8, cpu_speed=speeds[streams])
            kw = dict(streams=streams, cache_slots=slots, context=1024, steps=32, warmup=8,
                      seed=0, routing=routing, cpu_speed=speeds[streams])
            doc = predict(ft, prof, model, **kw)
            rows += strategy_rows(doc, base, 12, {"offload": "offload", "hybrid": "hybrid",
                                                  "cpu": "cpu"})
            for f in ("0.25", "0.5"):
                doc = predict(ft, prof, model, fraction=f, **kw)
                rows += strategy_rows(doc, base, 12, {"hybrid": f"hybrid{f}"})


def summarize_runtime_grid(rows, out):
    measured = {}
    for r in read_csv(RUNTIME_GRID / "grid.csv"):
        label = r["strategy"] if r["strategy"] != "hybrid" else f"hybrid{float(r['fetch_fraction']):g}"
        measured[(int(r["streams"]), int(r["cache_slots"]), label)] = r
    by = {}
    for r in rows:
        if r["experiment"] == "runtime-grid":
            by.setdefault((int(r["streams"]), int(r["cache_slots"]), r["routing"]), {})[r["strategy"]] = r
    keys = sorted({(s, c) for s, c, _ in by})
    speeds = {s: by[(s, c, ROUTINGS[0])]["offload"]["cpu_speed"] for s, c in keys}
    out.append("## runtime-grid (the whole H100 grid, `20261206T0419Z-h100-full`; 12 layers)\n")
    out.append("Host: the H100 probe of validate-h200's 09:06Z grid (15 threads, the same kind "
               "of lent machine; the grid's folder has no profile), its CPU side scaled per "
               "stream count to the grid's own `cpu` runs (`--cpu-speed` "
               + ", ".join(f"{s}: {v:.2f}" for s, v in sorted(speeds.items()))
               + "). 32 steps after 8 warm-up from an empty cache, seed 0, as the runs. "
               "\"est.\" carries a measurement over to `typical` with the model's ratio: the "
               "measured value times the predicted value on `typical` over the predicted one on "
               "`legacy-typical` (for offload's share of its PCIe bound: bytes at the run's "
               "linear H2D rate over the predicted step).\n")
    out.append("| streams | cache slots | offload miss: measured / legacy / typical | offload "
               "share of bound: measured / est. | hybrid 0.25 vs offload: measured / legacy / "
               "typical / est. | hybrid 0.5 vs offload: measured / legacy / typical / est. | "
               "model's pick: legacy / typical |")
    out.append("|---|---|---|---|---|---|---|")
    wins = {k: {"hybrid0.25": 0, "hybrid0.5": 0} for k in (*ROUTINGS, "est", "measured")}
    for s, c in keys:
        leg, typ = by[(s, c, ROUTINGS[0])], by[(s, c, ROUTINGS[1])]
        m_off = measured[(s, c, "offload")]
        lin = float(m_off["linear_h2d_gbs"])

        def share(x):
            return x["link_bytes_per_step"] / (lin * 1e3) / x["step_us"]

        est_share = float(m_off["share_of_pcie_bound"]) * share(typ["offload"]) / share(leg["offload"])

        def vs(d, label):
            return d[label]["tok_s_total"] / d["offload"]["tok_s_total"] - 1

        cells = []
        for label in ("hybrid0.25", "hybrid0.5"):
            m = float(measured[(s, c, label)]["vs_offload"])
            est = (1 + m) * (1 + vs(typ, label)) / (1 + vs(leg, label)) - 1
            cells.append(f"{100 * m:+.0f}% / {100 * vs(leg, label):+.0f}% / "
                         f"{100 * vs(typ, label):+.0f}% / **{100 * est:+.0f}%**")
            for k, v in ((ROUTINGS[0], vs(leg, label)), (ROUTINGS[1], vs(typ, label)),
                         ("est", est), ("measured", m)):
                if v > 0.01:
                    wins[k][label] += 1

        def pick(d):
            p = d["offload"]["pick"]
            return p if p != "hybrid" else f"hybrid {float(d['offload']['pick_fetch_fraction']):.2f}"

        out.append(f"| {s} | {c} | {100 * float(m_off['miss_rate']):.0f}% / "
                   f"{100 * leg['offload']['miss_rate']:.0f}% / {100 * typ['offload']['miss_rate']:.0f}% | "
                   f"{100 * float(m_off['share_of_pcie_bound']):.1f}% / {100 * est_share:.1f}% | "
                   f"{cells[0]} | {cells[1]} | {pick(leg)} / {pick(typ)} |")
    out.append("")
    for k in ("measured", ROUTINGS[0], ROUTINGS[1], "est"):
        name = {"measured": "measured (at the runs' routing)", "est": "est. on `typical`"}.get(k, f"predicted, `{k}`")
        out.append(f"- {name}: hybrid 0.25 ahead of offload by > 1% at "
                   f"{wins[k]['hybrid0.25']} of {len(keys)} points, hybrid 0.5 at "
                   f"{wins[k]['hybrid0.5']}.")
    out.append("")


# --- serve-ab: ft serve's own start-up decision, 12 layers, the run's cache -----------------

def run_serve_ab(ft, profiles, rows):
    prof = profiles.in_tree(SERVE_PROFILE, "serve-ab-h200")
    for streams in (1, 2):
        for routing in ROUTINGS:
            cmd = [ft, "serve", "--model", "qwen3.8-flash-next", "--layers", "12", "--device",
                   "host", "--threads", "15", "--max-streams", "2", "--context-limit", "2048",
                   "--cache-gb", "4.751", "--profile", prof, "--routing", routing,
                   "--moe-strategy", "auto", "--expected-streams", str(streams),
                   "--predict-only", "--no-cpu-check", "--json"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"gpu-experiments.py: {' '.join(cmd)}: {r.stderr.strip()}")
            d = json.loads(r.stdout)["decision"]
            choice = d["choice"]
            pick_f = choice.get("fetch", {}).get("fixed", "") if choice["kind"] == "hybrid" else ""
            for e in d["estimates"]:
                kind = e["strategy"]["kind"]
                if kind not in ("offload", "hybrid", "cpu") or not e["feasible"]:
                    continue
                f = e["strategy"].get("fetch", {}).get("fixed", "") if kind == "hybrid" else ""
                rows.append(dict(experiment="serve-ab", config=f"b{streams}", host="serve-ab-h200",
                                 routing=routing, layers=12, streams=streams, cache_slots="4.751 GiB",
                                 context="", steps="", warmup="", strategy=kind, fetch_fraction=f,
                                 miss_rate=e["miss_rate"]["value"], fetched_per_layer="",
                                 cpu_per_layer="", tok_s_per_stream=e["tok_s"]["value"],
                                 tok_s_total=e["tok_s"]["value"] * streams, step_us="",
                                 link_bytes_per_step="", bound=e["bound"], pick=choice["kind"],
                                 pick_fetch_fraction=pick_f, cpu_speed=1.0))


def summarize_serve_ab(rows, out):
    by = {}
    for r in rows:
        if r["experiment"] == "serve-ab":
            by.setdefault((r["streams"], r["routing"]), {})[r["strategy"]] = r
    out.append("## serve-ab (`20261204T0225Z`: `ft serve --predict-only`, its own probed profile)\n")
    out.append("`ft serve`'s start-up decision as the service makes it (12 layers, 4.751 GiB "
               "cache, 15 threads), today's binary, each routing. At the time it chose hybrid "
               "(+11% at 1 stream, +35% at 2) and measured hybrid 2-15% and 1-25% ahead.\n")
    out.append("| streams | routing | offload miss | offload tok/s | hybrid (f) tok/s | auto's "
               "choice, margin over offload |")
    out.append("|---|---|---|---|---|---|")
    for (s, routing), d in sorted(by.items()):
        off, hyb = d["offload"], d["hybrid"]
        margin = hyb["tok_s_total"] / off["tok_s_total"] - 1
        pick = d["offload"]["pick"]
        pf = d["offload"]["pick_fetch_fraction"]
        out.append(f"| {s} | `{routing}` | {100 * off['miss_rate']:.0f}% | "
                   f"{off['tok_s_per_stream']:.1f} | {hyb['tok_s_per_stream']:.1f} "
                   f"(f = {float(hyb['fetch_fraction']):.2f}) | {pick}"
                   f"{f' {float(pf):.2f}' if pf != '' else ''}, hybrid {100 * margin:+.1f}% |")
    out.append("")


# --- pool-wait and host-submit: 2 layers, 51 slots, cpu and hybrid 0.5 at 1 and 4 streams --

def run_ab(ft, profiles, rows, experiment, source, steps, warmup):
    model = str(VALIDATE / "models/qwen3.8-flash-next-L2.toml")
    prof = profiles.historic(source, "qwen3.8-flash-next-t15.json")
    for streams in (1, 4):
        for routing in ROUTINGS:
            base = dict(experiment=experiment, config=f"b{streams}", host=source, routing=routing,
                        layers=2, streams=streams, cache_slots=51, context=1024, steps=steps,
                        warmup=warmup)
            doc = predict(ft, prof, model, streams=streams, cache_slots=51, context=1024,
                          steps=steps, warmup=warmup, seed=None, routing=routing, fraction="0.5")
            rows += strategy_rows(doc, base, 2, {"hybrid": "hybrid0.5", "cpu": "cpu",
                                                 "offload": "offload"})


def summarize_ab(rows, out, experiment, folder, result_csv, knob):
    by = {}
    for r in rows:
        if r["experiment"] == experiment:
            by.setdefault((int(r["streams"]), r["routing"]), {})[r["strategy"]] = r
    measured = read_csv(result_csv)
    out.append(f"## {experiment} (`{folder}`: 2 layers, 51 slots, 15 threads)\n")
    out.append(f"The A/B ({knob}) compares two engine arrangements at the same work; what the "
               "routing moves is that work: the experts the CPU computes per layer (and "
               "offload's misses beside it).\n")
    out.append("| streams | offload miss: legacy / typical | hybrid 0.5: CPU experts per layer, "
               "legacy / typical | cpu: CPU experts per layer | predicted hybrid 0.5 tok/s, "
               "legacy / typical |")
    out.append("|---|---|---|---|---|")
    for s in (1, 4):
        leg, typ = by[(s, ROUTINGS[0])], by[(s, ROUTINGS[1])]
        out.append(f"| {s} | {100 * leg['offload']['miss_rate']:.0f}% / "
                   f"{100 * typ['offload']['miss_rate']:.0f}% | "
                   f"{leg['hybrid0.5']['cpu_per_layer']:.2f} / {typ['hybrid0.5']['cpu_per_layer']:.2f} | "
                   f"{leg['cpu']['cpu_per_layer']:.2f} / {typ['cpu']['cpu_per_layer']:.2f} | "
                   f"{leg['hybrid0.5']['tok_s_total']:.0f} / {typ['hybrid0.5']['tok_s_total']:.0f} |")
    out.append(f"\n(Measured rows: `{result_csv.relative_to(EXP)}`, {len(measured)} runs.)\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu-experiments.py OUTDIR (env FT: the ft binary)")
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    ft = ft_binary()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        profiles = Profiles(tmp)
        print("gpu-experiments: validate-h200", file=sys.stderr)
        run_validate(ft, profiles, rows)
        print("gpu-experiments: runtime-grid", file=sys.stderr)
        run_runtime_grid(ft, profiles, tmp, rows)
        print("gpu-experiments: serve-ab", file=sys.stderr)
        run_serve_ab(ft, profiles, rows)
        print("gpu-experiments: pool-wait, host-submit", file=sys.stderr)
        run_ab(ft, profiles, rows, "pool-wait", "h200-0202", 24, 16)
        run_ab(ft, profiles, rows, "host-submit", "h100-0906", 48, 16)
        clamped = profiles.clamped
    with open(out_dir / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows(rows)
    md = ["# The GPU experiments' configurations on `legacy-typical` and `typical`\n",
          "Written by `experiments/routing-fit/gpu-experiments.py` (predictions only: "
          "nothing here ran on a GPU). `rows.csv` has every prediction.\n"]
    summarize_validate(rows, md)
    summarize_runtime_grid(rows, md)
    summarize_serve_ab(rows, md)
    summarize_ab(rows, md, "pool-wait", "20261205T0213Z-h200",
                 POOL_WAIT / "results.csv", "`--pool-wait spin` against `spin-beside`")
    summarize_ab(rows, md, "host-submit", "20261205T0905Z-h100",
                 HOST_SUBMIT / "results.csv", "`--host-submit overlapped` against `serial`")
    md.append("## Profiles' negative fixed costs set to 0\n")
    for label, term, v in clamped:
        md.append(f"- `{label}`: `{term}` {v:.1f} us")
    md.append("")
    (out_dir / "summary.md").write_text("\n".join(md))
    ver = subprocess.run([ft, "--version"], capture_output=True, text=True).stdout.strip()
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    when = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    (out_dir / "env.txt").write_text(f"date: {when}\nft: {ver}\ncheckout: {rev}\n"
                                     f"command: FT={ft} {' '.join(sys.argv)}\n")
    print(f"gpu-experiments: {len(rows)} rows in {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
