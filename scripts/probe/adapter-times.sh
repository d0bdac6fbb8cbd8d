python3 - <<'PY' > /tmp/req.json
import json,gzip,math
for l in gzip.open('docs/measurements/2026-11-29-h200x2-kernel-tuner-staged/flashtune/log.jsonl.gz','rt'):
    h=json.loads(l); break
shapes=[]
for s in h['shapes']:
    per=2*(2*s['b']*s['h']*(s['sq']+s['sk']))*s['d']
    s=dict(s); s['sets']=max(2,min(1000,math.ceil(2*h['device']['l2_bytes']/per))); shapes.append(s)
print(json.dumps({"shapes":shapes,"dtypes":["f16","bf16"],"backends":["flash","cudnn","efficient","default","fa4"],"warmup_ms":20,"samples":30,"min_sample_us":500,"seed":1,"ceilings":True,"device":0}))
PY
t0=$(date +%s.%N); python3 baselines/torch_sdpa.py < /tmp/req.json > $OUT/adapter.json; echo "adapter wall $(python3 -c "import time;print(time.time()-$t0)")"
python3 - <<'PY'
import json,collections
r=json.load(open(''+__import__('os').environ['OUT']+'/adapter.json'))
print('startup_s %.2f ceilings_s %.2f rows %.2f'%(r['startup_s'],r['ceilings_s'],sum(x['seconds'] for x in r['rows'])))
by=collections.defaultdict(float)
for x in r['rows']: by[x['backend']]+=x['seconds']
print(dict(by))
for x in sorted(r['rows'],key=lambda x:-x['seconds'])[:15]: print(round(x['seconds'],2), x['shape'], x['dtype'], x['backend'], x.get('launches_per_sample'), x.get('error','')[:60])
PY
