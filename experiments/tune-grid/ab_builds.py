#!/usr/bin/env python3
"""Summarise an alternated A/B of several builds (served-call.sh, step 2).

    ab_builds.py RESULTS_DIR [--base new] [--out ab-builds.csv]

RESULTS_DIR holds ab-r{round}-{build}.json (`ft run --interleave ... --repeat R --json` of each
build, same traffic). For each build and variant: decode tok/s per stream over every round and
repeat (median, min, max), its ratio to the base build's median, the CPU side's busy time and
the host's wait per step (medians over rounds), the largest share of the machine's CPU time
the hypervisor took during one of its runs (steal), and the traffic (miss rate, fetched and CPU
experts per layer), which must be the same for every build for the A/B to mean anything.
"""
import argparse, csv, glob, json, os, re, statistics as st, sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('results')
    ap.add_argument('--base', default='new')
    ap.add_argument('--out')
    a = ap.parse_args()
    runs = {}  # (build, variant) -> dict of lists
    for path in sorted(glob.glob(os.path.join(a.results, 'ab-r*-*.json'))):
        m = re.match(r'ab-r(\d+)-(.+)\.json$', os.path.basename(path))
        if not m:
            continue
        build = m.group(2)
        try:
            entries = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f'{path}: skipped ({e})', file=sys.stderr)
            continue
        for e in entries:
            s = e['summary']
            r = runs.setdefault((build, e['label']), dict(tok=[], cpu=[], wait=[], steal=[], traffic=set()))
            reps = e.get('repeats') or [s['tok_s_total']]
            r['tok'] += [t / s['streams'] for t in reps]
            r['cpu'].append(s['cpu_busy_us'])
            r['wait'].append(s['host_wait_us'])
            r['steal'].append(e.get('host_steal_fraction') or 0.0)
            r['traffic'].add((round(s['miss_rate'], 4), round(s['fetched_per_layer'], 3),
                              round(s['cpu_per_layer'], 3)))
    if not runs:
        sys.exit(f'{a.results}: no ab-r*-*.json')
    rows = []
    for (build, variant), r in sorted(runs.items()):
        base = runs.get((a.base, variant))
        med = st.median(r['tok'])
        traffic = sorted(r['traffic'])
        rows.append(dict(
            build=build, variant=variant, runs=len(r['tok']), tok_s_median=round(med, 1),
            tok_s_min=round(min(r['tok']), 1), tok_s_max=round(max(r['tok']), 1),
            vs_base=round(med / st.median(base['tok']), 3) if base else '',
            cpu_busy_us=round(st.median(r['cpu']), 1), host_wait_us=round(st.median(r['wait']), 1),
            steal_max=round(max(r['steal']), 3),
            miss_rate=traffic[0][0], fetched_per_layer=traffic[0][1], cpu_per_layer=traffic[0][2],
            same_traffic_every_round=len(traffic) == 1))
    w = csv.DictWriter(open(a.out, 'w', newline='') if a.out else sys.stdout, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)


if __name__ == '__main__':
    main()
