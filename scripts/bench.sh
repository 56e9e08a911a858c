#!/usr/bin/env bash
# Measures ratelimitd against a real redis-server on this machine, with Redis'
# own ceiling (redis-benchmark running EVALSHA of similar work) in the same
# run. Load client, service and Redis share the machine's cores, as in the
# reference measurement of envoyproxy/ratelimit quoted in BENCHMARKS.md.
#
#   scripts/bench.sh [duration=10s] [concurrency=50] [keys=10000]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10s}; CONC=${2:-50}; KEYS=${3:-10000}
./scripts/ensure-redis.sh
work=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(free_port); GP=$(free_port); HP=$(free_port); DP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
go build -o "$work/ratelimitd" ./cmd/ratelimitd
go build -o "$work/rlload" ./cmd/rlload

run_service() { # backend
  "$work/ratelimitd" serve --config scripts/bench/bench.yaml --backend "$1" \
    --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:$GP" --http-addr "127.0.0.1:$HP" \
    --debug-addr "127.0.0.1:$DP" --log-level warn >"$work/svc-$1.log" 2>&1 &
  SVC=$!
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$HP/healthcheck" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "service did not become healthy"; cat "$work/svc-$1.log"; exit 1
}

echo "== machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(go version | cut -d' ' -f3)"
for backend in redis memory; do
  run_service "$backend"
  echo "== ratelimitd --backend $backend: concurrency $CONC, keys $KEYS, $DUR"
  "$work/rlload" --addr "127.0.0.1:$GP" --concurrency "$CONC" --keys "$KEYS" --duration "$DUR" \
    --metrics "http://127.0.0.1:$HP/metrics"
  kill "$SVC"; wait "$SVC" 2>/dev/null || true
done

# Redis' own ceiling for a comparable script: one INCRBY + PEXPIRE per call
# on 10,000 keys, 50 clients, from redis-benchmark on the same machine.
SHA=$(redis-cli -p "$RP" SCRIPT LOAD "local c = redis.call('INCRBY', KEYS[1], ARGV[1]); redis.call('PEXPIRE', KEYS[1], 60000); return c")
echo "== redis-benchmark EVALSHA ceiling (INCRBY+PEXPIRE, $CONC clients, $KEYS keys)"
redis-benchmark -p "$RP" -c "$CONC" -n 300000 -r "$KEYS" -q EVALSHA "$SHA" 1 "bench:__rand_int__" 1
