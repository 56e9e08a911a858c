#!/usr/bin/env bash
# Measures ratelimitd against the reference (envoyproxy/ratelimit, built
# here from its module at REF_VERSION) in one run: one redis-server, one
# load client (cmd/rlload --client h2), the services alternating, the same
# scenarios, and prints per scenario the ratio ratelimitd / reference of
# each measure (median and range over the rounds; each round measures every
# service of the scenario, the order flipping every round), then the
# targets of the lean exact path with PASS or MISS.
#
#   scripts/bench-compare.sh [duration=5s] [rounds=3]
#
# Services, all started once:
#   ours     this tree's ratelimitd, serve --config (native mode), flags
#   ref      the reference, configured by its environment variables
#   refmode  the same ratelimitd binary run with the reference's
#            environment instead of flags (reference mode: `serve` with
#            RUNTIME_ROOT, REDIS_URL, ..., what a migrating user runs)
#   noop     scripts/bench/noop: a grpc-go RateLimitService answering OK
#            with no work, the floor of service CPU per decision
#   floorlua scripts/bench/floor --mode lua: a grpc-go RateLimitService
#            making one Redis round trip per request, one EVALSHA of a
#            minimal INCRBY+PEXPIRE script, and nothing else: the floor of
#            latency and Redis work of a script-based service at c=1
#   floorpipe scripts/bench/floor --mode pipe: the same with INCRBY and
#            EXPIRE pipelined (the reference's commands) instead
#   floorbatch scripts/bench/floor --mode batch: floorlua's commands, but
#            the requests in flight share round trips (one write and one
#            read per flush of up to 128 requests, as ratelimitd's
#            batcher): the floor of service CPU of a service that talks
#            to Redis at c=50
#   floorloop scripts/bench/floor --mode loop: floorbatch's round trips,
#            but one EVALSHA of a minimal loop script (INCRBY each key,
#            PEXPIRE it when new, return the counts) per flush: the floor
#            of Redis' work per decision of a service that decides a batch
#            of fixed-window hits in one script call, at c=50
# Scenarios (SCENARIOS, default all, space-separated):
#   keys10k  c=50, descriptor user=user-N, N uniform over 10,000 (fixed window 1000/s: almost all OK); and noop, floorbatch, floorloop
#   hot      c=50, one descriptor hot=hot-0 on 10/hour: OVER_LIMIT after the first 10; and noop
#   c1       c=1, as keys10k; and noop, floorlua, floorpipe
#   tb       c=50, 10,000 keys; ratelimitd token_bucket vs the reference's fixed window
#   sw       c=50, 10,000 keys; ratelimitd sliding_window vs the reference's fixed window
#   refc50   as keys10k, refmode vs ref
#   refc1    as c1, refmode vs ref
#   refhot   as hot, refmode vs ref
# Configs: scripts/bench/compare/{ratelimitd,reference}/config.yaml (the
# reference's is also refmode's).
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
#   decisions/script call  decisions / EVALSHA (EVAL, FCALL) calls: the
#                 batch size Redis saw, for scripts/callgrind-redis.sh
# A run with errors is reported (errors column); its ratios still count.
# The report and the targets are scripts/bench/compare/report.py.
#
# Environment: REF_VERSION (the module version); REF_RATELIMITD (a
# ratelimitd binary) runs that build in the reference's place, with
# ratelimitd's config, for a same-run A/B of two builds ("ours" is this
# tree, or OURS_RATELIMITD; the ref* scenarios are then left out); SVC_ARGS
# (extra ratelimitd serve flags, ours only), REF_ENV (extra environment of
# the reference and of refmode, e.g. "LOCAL_CACHE_SIZE_IN_BYTES=1048576"),
# KEEP=1 keeps the work directory (raw JSON results in runs.jsonl);
# BASE_RATELIMITD (a ratelimitd binary, e.g. the tree before a change)
# runs as the service "base", flags as ours, in every scenario ours runs
# in, so that a before/after pair is measured in the same run as the
# reference and the no-op floor (the report adds the ratios ours / base).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5s}; ROUNDS=${2:-3}
if [ -n "${REF_RATELIMITD:-}" ]; then SCENARIOS=${SCENARIOS:-keys10k hot c1 tb sw}; fi
SCENARIOS=${SCENARIOS:-keys10k hot c1 tb sw refc50 refc1 refhot}
REF_VERSION=${REF_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
./scripts/ensure-redis.sh >/dev/null
work=$(mktemp -d)
PIDS=()
cleanup() {
  kill -CONT "${PIDS[@]}" 2>/dev/null || true
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  if [ "${KEEP:-}" = 1 ]; then echo "work directory: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

scenario() { # name -> "concurrency keys key services..."
  case "$1" in
    keys10k) echo "50 10000 user ours ref noop floorbatch floorloop" ;;
    hot) echo "50 1 hot ours ref noop" ;;
    c1) echo "1 10000 user ours ref noop floorlua floorpipe" ;;
    tb) echo "50 10000 tb ours ref" ;;
    sw) echo "50 10000 sw ours ref" ;;
    refc50) echo "50 10000 user refmode ref" ;;
    refc1) echo "1 10000 user refmode ref" ;;
    refhot) echo "50 1 hot refmode ref" ;;
    *) echo "unknown scenario $1" >&2; return 2 ;;
  esac
}
need_refmode=; need_noop=; need_floor=; floor_modes=
for sc in $SCENARIOS; do
  spec=$(scenario "$sc") || exit 2
  case " $spec " in *" refmode "*) need_refmode=1 ;; esac
  case " $spec " in *" noop "*) need_noop=1 ;; esac
  case " $spec " in *" floor"*) need_floor=1 ;; esac
  for m in lua pipe batch loop; do
    case " $spec " in *" floor$m "*) case " $floor_modes " in *" $m "*) ;; *) floor_modes="$floor_modes $m" ;; esac ;; esac
  done
done
if [ -n "${REF_RATELIMITD:-}" ] && [ -n "$need_refmode" ]; then
  echo "the ref* scenarios compare with the reference itself: not with REF_RATELIMITD"; exit 2
fi

if [ -n "${REF_RATELIMITD:-}" ]; then
  echo "== A/B: \"ours\" is ${OURS_RATELIMITD:-this tree}, \"ref\" is $REF_RATELIMITD (ratios: ours / ref)"
else
  echo "== building ratelimitd, rlload, the no-op server and the reference (envoyproxy/ratelimit $REF_VERSION)"
fi
if [ -n "${OURS_RATELIMITD:-}" ]; then cp "$OURS_RATELIMITD" "$work/ratelimitd"; else go build -o "$work/ratelimitd" ./cmd/ratelimitd; fi
go build -o "$work/rlload" ./cmd/rlload
go build -o "$work/noop" ./scripts/bench/noop
go build -o "$work/floor" ./scripts/bench/floor
if [ -z "${REF_RATELIMITD:-}" ]; then
  GOBIN="$work/refbin" GOFLAGS=-mod=mod go install "github.com/envoyproxy/ratelimit/src/service_cmd@$REF_VERSION"
fi

RP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
rc() { redis-cli -p "$RP" "$@"; }

declare -A PID GRPC HTTP
ports() { GRPC[$1]=$(free_port); HTTP[$1]=$(free_port); DBG=$(free_port); }

# ours: ratelimitd, defaults but for the addresses
ports ours
read -r -a svc_args <<<"${SVC_ARGS:-}"
"$work/ratelimitd" serve --config scripts/bench/compare/ratelimitd/config.yaml --backend redis \
  --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:${GRPC[ours]}" --http-addr "127.0.0.1:${HTTP[ours]}" \
  --debug-addr "127.0.0.1:$DBG" --log-level error "${svc_args[@]}" >"$work/ours.log" 2>&1 &
PID[ours]=$!

# ref: the reference, defaults but for the addresses, Redis, config and
# stats; refmode: ratelimitd with the same environment
mkdir -p "$work/runtime/ratelimit/config"
cp scripts/bench/compare/reference/config.yaml "$work/runtime/ratelimit/config/"
read -r -a ref_env <<<"${REF_ENV:-}"
ref_env_for() { # service: the reference's environment, its own ports
  echo RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=error \
    HOST=127.0.0.1 PORT="${HTTP[$1]}" GRPC_HOST=127.0.0.1 GRPC_PORT="${GRPC[$1]}" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$DBG"
}
ports ref
if [ -n "${REF_RATELIMITD:-}" ]; then # A/B: another ratelimitd build in the reference's place
  "$REF_RATELIMITD" serve --config scripts/bench/compare/ratelimitd/config.yaml --backend redis \
    --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:${GRPC[ref]}" --http-addr "127.0.0.1:${HTTP[ref]}" \
    --debug-addr "127.0.0.1:$DBG" --log-level error "${svc_args[@]}" >"$work/ref.log" 2>&1 &
else
  read -r -a e <<<"$(ref_env_for ref)"
  env "${e[@]}" "${ref_env[@]}" "$work/refbin/service_cmd" >"$work/ref.log" 2>&1 &
fi
PID[ref]=$!
if [ -n "$need_refmode" ]; then
  ports refmode
  read -r -a e <<<"$(ref_env_for refmode)"
  env "${e[@]}" "${ref_env[@]}" "$work/ratelimitd" serve >"$work/refmode.log" 2>&1 &
  PID[refmode]=$!
fi
if [ -n "$need_noop" ]; then
  ports noop
  "$work/noop" --grpc-addr "127.0.0.1:${GRPC[noop]}" --http-addr "127.0.0.1:${HTTP[noop]}" >"$work/noop.log" 2>&1 &
  PID[noop]=$!
fi
if [ -n "$need_floor" ]; then
  for m in $floor_modes; do
    ports "floor$m"
    "$work/floor" --mode "$m" --redis-addr "127.0.0.1:$RP" --grpc-addr "127.0.0.1:${GRPC[floor$m]}" \
      --http-addr "127.0.0.1:${HTTP[floor$m]}" >"$work/floor$m.log" 2>&1 &
    PID[floor$m]=$!
  done
fi
if [ -n "${BASE_RATELIMITD:-}" ]; then
  ports base
  "$BASE_RATELIMITD" serve --config scripts/bench/compare/ratelimitd/config.yaml --backend redis \
    --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:${GRPC[base]}" --http-addr "127.0.0.1:${HTTP[base]}" \
    --debug-addr "127.0.0.1:$DBG" --log-level error "${svc_args[@]}" >"$work/base.log" 2>&1 &
  PID[base]=$!
fi
PIDS=("${PID[@]}")

for svc in "${!PID[@]}"; do
  ok=
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:${HTTP[$svc]}/healthcheck" >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  [ -n "$ok" ] || { echo "$svc did not become healthy"; cat "$work/$svc.log"; exit 1; }
done

proc_cpu() { awk '{ printf "%d", $14 + $15 }' "/proc/$1/stat"; } # clock ticks
redis_cpu() { rc info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'; }
# redis_usec prints the usec of the top-level commands and every
# command's calls and usec. INFO commandstats also counts the commands a
# script calls, inside the script's own usec. For ratelimitd: when it ran
# a script (EVALSHA, EVAL, FCALL), the scripts and the connection's own
# commands (SCRIPT, PING, CLIENT, HELLO, SELECT) are top-level and every
# other command is taken as one a script called; when it ran none (the
# reference's counting done natively), every command is top-level. The
# reference calls no script: all of its commands count.
redis_usec() { # service
  rc info commandstats | tr -d '\r' | awk -F'[:,=]' -v svc="$1" '
  /^cmdstat_/ && $1 != "cmdstat_info" && $1 != "cmdstat_config|resetstat" {
    n = substr($1, 9); c = c sprintf("%s %s calls %s usec; ", n, $3, $5); all += $5
    if (n ~ /^(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro)$/ && $3 > 0) scripts = 1
    if (n ~ /^(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro|ping|hello|select)$/ || n ~ /^(script|client)\|/) top += $5 }
  END { printf "%d\t%s", (svc == "ref" || !scripts) ? all : top, c }'; }

run() { # service scenario round
  local svc=$1 sc=$2 round=$3 conc keys key other
  read -r conc keys key _ < <(scenario "$sc")
  local addr=127.0.0.1:${GRPC[$svc]} pid=${PID[$svc]}
  # the other services are stopped (SIGSTOP) while this one runs: neither
  # their CPU nor their health checks reach the measurement
  for other in "${!PID[@]}"; do [ "$other" = "$svc" ] || kill -STOP "${PID[$other]}"; done
  kill -CONT "$pid"
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
# script calls (EVALSHA, EVAL, FCALL): decisions per call is the batch size Redis saw
calls = sum(int(e.split()[1]) for e in cmds.split("; ") if e.split()[:1] and e.split()[0] in
            ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"))
print(json.dumps({"script_calls": calls, "svc": svc, "scenario": sc, "round": int(rnd), "load": float(load),
  "rate": r["decisions_per_second"], "p50": r["p50_us"], "p99": r["p99_us"],
  "decisions": r["decisions"], "over_limit": r["over_limit"], "errors": r["errors"],
  "svc_cpu": int(ticks) / int(hz) * 1e6 / d, "redis_cpu": (float(r1) - float(r0)) * 1e6 / d,
  "redis_us": int(usec) / d, "cmds": cmds}))
EOF
  tail -1 "$work/runs.jsonl" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
b = "%.1f" % (r["decisions"] / r["script_calls"]) if r["script_calls"] else "-"
print("  %-7s %-8s round %d: %8.0f/s p50 %6.0f p99 %6.0f µs, svc CPU %5.1f, redis CPU %5.1f, redis exec %5.2f µs/decision; decisions/script call %s; over_limit %d, errors %d, load %.1f; %s" % (
  r["svc"], r["scenario"], r["round"], r["rate"], r["p50"], r["p99"], r["svc_cpu"], r["redis_cpu"], r["redis_us"], b, r["over_limit"], r["errors"], r["load"], r["cmds"]))'
}

echo "== machine: $(nproc) cores, redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2), $(go version | cut -d' ' -f3); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $ROUNDS rounds × ($SCENARIOS), $DUR each"
for round in $(seq "$ROUNDS"); do
  for sc in $SCENARIOS; do
    read -r _ _ _ svcs < <(scenario "$sc")
    if [ -n "${BASE_RATELIMITD:-}" ]; then svcs=${svcs/ours/ours base}; fi
    read -r -a svcs <<<"$svcs"
    # alternate the order of the services
    if [ $((round % 2)) = 0 ]; then
      for ((i = ${#svcs[@]} - 1; i >= 0; i--)); do run "${svcs[$i]}" "$sc" "$round"; done
    else
      for s in "${svcs[@]}"; do run "$s" "$sc" "$round"; done
    fi
  done
done
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 scripts/bench/compare/report.py "$work/runs.jsonl"
