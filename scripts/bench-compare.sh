#!/usr/bin/env bash
# Measures ratelimitd against the reference (envoyproxy/ratelimit, built
# here from its module at REF_VERSION) in one run: one redis-server, one
# load client (cmd/rlload --client h2), the two services alternating, the
# same scenarios, and prints per scenario the ratio ratelimitd / reference
# of each measure: median and range over the rounds (each round measures
# both, in alternating order).
#
#   scripts/bench-compare.sh [duration=5s] [rounds=3]
#
# Scenarios (SCENARIOS, default all, space-separated):
#   keys10k  c=50, descriptor user=user-N, N uniform over 10,000 (fixed window 1000/s: almost all OK)
#   hot      c=50, one descriptor hot=hot-0 on 10/hour: OVER_LIMIT after the first 10
#   c1       c=1, as keys10k
#   tb       c=50, 10,000 keys; ratelimitd token_bucket vs the reference's fixed window
#   sw       c=50, 10,000 keys; ratelimitd sliding_window vs the reference's fixed window
# Configs: scripts/bench/compare/{ratelimitd,reference}/config.yaml.
#
# Per run: FLUSHALL, 1 s of unmeasured load (the same scenario), CONFIG
# RESETSTAT, then the measured run (rlload --warmup 0 --duration D), then
# INFO commandstats and INFO cpu. Measures per run:
#   throughput    decisions/s (OK + OVER_LIMIT answers)
#   p50, p99      client-observed latency
#   svc CPU/dec   the service process' user+system CPU (/proc/<pid>/stat) / decisions
#   redis CPU/dec INFO cpu used_cpu_user + used_cpu_sys delta / decisions
#   redis us/dec  INFO commandstats: the usec of the service's top-level
#                 commands (see redis_usec) / decisions: Redis' execution
#                 time, without networking
# A run with errors is reported (errors column); its ratios still count.
#
# Environment: REF_VERSION (the module version); REF_RATELIMITD (a
# ratelimitd binary) runs that build in the reference's place, with
# ratelimitd's config, for a same-run A/B of two builds ("ours" is this
# tree, or OURS_RATELIMITD); SVC_ARGS (extra ratelimitd
# serve flags), REF_ENV (extra reference environment, e.g.
# "LOCAL_CACHE_SIZE_IN_BYTES=1048576"), KEEP=1 keeps the work directory
# (raw JSON results in runs.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5s}; ROUNDS=${2:-3}
SCENARIOS=${SCENARIOS:-keys10k hot c1 tb sw}
REF_VERSION=${REF_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
./scripts/ensure-redis.sh >/dev/null
work=$(mktemp -d)
cleanup() {
  kill -CONT ${OURS:-} ${REF:-} 2>/dev/null || true
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  if [ "${KEEP:-}" = 1 ]; then echo "work directory: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

if [ -n "${REF_RATELIMITD:-}" ]; then
  echo "== A/B: \"ours\" is ${OURS_RATELIMITD:-this tree}, \"ref\" is $REF_RATELIMITD (ratios: ours / ref)"
else
  echo "== building ratelimitd, rlload and the reference (envoyproxy/ratelimit $REF_VERSION)"
fi
if [ -n "${OURS_RATELIMITD:-}" ]; then cp "$OURS_RATELIMITD" "$work/ratelimitd"; else go build -o "$work/ratelimitd" ./cmd/ratelimitd; fi
go build -o "$work/rlload" ./cmd/rlload
if [ -z "${REF_RATELIMITD:-}" ]; then
  GOBIN="$work/refbin" GOFLAGS=-mod=mod go install "github.com/envoyproxy/ratelimit/src/service_cmd@$REF_VERSION"
fi

RP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
rc() { redis-cli -p "$RP" "$@"; }

# ratelimitd, defaults but for the addresses
OG=$(free_port); OH=$(free_port); OD=$(free_port)
read -r -a svc_args <<<"${SVC_ARGS:-}"
"$work/ratelimitd" serve --config scripts/bench/compare/ratelimitd/config.yaml --backend redis \
  --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:$OG" --http-addr "127.0.0.1:$OH" \
  --debug-addr "127.0.0.1:$OD" --log-level error "${svc_args[@]}" >"$work/ours.log" 2>&1 &
OURS=$!

# the reference, defaults but for the addresses, Redis, config and stats
RG=$(free_port); RH=$(free_port); RD=$(free_port)
mkdir -p "$work/runtime/ratelimit/config"
cp scripts/bench/compare/reference/config.yaml "$work/runtime/ratelimit/config/"
read -r -a ref_env <<<"${REF_ENV:-}"
if [ -n "${REF_RATELIMITD:-}" ]; then # A/B: another ratelimitd build in the reference's place
  "$REF_RATELIMITD" serve --config scripts/bench/compare/ratelimitd/config.yaml --backend redis \
    --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:$RG" --http-addr "127.0.0.1:$RH" \
    --debug-addr "127.0.0.1:$RD" --log-level error "${svc_args[@]}" >"$work/ref.log" 2>&1 &
else
env RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
  REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=error \
  HOST=127.0.0.1 PORT="$RH" GRPC_HOST=127.0.0.1 GRPC_PORT="$RG" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$RD" \
  "${ref_env[@]}" "$work/refbin/service_cmd" >"$work/ref.log" 2>&1 &
fi
REF=$!

for port in "$OH" "$RH"; do
  ok=
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthcheck" >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  [ -n "$ok" ] || { echo "a service did not become healthy"; cat "$work/ours.log" "$work/ref.log"; exit 1; }
done

scenario() { # name -> "concurrency keys key"
  case "$1" in
    keys10k) echo "50 10000 user" ;;
    hot) echo "50 1 hot" ;;
    c1) echo "1 10000 user" ;;
    tb) echo "50 10000 tb" ;;
    sw) echo "50 10000 sw" ;;
    *) echo "unknown scenario $1" >&2; exit 2 ;;
  esac
}
proc_cpu() { awk '{ printf "%d", $14 + $15 }' "/proc/$1/stat"; } # clock ticks
redis_cpu() { rc info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'; }
# redis_usec prints the usec of the top-level commands and every
# command's calls and usec. INFO commandstats also counts the commands a
# script calls, inside the script's own usec: for ratelimitd only EVALSHA,
# EVAL, SCRIPT and PING are top-level (every other command it causes comes
# from its scripts); the reference calls no script, so all of its count.
redis_usec() { # service
  rc info commandstats | tr -d '\r' | awk -F'[:,=]' -v svc="$1" '
  /^cmdstat_/ && $1 != "cmdstat_info" && $1 != "cmdstat_config|resetstat" {
    n = substr($1, 9); c = c sprintf("%s %s calls %s usec; ", n, $3, $5)
    if (svc == "ref" || n == "evalsha" || n == "eval" || n ~ /^script/ || n == "ping") u += $5 }
  END { printf "%d\t%s", u, c }'; }

run() { # service scenario round
  local svc=$1 sc=$2 round=$3 addr pid other conc keys key
  read -r conc keys key < <(scenario "$sc")
  if [ "$svc" = ours ]; then addr=127.0.0.1:$OG; pid=$OURS; other=$REF; else addr=127.0.0.1:$RG; pid=$REF; other=$OURS; fi
  # the other service is stopped (SIGSTOP) while this one runs: neither its
  # CPU nor its health checks reach the measurement
  kill -STOP "$other"; kill -CONT "$pid"
  rc flushall >/dev/null
  "$work/rlload" --client h2 --addr "$addr" --concurrency "$conc" --keys "$keys" --key "$key" \
    --warmup 0 --duration 1s >/dev/null
  rc config resetstat >/dev/null
  local c0 r0 c1 r1 us
  c0=$(proc_cpu "$pid"); r0=$(redis_cpu)
  "$work/rlload" --client h2 --addr "$addr" --concurrency "$conc" --keys "$keys" --key "$key" \
    --warmup 0 --duration "$DUR" --json >"$work/r.json"
  c1=$(proc_cpu "$pid"); r1=$(redis_cpu)
  local filt=$svc; [ -n "${REF_RATELIMITD:-}" ] && filt=ours
  us=$(redis_usec "$filt")
  python3 - "$svc" "$sc" "$round" "$((c1 - c0))" "$(getconf CLK_TCK)" "$r0" "$r1" "$us" "$(cut -d' ' -f1 /proc/loadavg)" "$work/r.json" >>"$work/runs.jsonl" <<'EOF'
import json, sys
svc, sc, rnd, ticks, hz, r0, r1, us, load, path = sys.argv[1:]
r = json.load(open(path))
usec, cmds = us.split("\t", 1)
d = max(r["decisions"], 1)
print(json.dumps({"svc": svc, "scenario": sc, "round": int(rnd), "load": float(load),
  "rate": r["decisions_per_second"], "p50": r["p50_us"], "p99": r["p99_us"],
  "decisions": r["decisions"], "over_limit": r["over_limit"], "errors": r["errors"],
  "svc_cpu": int(ticks) / int(hz) * 1e6 / d, "redis_cpu": (float(r1) - float(r0)) * 1e6 / d,
  "redis_us": int(usec) / d, "cmds": cmds}))
EOF
  tail -1 "$work/runs.jsonl" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print("  %-4s %-8s round %d: %8.0f/s p50 %6.0f p99 %6.0f µs, svc CPU %5.1f, redis CPU %5.1f, redis exec %5.2f µs/decision; over_limit %d, errors %d, load %.1f; %s" % (
  r["svc"], r["scenario"], r["round"], r["rate"], r["p50"], r["p99"], r["svc_cpu"], r["redis_cpu"], r["redis_us"], r["over_limit"], r["errors"], r["load"], r["cmds"]))'
}

echo "== machine: $(nproc) cores, redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2), $(go version | cut -d' ' -f3); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $ROUNDS rounds × ($SCENARIOS) × (ratelimitd, reference), $DUR each"
for round in $(seq "$ROUNDS"); do
  for sc in $SCENARIOS; do
    # alternate which service goes first
    if [ $((round % 2)) = 1 ]; then run ref "$sc" "$round"; run ours "$sc" "$round"
    else run ours "$sc" "$round"; run ref "$sc" "$round"; fi
  done
done
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ratio ratelimitd / reference, per scenario: median (min–max) over $ROUNDS rounds"
python3 - "$work/runs.jsonl" <<'EOF'
import json, sys, statistics as st
runs = [json.loads(l) for l in open(sys.argv[1])]
names = {"keys10k": "10k keys, c=50", "hot": "hot over-limit key, c=50", "c1": "10k keys, c=1",
         "tb": "token bucket vs fixed, c=50", "sw": "sliding window vs fixed, c=50"}
cols = [("rate", "throughput"), ("p50", "p50"), ("p99", "p99"), ("svc_cpu", "service CPU/dec"),
        ("redis_cpu", "Redis CPU/dec"), ("redis_us", "Redis exec/dec")]
print("| scenario | " + " | ".join(c[1] for c in cols) + " |")
print("|---|" + "---:|" * len(cols))
order = []
for r in runs:
    if r["scenario"] not in order: order.append(r["scenario"])
for sc in order:
    cells = []
    for k, _ in cols:
        rs = []
        for rnd in sorted({r["round"] for r in runs if r["scenario"] == sc}):
            o = [r[k] for r in runs if r["scenario"] == sc and r["round"] == rnd and r["svc"] == "ours"]
            f = [r[k] for r in runs if r["scenario"] == sc and r["round"] == rnd and r["svc"] == "ref"]
            if o and f and f[0] > 0: rs.append(o[0] / f[0])
        cells.append("%.2f× (%.2f–%.2f)" % (st.median(rs), min(rs), max(rs)) if rs else "–")
    print("| %s | %s |" % (names.get(sc, sc), " | ".join(cells)))
print()
print("absolute medians (ratelimitd / reference):")
for sc in order:
    def med(svc, k): return st.median([r[k] for r in runs if r["scenario"] == sc and r["svc"] == svc])
    print("  %-30s %7.0f / %7.0f per s; p50 %5.0f / %5.0f µs; p99 %5.0f / %5.0f µs; svc CPU %5.1f / %5.1f; Redis CPU %5.1f / %5.1f; Redis exec %5.2f / %5.2f µs per decision" % (
        names.get(sc, sc), med("ours", "rate"), med("ref", "rate"), med("ours", "p50"), med("ref", "p50"),
        med("ours", "p99"), med("ref", "p99"), med("ours", "svc_cpu"), med("ref", "svc_cpu"),
        med("ours", "redis_cpu"), med("ref", "redis_cpu"), med("ours", "redis_us"), med("ref", "redis_us")))
EOF
