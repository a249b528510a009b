#!/usr/bin/env python3
"""Write the behaviour baseline of `ft predict --json` and `ft simulate --json`.

Every host preset x model preset x 1, 2 and 8 streams, summarised as
`tests/behaviour_baseline.rs` summarises them (the choice, and every strategy's tok/s per
stream and fetch fraction). Run it with the binary of the tree whose behaviour is the
reference (the commit before a refactor):

    python3 experiments/refactor-check/baseline.py path/to/ft > tests/fixtures/behaviour-baseline.json

`cargo test --release --test behaviour_baseline` then checks the tree against it; with
`FT_BASELINE_BIN=path/to/ft` it checks that binary instead (the reference must pass its own
baseline). The arguments below are the test's; keep them in step.
"""
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HOSTS = ["rtx4090-2x-xeon4310", "rtxpro4000-gen3-epyc7302", "gh200", "h200-xeon-emr",
         "2x-rtx3090-tp-ryzen7950x"]
MODELS = ["qwen3.8-flash-next", "qwen3.6-35b-a3b", "deepseek-v4-flash", "gpt-oss-120b",
          "gemma-4-26b-a4b", "minimax-m2.5", "glm-4.7", "bench-nvfp4"]
STREAMS = [1, 2, 8]
PREDICT_STEPS = ["--steps", "6", "--warmup", "6"]
SIMULATE_STEPS = ["--steps", "6", "--warmup", "4"]


def run(ft, args):
    out = subprocess.run([ft] + args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def row(tok_s, fetch):
    return {"tok_s_per_stream": tok_s, "fetch_fraction": fetch}


def predict_summary(v):
    s = {x["kind"]: row(x["tok_s_per_stream"], x["fetch_fraction"])
         for x in v["prediction"]["strategies"]}
    return {"choice": v["decision"]["kind"], "strategies": s}


def simulate_summary(v):
    s = {}
    for x in v["strategies"]:
        s[x["strategy"]] = row(x["sim"]["tok_s_per_stream"], x["fetch_fraction"])
        s[x["strategy"] + " (model)"] = row(x["model"]["tok_s_per_stream"], x["fetch_fraction"])
    return {"choice": v["best"], "strategies": s}


def main():
    ft = sys.argv[1]
    jobs = []
    for h in HOSTS:
        for m in MODELS:
            for n in STREAMS:
                jobs.append((f"predict {h} {m} {n}", ["predict", "--json", "--host", h, "--model",
                             m, "--streams", str(n)] + PREDICT_STEPS))
            jobs.append((f"simulate {h} {m}", ["simulate", "--json", "--host", h, "--model", m,
                         "--streams", ",".join(map(str, STREAMS))] + SIMULATE_STEPS))
    rows = {}
    with ThreadPoolExecutor(2) as pool:
        for (key, _), v in zip(jobs, pool.map(lambda j: run(ft, j[1]), jobs)):
            if key.startswith("predict"):
                rows[key] = predict_summary(v)
            else:
                for x in v:
                    rows[f"{key} {x['streams']}"] = simulate_summary(x)
    print(json.dumps(rows, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
