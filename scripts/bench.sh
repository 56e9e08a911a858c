#!/usr/bin/env bash
# Measures ratelimitd against a real redis-server on this machine, with Redis'
# own ceiling (redis-benchmark running EVALSHA of the service's own script,
# and of a minimal INCRBY+PEXPIRE script) in the same run. Load client,
# service and Redis share the machine's cores, as in the reference
# measurement of envoyproxy/ratelimit quoted in BENCHMARKS.md.
#
#   scripts/bench.sh [duration=10s] [concurrency=50] [keys=10000]
#
# Environment: SERVICE_ARGS (e.g. "--redis-pipelines 4") are extra serve
# flags; SERVICE_ENV (e.g. "GOMAXPROCS=1") is the service's extra
# environment; REDIS_TIMEOUT (e.g. 50ms) passes --redis-timeout to the
# service (default: the service's default); BACKENDS (default "redis
# memory") selects the runs; CLIENT (h2, grpc or both; default h2) selects
# rlload's --client: h2 frames gRPC by hand over HTTP/2 and costs little
# CPU per call, like Envoy; grpc is grpc-go, which takes more of the cores
# the service and Redis share with it. With both, each backend is measured
# with h2 then grpc on the same service process.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10s}; CONC=${2:-50}; KEYS=${3:-10000}
BACKENDS=${BACKENDS:-redis memory}
CLIENT=${CLIENT:-h2}
case "$CLIENT" in
  h2|grpc) CLIENTS=$CLIENT ;;
  both) CLIENTS="h2 grpc" ;;
  *) echo "CLIENT must be h2, grpc or both" >&2; exit 2 ;;
esac
./scripts/ensure-redis.sh
work=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(free_port); GP=$(free_port); HP=$(free_port); DP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
go build -o "$work/ratelimitd" ./cmd/ratelimitd
go build -o "$work/rlload" ./cmd/rlload

extra=()
if [ -n "${REDIS_TIMEOUT:-}" ]; then extra+=(--redis-timeout "$REDIS_TIMEOUT"); fi
# SERVICE_ARGS: extra serve flags, e.g. "--redis-pipelines 4" (word-split).
if [ -n "${SERVICE_ARGS:-}" ]; then read -r -a sa <<<"$SERVICE_ARGS"; extra+=("${sa[@]}"); fi

run_service() { # backend
  env ${SERVICE_ENV:-} "$work/ratelimitd" serve --config scripts/bench/bench.yaml --backend "$1" \
    --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:$GP" --http-addr "127.0.0.1:$HP" \
    --debug-addr "127.0.0.1:$DP" --log-level error "${extra[@]}" >"$work/svc-$1.log" 2>&1 &
  SVC=$!; SVC_E=0; SVC_F=0
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$HP/healthcheck" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "service did not become healthy"; cat "$work/svc-$1.log"; exit 1
}

# backend_failures prints the service's backend errors and failure-mode
# decisions since the previous call (counters of the current service
# process; SVC_E and SVC_F are reset when it starts): a run with any is not
# a measurement of Redis decisions (a failed-open decision costs no Redis
# round trip).
backend_failures() {
  local e f s
  read -r e f s < <(curl -fs "http://127.0.0.1:$HP/metrics" | awk '
    /^ratelimitd_backend_errors_total\{/ && $2 > 0 { e += $2; s = s " " $1 "=" $2 }
    /^ratelimitd_decisions_total\{/ && /result="failed_(open|closed)"/ { f += $2 }
    END { printf "%d %d%s\n", e, f, s }')
  echo "backend errors $((e - SVC_E)); failure-mode decisions $((f - SVC_F))${s:+ (since service start:$s)}"
  SVC_E=$e; SVC_F=$f
}

# cpu_idle prints the jiffies "total idle" of /proc/stat; cpu_idle_since
# the idle share since such a reading.
cpu_idle() { awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $5 + $6 }' /proc/stat; }
cpu_idle_since() { read -r t0 i0 <<<"$1"; read -r t1 i1 <<<"$(cpu_idle)"; awk -v a="$((t1 - t0))" -v b="$((i1 - i0))" 'BEGIN { printf "%.0f", a ? 100 * b / a : 0 }'; }
redis_cpu() { redis-cli -p "$RP" info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'; }

echo "== machine: $(nproc) cores, redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2), $(go version | cut -d' ' -f3); load client: rlload --client $CLIENTS"
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for backend in $BACKENDS; do
  run_service "$backend"
  for client in $CLIENTS; do
    echo "== ${SERVICE_ENV:+$SERVICE_ENV }ratelimitd --backend $backend ${extra[*]}: rlload --client $client, concurrency $CONC, keys $KEYS, $DUR"
    r0=$(redis_cpu); c0=$(cpu_idle)
    "$work/rlload" --client "$client" --addr "127.0.0.1:$GP" --concurrency "$CONC" --keys "$KEYS" --duration "$DUR" \
      --metrics "http://127.0.0.1:$HP/metrics" | tee "$work/run.txt"
    echo "machine idle $(cpu_idle_since "$c0")% of the cores during the run (warm-up included)"
    if [ "$backend" = redis ]; then
      # Redis' CPU (INFO cpu, user+sys) over the run, warm-up included, per
      # measured decision: an upper bound of the true share.
      echo "redis CPU $(awk -v a="$r0" -v b="$(redis_cpu)" '/^decisions /{printf "%.1f", (b-a)*1e6/$2}' "$work/run.txt") µs per decision (warm-up included)"
    fi
    backend_failures
  done
  kill "$SVC"; wait "$SVC" 2>/dev/null || true
done

# Redis' own ceiling, from redis-benchmark on the same machine with the
# same concurrency and keys: (1) the service's own script (take.lua, the
# files of pkg/backend/redis/take in order) deciding one
# fixed-window hit with the server's TIME, exactly the call the service
# makes per decision; (2) a minimal INCRBY+PEXPIRE script (about the work
# of envoyproxy/ratelimit's pipelined INCRBY+EXPIRE).
# last_line keeps redis-benchmark's summary (it redraws progress with \r).
last_line() { tr '\r' '\n' | grep -v '^ *$' | tail -1 | sed 's/^.*: \([0-9.]* requests per second\)/\1/'; }
SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat pkg/backend/redis/take/*.lua)")
echo "== redis-benchmark EVALSHA take.lua (fixed_window, 1 hit), $CONC clients, $KEYS keys"
# ARGV (see pkg/backend/redis/take/10_args.lua): 1 segment: mode t, now ""
# (server TIME), nonce, 1 hit: kind 0 (fixed_window), rate, period_us,
# burst, calendar, multiplier, cost, flags.
redis-benchmark -p "$RP" -c "$CONC" -n 300000 -r "$KEYS" -q \
  EVALSHA "$SHA" 1 "bench:__rand_int__" 1 t "" n 1 0 1000 1000000 0 0 1 1 0 2>&1 | last_line ||
  echo "redis-benchmark failed (do the ARGV above still match take.lua?)"
# The same script deciding 16 requests (segments) per call, as the service
# batches concurrent requests: the ceiling in decisions/s is 16× the calls/s.
seg=(); keys16=()
for _ in $(seq 16); do keys16+=("bench:__rand_int__"); seg+=(t "" n 1 0 1000 1000000 0 0 1 1 0); done
echo "== redis-benchmark EVALSHA take.lua, 16 segments per call (decisions/s = 16 x calls/s), $CONC clients, $KEYS keys"
redis-benchmark -p "$RP" -c "$CONC" -n 30000 -r "$KEYS" -q \
  EVALSHA "$SHA" 16 "${keys16[@]}" 16 "${seg[@]}" 2>&1 | last_line ||
  echo "redis-benchmark failed (do the ARGV above still match take.lua?)"
SHA2=$(redis-cli -p "$RP" SCRIPT LOAD "local c = redis.call('INCRBY', KEYS[1], ARGV[1]); redis.call('PEXPIRE', KEYS[1], 60000); return c")
echo "== redis-benchmark EVALSHA INCRBY+PEXPIRE, $CONC clients, $KEYS keys"
redis-benchmark -p "$RP" -c "$CONC" -n 300000 -r "$KEYS" -q EVALSHA "$SHA2" 1 "incr:__rand_int__" 1 2>&1 | last_line ||
  echo "redis-benchmark failed"
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
