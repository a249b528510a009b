#!/usr/bin/env python3
"""Calibrate on a few grid configurations' decode runs, predict the rest of the grid.

Why: tune's runs on the GPU were client-side end to end (prefill in them) at one
configuration, and the terms fitted there did not carry to decode-only tok/s elsewhere. This
asks the other question first: if calibration sees decode-measured runs (as tune's
`--measure decode` records them), at two configurations, how well does the calibrated model
predict the configurations it did not see? The training runs are grid rows (all four
variants of each training configuration); every prediction uses the grid's run length
(16 warm-up and 32 counted steps from an empty cache), since the grid's miss rates are those
of such short runs.

Usage: holdout.py GRID.csv MODEL.toml HOST.toml ENGINE TRAIN... [--ft FT] [--out CSV]
  TRAIN: streams,context,slots (e.g. 1,1024,102)
Prints one summary line; --out writes every held-out prediction.
"""
import argparse, csv, json, os, statistics as st, subprocess, sys, tempfile

VARIANTS = {'offload': ('offload', None), 'h30': ('hybrid', 0.3), 'h60': ('hybrid', 0.6), 'cpu': ('cpu', None)}
RUN_LEN = ['--warmup', '16', '--steps', '32']


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('grid'); ap.add_argument('model'); ap.add_argument('host'); ap.add_argument('engine')
    ap.add_argument('train', nargs='+')
    ap.add_argument('--ft', default=os.environ.get('FT', 'ft'))
    ap.add_argument('--out')
    a = ap.parse_args()
    name = open(a.model).read().split('name = "')[1].split('"')[0]
    rows = [r for r in csv.DictReader(open(a.grid)) if r['model'] == name and r['engine'] == a.engine]
    key = lambda r: (r['streams'], r['context'], r['cache_slots'])
    train = {tuple(t.split(',')) for t in a.train}
    tmp = tempfile.mkdtemp()
    obs, prof = os.path.join(tmp, 'obs.csv'), os.path.join(tmp, 'cal.json')
    with open(obs, 'w') as f:
        f.write('strategy,fetch_fraction,streams,output_tokens,context,cache_slots,tok_s,per,measure,threads,label\n')
        for r in rows:
            if key(r) in train:
                s, ff = VARIANTS[r['variant']]
                f.write(f"{s},{'' if ff is None else ff},{r['streams']},256,{r['context']},{r['cache_slots']},"
                        f"{r['tok_s_per_stream_median']},stream,decode,{r['threads']},{r['variant']}\n")
    cal = subprocess.run([a.ft, 'calibrate', '--observations', obs, '--host', a.host, '--model', a.model,
                          '--out', prof, *RUN_LEN], capture_output=True, text=True)
    if cal.returncode:
        sys.exit(cal.stderr)
    out, errs, losses = [], [], []
    for c in sorted({key(r) for r in rows} - train):
        pred = {}
        for src, flag in (('calibrated', ['--profile', prof]), ('host-only', ['--host', a.host])):
            for ff in ('0.3', '0.6'):
                p = subprocess.run([a.ft, 'predict', *flag, '--model', a.model, '--streams', c[0], '--context', c[1],
                                    '--cache-slots', c[2], '--fetch-fraction', ff, *RUN_LEN, '--json'],
                                   capture_output=True, text=True)
                for e in json.loads(p.stdout)['prediction']['strategies']:
                    k = e['kind']
                    v = {'hybrid': 'h30' if ff == '0.3' else 'h60'}.get(k, k)
                    if v in VARIANTS:
                        pred[(src, v)] = e['tok_s_per_stream']
        meas = {r['variant']: r for r in rows if key(r) == c}
        for src in ('calibrated', 'host-only'):
            p = {v: pred[(src, v)] for v in meas if (src, v) in pred}
            best = max(float(r['tok_s_per_stream_median']) for r in meas.values())
            choice = max(p, key=p.get)
            loss = 1 - float(meas[choice]['tok_s_per_stream_median']) / best
            for v, r in meas.items():
                m = float(r['tok_s_per_stream_median'])
                out.append(dict(engine=a.engine, streams=c[0], context=c[1], cache_slots=c[2], variant=v, source=src,
                                measured=m, spread_pct=r['spread_pct'], predicted=round(p[v], 2),
                                error_pct=round(100 * (p[v] / m - 1), 1), choice=choice, choice_loss_pct=round(100 * loss, 1)))
    for src in ('calibrated', 'host-only'):
        e = sorted(abs(o['error_pct']) for o in out if o['source'] == src)
        l = {(o['streams'], o['context'], o['cache_slots']): o['choice_loss_pct'] for o in out if o['source'] == src}
        print(f"{a.engine:8s} {src:10s} train={' '.join(a.train):28s} held-out={len(l)} configs/{len(e)} points "
              f"median={st.median(e):.1f}% p90={e[int(0.9 * (len(e) - 1))]:.1f}% "
              f"mean-loss={st.mean(l.values()):.1f}% worst-loss={max(l.values()):.1f}%")
    if a.out:
        w = csv.DictWriter(open(a.out, 'w'), fieldnames=list(out[0])); w.writeheader(); w.writerows(out)


main()
