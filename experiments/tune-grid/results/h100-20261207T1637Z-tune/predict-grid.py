import csv, json, subprocess, statistics as st
from collections import defaultdict
rows=[r for r in csv.DictReader(open('h100-20261207T1504Z/grid.csv')) if r['model']=='qwen3.8-flash-next']
cfgs=sorted({(r['streams'],r['context'],r['cache_slots'],r['engine']) for r in rows})
out=[]
for s,ctx,slots,eng in cfgs:
    for src,prof in (('calibrated',f'/tmp/cal-{eng}.json'),('host-only','h100-20261207T1637Z-tune/host.toml')):
        flag = ['--profile',prof] if src=='calibrated' else ['--host',prof]
        p=subprocess.run(['/work/main/target/debug/ft','predict',*flag,'--model','h100-20261207T1637Z-tune/flash-4l.toml','--streams',s,'--context',ctx,'--cache-slots',slots,'--fetch-fraction','0.3','--json'],capture_output=True,text=True)
        p2=subprocess.run(['/work/main/target/debug/ft','predict',*flag,'--model','h100-20261207T1637Z-tune/flash-4l.toml','--streams',s,'--context',ctx,'--cache-slots',slots,'--fetch-fraction','0.6','--json'],capture_output=True,text=True)
        try:
            a=json.loads(p.stdout)['prediction']['strategies']; b=json.loads(p2.stdout)['prediction']['strategies']
        except Exception as e:
            print('fail',s,ctx,slots,eng,src,p.stderr[-300:]); continue
        pred={}
        for e in a:
            k=e['strategy']['kind'] if isinstance(e['strategy'],dict) else e['strategy']
            if k=='offload': pred['offload']=e['tok_s_per_stream']
            if k=='cpu': pred['cpu']=e['tok_s_per_stream']
            if k=='hybrid': pred['h30']=e['tok_s_per_stream']
        for e in b:
            k=e['strategy']['kind'] if isinstance(e['strategy'],dict) else e['strategy']
            if k=='hybrid': pred['h60']=e['tok_s_per_stream']
        for r in rows:
            if (r['streams'],r['context'],r['cache_slots'],r['engine'])==(s,ctx,slots,eng) and r['variant'] in pred:
                m=float(r['tok_s_per_stream_median'])
                out.append(dict(streams=s,context=ctx,cache_slots=slots,engine=eng,variant=r['variant'],source=src,measured=m,predicted=round(pred[r['variant']],2),error_pct=round(100*(pred[r['variant']]/m-1),1)))
        print(s,ctx,slots,eng,src,'done',flush=True)
w=csv.DictWriter(open('h100-20261207T1637Z-tune/grid-predicted.csv','w'),fieldnames=list(out[0])); w.writeheader(); w.writerows(out)
