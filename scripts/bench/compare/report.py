#!/usr/bin/env python3
"""Report of scripts/bench-compare.sh: reads its runs.jsonl (one JSON
object per measured run: svc, scenario, round, rate, p50, p99, svc_cpu,
redis_cpu, redis_us) and prints, per scenario, the ratio subject /
reference of each measure (median and range of the per-round ratios), the
absolute medians, and the targets of the lean exact path with PASS or
MISS, judged on the median ratio, or FLOOR when it misses and every
floor service measured in the same run misses the bound too (no service
of that kind met it on this host; the no-op server is no floor of a
target on a service that counts in Redis: it is shown, not judged).

The subject of a scenario is the service that is neither "ref", "noop",
"base" nor a floor (ours, or refmode for the ref* scenarios); "noop" is
the no-op gRPC server, the floor of service CPU and throughput;
"floorlua" and "floorpipe" (scripts/bench/floor) make one Redis round
trip per request and nothing else, the floor of latency at c=1 (and
floorlua of a script's Redis work per call); "floorbatch" makes floorlua's
calls with the requests in flight sharing round trips, the floor of
service CPU of a service that talks to Redis at c=50; "floorloop" shares
them too but sends one call of a minimal loop script per flush, the floor
of Redis' work per decision of a service that decides a batch in one
script call; "base"
(BASE_RATELIMITD) is
another ratelimitd build, and the report then adds the ratios subject /
base.

    python3 scripts/bench/compare/report.py runs.jsonl
"""
import json
import statistics as st
import sys

NAMES = {
    "keys10k": "10k keys, c=50",
    "hot": "hot over-limit key, c=50",
    "c1": "10k keys, c=1",
    "tb": "token bucket vs fixed, c=50",
    "sw": "sliding window vs fixed, c=50",
    "refc50": "reference mode, 10k keys, c=50",
    "refc1": "reference mode, 10k keys, c=1",
    "refhot": "reference mode, hot key, c=50",
}
COLS = [("rate", "throughput"), ("p50", "p50"), ("p99", "p99"), ("svc_cpu", "service CPU/dec"),
        ("redis_cpu", "Redis CPU/dec"), ("redis_us", "Redis exec/dec")]

# The services that are never a scenario's subject.
OTHERS = ("ref", "noop", "base", "floorlua", "floorpipe", "floorbatch", "floorloop")

# The targets: (label, scenario, measure, against, op, bound, floors[,
# shown]). against is "ref" or "noop"; the ratio is subject / against;
# floors are the services whose ratio (floor / against) is the best any
# service of their kind reaches; shown are services printed beside them
# but not judged: the no-op server makes no Redis call, so its service CPU
# and throughput at c=50 bound a service that counts in Redis without
# being reachable by one (floorbatch is that floor).
TARGETS = [
    ("Redis exec/decision, fixed window, 10k keys c=50", "keys10k", "redis_us", "ref", "<=", 1.0, ("floorloop",)),
    ("Redis exec/decision, reference mode c=1", "refc1", "redis_us", "ref", "<=", 1.05, ()),
    ("Redis exec/decision, reference mode c=50", "refc50", "redis_us", "ref", "<=", 1.05, ()),
    ("Redis exec/decision, native c=1", "c1", "redis_us", "ref", "<=", 2.3, ("floorlua",)),
    ("Redis exec/decision, hot over-limit key c=50", "hot", "redis_us", "ref", "<=", 0.05, ()),
    ("service CPU/decision vs reference, c=50", "keys10k", "svc_cpu", "ref", "<=", 0.33, ("floorbatch",), ("noop",)),
    ("service CPU/decision vs no-op gRPC floor, c=50", "keys10k", "svc_cpu", "noop", "<=", 1.5, ()),
    ("p50 vs reference, c=1", "c1", "p50", "ref", "<=", 0.85, ("floorlua", "floorpipe")),
    ("p99 vs reference, c=1", "c1", "p99", "ref", "<=", 0.85, ("floorlua", "floorpipe")),
    ("throughput vs reference, 10k keys c=50", "keys10k", "rate", "ref", ">=", 2.5, ("floorbatch",), ("noop",)),
    ("throughput vs reference, hot key c=50", "hot", "rate", "ref", ">=", 5.0, ("noop",)),
]


def subject(runs, sc):
    for r in runs:
        if r["scenario"] == sc and r["svc"] not in OTHERS:
            return r["svc"]
    return None


def ratios(runs, sc, k, against, subj=None):
    """The per-round ratios subject (or subj) / against of measure k in
    scenario sc."""
    subj = subj or subject(runs, sc)
    rs = []
    for rnd in sorted({r["round"] for r in runs if r["scenario"] == sc}):
        o = [r[k] for r in runs if r["scenario"] == sc and r["round"] == rnd and r["svc"] == subj]
        f = [r[k] for r in runs if r["scenario"] == sc and r["round"] == rnd and r["svc"] == against]
        if o and f and f[0] > 0:
            rs.append(o[0] / f[0])
    return rs


def cell(rs):
    return "%.2f× (%.2f–%.2f)" % (st.median(rs), min(rs), max(rs)) if rs else "–"


def report(runs, out):
    order = []
    for r in runs:
        if r["scenario"] not in order:
            order.append(r["scenario"])
    nrounds = len({r["round"] for r in runs})
    p = lambda s="": print(s, file=out)
    p("== ratio subject / reference, per scenario: median (min–max) over %d rounds" % nrounds)
    p("   (subject: ratelimitd; in the reference-mode scenarios the same binary run with the reference's environment)")
    p("| scenario | " + " | ".join(c[1] for c in COLS) + " | service CPU/dec vs no-op |")
    p("|---|" + "---:|" * (len(COLS) + 1))
    for sc in order:
        cells = [cell(ratios(runs, sc, k, "ref")) for k, _ in COLS]
        cells.append(cell(ratios(runs, sc, "svc_cpu", "noop")))
        p("| %s | %s |" % (NAMES.get(sc, sc), " | ".join(cells)))
    if any(r["svc"] == "base" for r in runs):
        p()
        p("== ratio subject / base (BASE_RATELIMITD), and base / reference and base / no-op")
        p("| scenario | " + " | ".join(c[1] for c in COLS) + " | base svc CPU/dec vs ref | base svc CPU/dec vs no-op | base p50 vs ref | base p99 vs ref |")
        p("|---|" + "---:|" * (len(COLS) + 4))
        for sc in order:
            if not any(r["scenario"] == sc and r["svc"] == "base" for r in runs):
                continue
            cells = [cell(ratios(runs, sc, k, "base")) for k, _ in COLS]
            cells += [cell(ratios(runs, sc, k, a, "base")) for k, a in
                      (("svc_cpu", "ref"), ("svc_cpu", "noop"), ("p50", "ref"), ("p99", "ref"))]
            p("| %s | %s |" % (NAMES.get(sc, sc), " | ".join(cells)))
    p()
    p("absolute medians (subject / reference [/ no-op]):")
    for sc in order:
        subj = subject(runs, sc)

        def med(svc, k):
            v = [r[k] for r in runs if r["scenario"] == sc and r["svc"] == svc]
            return st.median(v) if v else float("nan")
        line = "  %-31s %7.0f / %7.0f per s; p50 %5.0f / %5.0f µs; p99 %5.0f / %5.0f µs; svc CPU %5.1f / %5.1f" % (
            NAMES.get(sc, sc), med(subj, "rate"), med("ref", "rate"), med(subj, "p50"), med("ref", "p50"),
            med(subj, "p99"), med("ref", "p99"), med(subj, "svc_cpu"), med("ref", "svc_cpu"))
        if any(r["scenario"] == sc and r["svc"] == "noop" for r in runs):
            line += " / %5.1f" % med("noop", "svc_cpu")
        for f in ("floorlua", "floorpipe", "floorbatch", "floorloop"):
            if any(r["scenario"] == sc and r["svc"] == f for r in runs):
                line += "; %s %.0f per s, p50 %.0f µs, p99 %.0f µs, svc CPU %.1f, Redis exec %.2f" % (
                    f, med(f, "rate"), med(f, "p50"), med(f, "p99"), med(f, "svc_cpu"), med(f, "redis_us"))
                fb = [r["decisions"] / r["script_calls"] for r in runs
                      if r["scenario"] == sc and r["svc"] == f and r.get("script_calls")]
                if fb:
                    line += " (%.1f decisions per script call)" % st.median(fb)
        line += "; Redis CPU %5.1f / %5.1f; Redis exec %5.2f / %5.2f µs per decision" % (
            med(subj, "redis_cpu"), med("ref", "redis_cpu"), med(subj, "redis_us"), med("ref", "redis_us"))
        batch = [r["decisions"] / r["script_calls"] for r in runs
                 if r["scenario"] == sc and r["svc"] == subj and r.get("script_calls")]
        if batch:
            line += "; %.1f decisions per script call" % st.median(batch)
        p(line)
    p()
    p("== targets (median of the per-round ratios; Redis exec from INFO commandstats, which the host's load inflates:")
    p("   scripts/callgrind-redis.sh measures Redis' cost per decision independently of load)")
    p("   FLOOR: missed, and every floor service of the same run misses it too (their median ratios in brackets)")
    for label, sc, k, against, op, bound, floors, *shown in TARGETS:
        rs = ratios(runs, sc, k, against)
        if not rs:
            p("  %-50s %-22s target %s %-5g  NOT RUN (scenario %s)" % (label, "–", op, bound, sc))
            continue
        meets = lambda m: m <= bound if op == "<=" else m >= bound
        verdict = "PASS" if meets(st.median(rs)) else "MISS"
        fl, floor_meets = [], False
        for f in floors:
            frs = ratios(runs, sc, k, against, f)
            if frs:
                fl.append("%s %.2f×" % (f, st.median(frs)))
                floor_meets = floor_meets or meets(st.median(frs))
        if verdict == "MISS" and fl and not floor_meets:
            verdict = "FLOOR"
        sh = ["%s %.2f× (no Redis)" % (f, st.median(frs)) for f in (shown[0] if shown else ())
              for frs in [ratios(runs, sc, k, against, f)] if frs]
        note = " [%s]" % "; ".join(x for x in (", ".join(fl), ", ".join(sh)) if x) if fl or sh else ""
        p("  %-50s %-22s target %s %-5g  %s%s" % (label, cell(rs), op, bound, verdict, note))


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    report(runs, sys.stdout)


if __name__ == "__main__":
    main()
