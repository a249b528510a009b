#!/usr/bin/env python3
"""validate-h200 repeat.sh's summary: the spread of the same `cpu` run between processes
against its spread between the rounds of one process (tok/s, and the bank's same-run STREAM
read). Usage: repeat.py OUT_DIR."""
import json
import statistics as st
import sys
from pathlib import Path


def spread(values):
    """max / min, the relative standard deviation, and the share more than 10% off the median."""
    m = st.median(values)
    off = sum(abs(v / m - 1) > 0.10 for v in values)
    return max(values) / min(values), st.pstdev(values) / st.mean(values), off


def main():
    out = Path(sys.argv[1])
    threads = sorted({int(p.name.split("-t")[1].split("-")[0])
                      for p in (out / "runs").glob("proc-t*-*.json")})
    for t in threads:
        procs = []
        for p in sorted((out / "runs").glob(f"proc-t{t}-*.json")):
            try:
                d = json.loads(p.read_text())
            except ValueError:
                print(f"{p.name}: not a report (see its .log)")
                continue
            procs.append((d["summary"]["tok_s_total"], d["cpu"].get("stream_read_gbs")))
        if procs:
            tok = [x[0] for x in procs]
            mm, sd, off = spread(tok)
            print(f"{t} threads, {len(tok)} processes: tok/s median {st.median(tok):.0f}, "
                  f"max/min {mm:.3f}, rel. sd {sd:.3f}, more than 10% off the median {off}")
            reads = [x[1] for x in procs if x[1]]
            if reads:
                mm, sd, _ = spread(reads)
                print(f"    STREAM read median {st.median(reads):.1f} GB/s, max/min {mm:.3f}")
            print("    per process:", " ".join(f"{v:.0f}" for v in tok))
        one = out / "runs" / f"one-t{t}.json"
        try:
            d = json.loads(one.read_text())
        except (OSError, ValueError):
            print(f"{one.name}: missing or not a report")
            continue
        rounds = d.get("repeats") or []
        if len(rounds) > 1:
            mm, sd, off = spread(rounds)
            print(f"{t} threads, one process, {len(rounds)} rounds: tok/s median "
                  f"{st.median(rounds):.0f}, max/min {mm:.3f}, rel. sd {sd:.3f}, more than 10% "
                  f"off the median {off}")
            reads = d["cpu"].get("stream_read_rounds_gbs") or []
            if len(reads) > 1:
                mm, sd, _ = spread(reads)
                print(f"    STREAM read median {st.median(reads):.1f} GB/s, max/min {mm:.3f}")
            print("    per round:", " ".join(f"{v:.0f}" for v in rounds))


if __name__ == "__main__":
    main()
