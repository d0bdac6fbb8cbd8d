#!/usr/bin/env python3
"""Replay a run's measured figures under two dispatch orders on one GPU: the run's own
`dispatch_order` (the spread) and the climb of `src/run/scheduler/climb.rs` (same constants,
same ties). Each variant costs its `worker_ran` seconds; a (shape, dtype) has its best once a
variant within 2 % of the run's best median there has run (bench/compare.py's tolerance).

    scripts/climb-replay.py runs/<id>/log.jsonl[.gz]

A replay, not a measurement: it assumes every build is ready and a variant's worker time does not
depend on when it runs (racing makes later cases cheaper in a real run).
"""
import gzip, json, sys

SPREAD_FIRST, SPREAD_EVERY, TOLERANCE = 6, 4, 1.02

def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    params, worker, timed, order = {}, {}, {}, []
    with opener(path, "rt") as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            e = r["event"]
            if e == "planned" and r.get("invalid") is None:
                params[r["variant"]] = r["params"]
            elif e == "worker_ran":
                worker[r["variant"]] = worker.get(r["variant"], 0.0) + r["seconds"]
            elif e == "timed":
                timed.setdefault(r["variant"], {})[(r["shape"], r["dtype"])] = r["timing"]["median_us"]
            elif e == "dispatch_order":
                order = [x["variant"] for x in r["order"]]
    order = [v for v in (order or list(params)) if v in worker and v in timed]
    return params, worker, timed, order

def differing(a, b):
    return sum(1 for k in set(a) | set(b) if a.get(k) != b.get(k))

def climb(params, timed, order):
    picked, left = [], list(order)
    while left:
        n = len(picked) + 1
        choice = left[0]
        if n > SPREAD_FIRST and (n - SPREAD_FIRST) % SPREAD_EVERY != 0:
            leaders = {}
            for v in picked:
                for case, us in timed[v].items():
                    if case not in leaders or us < timed[leaders[case]][case]:
                        leaders[case] = v
            best = 0
            for v in left:
                near = sum(1 for case, l in leaders.items()
                           if case in timed[v] and differing(params[l], params[v]) == 1)
                if near > best:
                    best, choice = near, v
        picked.append(choice)
        left.remove(choice)
    return picked

def time_to_every_best(order, worker, timed):
    best = {}
    for figures in timed.values():
        for case, us in figures.items():
            best[case] = min(us, best.get(case, us))
    t, reached = 0.0, {}
    for v in order:
        t += worker[v]
        for case, us in timed[v].items():
            if case not in reached and us <= best[case] * TOLERANCE:
                reached[case] = t
    last = max(reached, key=reached.get)
    return reached[last], last

params, worker, timed, order = load(sys.argv[1])
print(f"{len(order)} variants, {sum(worker.values()):.1f} s of workers")
for name, o in [("spread (the run's order)", order), ("climb", climb(params, timed, order))]:
    t, (shape, dtype) = time_to_every_best(o, worker, timed)
    print(f"{name}: every (shape, dtype) at its best by {t:.1f} s of workers (last: {shape} {dtype})")
