#!/usr/bin/env python3
"""The served grid against the model calibrated on ft tune's runs of the same engine.

Why: a tune of `ft serve` is judged by configurations tune did not run, measured through the
same server (served decode is 0.3-0.6x `ft run`'s). `served-grid.sh` measured them; this
collects its rounds, calibrates on tune's observations (decode rows: what tune's decision is
about) and predicts every grid configuration from the calibrated profile and from the host
inputs alone.

Usage:
  served_grid.py collect RESULTS_DIR --out grid.csv
  served_grid.py predict grid.csv TUNE_OBSERVATIONS.csv MODEL.toml HOST.toml --out predicted.csv
      --expert-gib GIB [--ft FT] [--prefill-chunk 512] [--calibration-out JSON]
Prints one summary line per source.
"""
import argparse, csv, glob, json, os, statistics as st, subprocess, sys, tempfile

VARIANTS = {'offload': ('offload', None), 'h30': ('hybrid', 0.3), 'h60': ('hybrid', 0.6)}


def collect(a):
    rows = []
    for d in sorted(glob.glob(os.path.join(a.results, 'grid', '*', 'done'))):
        d = os.path.dirname(d)
        model, s, c, r = os.path.basename(d).rsplit('-', 3)
        for v in VARIANTS:
            rounds, basis, ttft = [], set(), []
            for k in (1, 2, 3):
                p = os.path.join(d, f'r{k}-{v}.json')
                try:
                    run = json.load(open(p))['runs'][0]
                except (OSError, ValueError, KeyError, IndexError):
                    continue
                if run.get('errors'):
                    continue
                rounds.append(run['decode_tok_s'])
                basis.add(run['decode_basis'])
                ttft.append(run['mean_ttft_s'])
            if not rounds:
                continue
            med = st.median(rounds)
            rows.append(dict(model=model, streams=int(s[1:]), context=int(c[1:]), residency=float(r[1:]),
                             variant=v, rounds=len(rounds),
                             tok_s_r1=_at(rounds, 0), tok_s_r2=_at(rounds, 1), tok_s_r3=_at(rounds, 2),
                             tok_s_median=round(med, 2),
                             spread_pct=round(100 * (max(rounds) - min(rounds)) / med, 1),
                             ttft_s_median=round(st.median(ttft), 3), basis='/'.join(sorted(basis))))
    w = csv.DictWriter(open(a.out, 'w'), fieldnames=list(rows[0]))
    w.writeheader(); w.writerows(rows)
    print(f'{len(rows)} rows, {len({(r["model"], r["streams"], r["context"], r["residency"]) for r in rows})} configurations')


def _at(xs, i):
    return round(xs[i], 2) if i < len(xs) else ''


def predict(a):
    name = open(a.model).read().split('name = "')[1].split('"')[0]
    grid = [r for r in csv.DictReader(open(a.grid)) if r['model'] == name]
    configs = sorted({(r['streams'], r['context'], r['residency']) for r in grid}, key=lambda k: tuple(map(float, k)))
    tmp = tempfile.mkdtemp()
    prof = os.path.join(tmp, 'cal.json')
    cal = subprocess.run([a.ft, 'calibrate', '--observations', a.observations, '--host', a.host, '--model', a.model,
                          '--prefill-chunk', str(a.prefill_chunk), '--out', prof, '--json'],
                         capture_output=True, text=True)
    if cal.returncode:
        sys.exit(cal.stderr)
    if a.calibration_out:
        open(a.calibration_out, 'w').write(cal.stdout)
    out = []
    for c in configs:
        s, ctx, res = c
        gb = f'{float(res) * a.expert_gib:.4f}'
        pred = {}
        for src, flag in (('calibrated', ['--profile', prof]), ('host-only', ['--host', a.host])):
            for ff, v in (('0.3', 'h30'), ('0.6', 'h60')):
                p = subprocess.run([a.ft, 'predict', *flag, '--model', a.model, '--streams', s, '--context', ctx,
                                    '--cache-gb', gb, '--fetch-fraction', ff, '--json'],
                                   capture_output=True, text=True)
                if p.returncode:
                    sys.exit(p.stderr)
                for e in json.loads(p.stdout)['prediction']['strategies']:
                    k = e['kind']
                    if k == 'hybrid':
                        pred[(src, v)] = e['tok_s_per_stream']
                    elif k == 'offload':
                        pred[(src, 'offload')] = e['tok_s_per_stream']
        meas = {r['variant']: r for r in grid if (r['streams'], r['context'], r['residency']) == c}
        best = max(float(r['tok_s_median']) for r in meas.values())
        for src in ('calibrated', 'host-only'):
            p = {v: pred[(src, v)] for v in meas}
            choice = max(p, key=p.get)
            loss = 1 - float(meas[choice]['tok_s_median']) / best
            for v, r in meas.items():
                m = float(r['tok_s_median'])
                out.append(dict(model=name, streams=s, context=ctx, residency=res, variant=v, source=src,
                                measured=m, spread_pct=r['spread_pct'], predicted=round(p[v], 2),
                                error_pct=round(100 * (p[v] / m - 1), 1), choice=choice,
                                choice_loss_pct=round(100 * loss, 1),
                                allowed_loss_pct=round(float(meas[choice]['spread_pct']) + 3, 1)))
    for src in ('calibrated', 'host-only'):
        e = sorted(abs(o['error_pct']) for o in out if o['source'] == src)
        l = {(o['streams'], o['context'], o['residency']): (o['choice_loss_pct'], o['allowed_loss_pct'])
             for o in out if o['source'] == src}
        over = sum(1 for x, y in l.values() if x > y)
        print(f"{name:20s} {src:10s} {len(l)} configs/{len(e)} points median={st.median(e):.1f}% "
              f"p90={e[int(0.9 * (len(e) - 1))]:.1f}% mean-loss={st.mean(x for x, _ in l.values()):.1f}% "
              f"worst-loss={max(x for x, _ in l.values()):.1f}% over-allowed={over}")
    w = csv.DictWriter(open(a.out, 'w'), fieldnames=list(out[0]))
    w.writeheader(); w.writerows(out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest='cmd', required=True)
    c = sub.add_parser('collect'); c.add_argument('results'); c.add_argument('--out', required=True)
    p = sub.add_parser('predict')
    p.add_argument('grid'); p.add_argument('observations'); p.add_argument('model'); p.add_argument('host')
    p.add_argument('--out', required=True); p.add_argument('--ft', default=os.environ.get('FT', 'ft'))
    p.add_argument('--prefill-chunk', type=int, default=512)
    p.add_argument('--expert-gib', type=float, required=True, help='all experts of the run layers, GiB')
    p.add_argument('--calibration-out')
    a = ap.parse_args()
    collect(a) if a.cmd == 'collect' else predict(a)


main()
