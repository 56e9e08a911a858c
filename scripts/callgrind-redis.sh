#!/usr/bin/env bash
# Redis' instructions per decision (valgrind --tool=callgrind on
# redis-server), for ratelimitd, the reference (envoyproxy/ratelimit,
# REF_VERSION) and a minimal EVALSHA INCRBY+PEXPIRE script (the floor of
# any script-based design). Instruction counts do not depend on the host's
# load, so they compare designs on a busy machine where INFO commandstats'
# µs do not. Each workload runs against its own redis-server under
# callgrind: N decisions after a warm-up, between `callgrind_control
# --zero` and `--dump`; the figure is Ir (instructions executed in
# redis-server's user space: command parsing, scripts, replies, the event
# loop; not the kernel's socket work) / N.
#
#   scripts/callgrind-redis.sh [decisions=2000]
#
# Workloads (WORKLOADS, default all): ours-c1, ours-c50 (ratelimitd via
# rlload --client h2, key user: fixed window; c50: 50 in flight, whose
# batches are larger under callgrind's slowdown than at full speed), ours-tb-c1,
# ours-sw-c1 (token_bucket, sliding_window), ref-c1, ref-c50 (the reference,
# pipelined INCRBY+EXPIRE), oursref-c1, oursref-c50 (ratelimitd in
# reference mode: the reference's environment and config, its counting
# decided natively by INCRBY+PEXPIRE), floor (redis-benchmark -c 1 EVALSHA of
# "INCRBY KEYS[1] ARGV[1]; PEXPIRE KEYS[1] 60000"). RATELIMITD (a binary)
# replaces the ratelimitd built from this tree (e.g. an older build, for an
# A/B of the scripts). CG_KEEP (a directory) keeps each workload's
# callgrind output there as <workload>.callgrind, for callgrind_annotate.
# Configs: scripts/bench/compare/.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
WORKLOADS=${WORKLOADS:-ours-c1 ours-c50 ours-tb-c1 ours-sw-c1 oursref-c1 oursref-c50 ref-c1 ref-c50 floor}
REF_VERSION=${REF_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)"; exit 1; }
./scripts/ensure-redis.sh >/dev/null
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
if [ -n "${RATELIMITD:-}" ]; then cp "$RATELIMITD" "$work/ratelimitd"; else go build -o "$work/ratelimitd" ./cmd/ratelimitd; fi
go build -o "$work/rlload" ./cmd/rlload
case " $WORKLOADS " in *" ref-"*)
  GOBIN="$work/refbin" GOFLAGS=-mod=mod go install "github.com/envoyproxy/ratelimit/src/service_cmd@$REF_VERSION" ;;
esac
mkdir -p "$work/runtime/ratelimit/config"
cp scripts/bench/compare/reference/config.yaml "$work/runtime/ratelimit/config/"

start_redis() {
  RP=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" redis-server --port "$RP" --bind 127.0.0.1 \
    --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
  VG=$!
  for _ in $(seq 300); do redis-cli -p "$RP" ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "redis-server under valgrind did not start"; cat "$work/redis.log"; exit 1
}
stop_redis() { redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1 || true; wait "$VG" 2>/dev/null || true; rm -f "$work"/cg.out*; }
# measure runs "$@" between a zero and a dump and prints Ir / N.
measure() {
  callgrind_control --zero "$VG" >/dev/null 2>&1
  "$@" >"$work/load.txt" 2>&1 || { cat "$work/load.txt"; exit 1; }
  callgrind_control --dump "$VG" >/dev/null 2>&1
  local f ir
  f=$(ls -t "$work"/cg.out.* | head -1)
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$f")
  if [ -n "${CG_KEEP:-}" ]; then cp "$f" "$CG_KEEP/$W.callgrind"; fi
  echo "$ir"
}
start_ours() {
  GP=$(free_port); HP=$(free_port); DP=$(free_port)
  "$work/ratelimitd" serve --config scripts/bench/compare/ratelimitd/config.yaml --backend redis \
    --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:$GP" --http-addr "127.0.0.1:$HP" \
    --debug-addr "127.0.0.1:$DP" --log-level error --redis-timeout 2s >"$work/svc.log" 2>&1 &
  SVC=$!
  for _ in $(seq 300); do curl -fs "http://127.0.0.1:$HP/healthcheck" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "ratelimitd did not become healthy"; cat "$work/svc.log"; exit 1
}
# start_ref [command...]: the reference's environment and config, run by
# the reference (default) or by another command (ratelimitd serve: its
# reference mode, which that environment selects).
start_ref() {
  GP=$(free_port); HP=$(free_port); DP=$(free_port)
  env RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=error \
    HOST=127.0.0.1 PORT="$HP" GRPC_HOST=127.0.0.1 GRPC_PORT="$GP" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$DP" \
    "${@:-$work/refbin/service_cmd}" >"$work/svc.log" 2>&1 &
  SVC=$!
  for _ in $(seq 300); do curl -fs "http://127.0.0.1:$HP/healthcheck" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "reference did not become healthy"; cat "$work/svc.log"; exit 1
}
stop_svc() { kill "$SVC" 2>/dev/null || true; wait "$SVC" 2>/dev/null || true; }
load() { # concurrency key requests
  "$work/rlload" --client h2 --addr "127.0.0.1:$GP" --concurrency "$1" --key "$2" --keys 10000 \
    --requests "$3" --timeout 30s
}

echo "== redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2), valgrind $(valgrind --version); $N decisions per workload"
for w in $WORKLOADS; do
  W=$w
  start_redis
  case "$w" in
    ours-*|oursref-*|ref-*)
      case "$w" in ours-*) start_ours ;; oursref-*) start_ref "$work/ratelimitd" serve ;; *) start_ref ;; esac
      key=user; conc=1
      case "$w" in *-tb-*) key=tb ;; *-sw-*) key=sw ;; esac
      case "$w" in *-c50) conc=50 ;; esac
      load "$conc" "$key" 200 >/dev/null # warm-up: connections, script load
      ir=$(measure load "$conc" "$key" "$N")
      stop_svc ;;
    floor)
      sha=$(redis-cli -p "$RP" script load "redis.call('INCRBY', KEYS[1], ARGV[1]); redis.call('PEXPIRE', KEYS[1], 60000); return 1")
      redis-benchmark -p "$RP" -c 1 -n 200 -r 10000 -q evalsha "$sha" 1 "k:__rand_int__" 1 >/dev/null 2>&1
      ir=$(measure redis-benchmark -p "$RP" -c 1 -n "$N" -r 10000 -q evalsha "$sha" 1 "k:__rand_int__" 1) ;;
    *) echo "unknown workload $w"; exit 2 ;;
  esac
  calls=$(redis-cli -p "$RP" info commandstats | tr -d '\r' | awk -F'[:,=]' '/^cmdstat_/ { printf "%s=%s ", substr($1, 9), $3 }')
  printf '%-12s %12s Ir  %8.0f Ir/decision   (commands since start: %s)\n' "$w" "$ir" "$(echo "$ir / $N" | bc -l)" "$calls"
  stop_redis
done
