#!/usr/bin/env bash
# Fills the in-memory store of `ratelimitd serve --backend memory` to its
# default bound (1,000,000 keys), then floods it with new keys (all decided
# by the store's sketch: every stored key is live) while calls on stored
# keys are measured, and
# prints the service's RSS after each phase (docs/operations.md, "In-memory
# store").
#
#   scripts/bench/memory-flood.sh [flood requests=300000]
#
# Environment: SERVICE_ARGS (e.g. "--memory-limit=256MiB") are extra serve
# flags.
set -euo pipefail
cd "$(dirname "$0")/../.."
FLOOD=${1:-300000}
work=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GP=$(free_port); HP=$(free_port); DP=$(free_port)
go build -o "$work/ratelimitd" ./cmd/ratelimitd
go build -o "$work/rlload" ./cmd/rlload
extra=()
if [ -n "${SERVICE_ARGS:-}" ]; then read -r -a extra <<<"$SERVICE_ARGS"; fi
"$work/ratelimitd" serve --config scripts/bench/memory-flood.yaml --backend memory \
  --grpc-addr "127.0.0.1:$GP" --http-addr "127.0.0.1:$HP" --debug-addr "127.0.0.1:$DP" \
  --log-level error "${extra[@]}" >"$work/svc.log" 2>&1 &
SVC=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$HP/healthcheck" >/dev/null 2>&1 && break; sleep 0.1; done
rss() { awk '/^VmRSS|^VmHWM/ {printf "%s %d MiB  ", $1, $2/1024}' "/proc/$SVC/status"; echo; }
load() { "$work/rlload" --addr "127.0.0.1:$GP" --json "$@"; }

echo "fill: $(load --key user --keys 1000000 --requests 1000000)"
echo "after fill: $(rss)"
load --key flood --keys 1000000 --requests "$FLOOD" --concurrency 40 --timeout 2s >"$work/flood.json" &
FL=$!
sleep 1
echo "stored keys during the flood: $(load --key user --keys 1000000 --duration 5s --warmup 0s --concurrency 10 --timeout 2s)"
wait $FL
echo "flood (new keys): $(cat "$work/flood.json")"
echo "after flood: $(rss)"
curl -fs "http://127.0.0.1:$HP/metrics" | grep -E '^ratelimitd_(backend_errors_total|decisions_total|memory_full_hits_total)'
