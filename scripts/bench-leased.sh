#!/usr/bin/env bash
# Measures consistency: leased against exact on a hot key, in one run: one
# redis-server, 3 ratelimitd instances on it (defaults but for the
# addresses), 3 load clients (cmd/rlload --client h2), one per instance,
# concurrency 17+17+16 = 50 in all, all on one descriptor
# (scripts/bench/leased/config.yaml). Scenarios:
#   over   hot=hot-0 (exact) or hotl=hotl-0 (leased), both 2000/second:
#          demand far above the limit
#   under  hotu=hotu-0 (exact) or hotlu=hotlu-0 (leased), both
#          10,000,000/second: every request admitted
# The modes alternate, the order flipping every round. A third mode,
# noop, sends the same load to 3 scripts/bench/noop servers (grpc-go
# answering OK with no work): the floor of service CPU per decision.
#
#   scripts/bench-leased.sh [duration=5s] [rounds=3]
#
# SVC_ARGS: extra ratelimitd serve flags (e.g. "--local-cache-size 0":
# exact mode without its local over-limit cache, which otherwise answers
# a hot key's denials without Redis); KEEP=1 keeps the work directory.
#
# Per run: 1 s of unmeasured load, CONFIG RESETSTAT, then the measured run,
# started on a whole second (the windows) and lasting whole seconds, then
# INFO commandstats. Measures per run:
#   decisions/s      OK + OVER_LIMIT answers of the 3 clients per second
#   cmds/decision    Redis commands (INFO commandstats: every call but
#                    INFO and CONFIG; a script's own commands are counted
#                    inside it, not apart) / decisions
#   svc CPU/dec      the 3 services' user+system CPU / decisions, µs
#   admitted share   OK answers / (limit × the windows the measured run
#                    overlapped, first and last included: demand far
#                    above the limit uses a window's limit up in its
#                    first milliseconds)
#   max window       leased: the most units any window's counter held
#                    (sampled every 100 ms: what the store granted, which
#                    bounds what was admitted), against the limit
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5s}; ROUNDS=${2:-3}
LIMIT=2000
./scripts/ensure-redis.sh >/dev/null
work=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  if [ "${KEEP:-}" = 1 ]; then echo "work directory: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== building ratelimitd and rlload"
go build -o "$work/ratelimitd" ./cmd/ratelimitd
go build -o "$work/rlload" ./cmd/rlload
go build -o "$work/noop" ./scripts/bench/noop

RP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
rc() { redis-cli -p "$RP" "$@"; }

read -r -a svc_args <<<"${SVC_ARGS:-}"
PIDS=(); GRPC=(); HTTP=()
for i in 0 1 2; do
  GRPC[i]=$(free_port); HTTP[i]=$(free_port)
  "$work/ratelimitd" serve --config scripts/bench/leased/config.yaml --backend redis \
    --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:${GRPC[i]}" --http-addr "127.0.0.1:${HTTP[i]}" \
    --debug-addr "127.0.0.1:$(free_port)" --log-level error "${svc_args[@]}" >"$work/svc$i.log" 2>&1 &
  PIDS[i]=$!
done
NOOP=(); NGRPC=(); NHTTP=()
for i in 0 1 2; do
  NGRPC[i]=$(free_port); NHTTP[i]=$(free_port)
  "$work/noop" --grpc-addr "127.0.0.1:${NGRPC[i]}" --http-addr "127.0.0.1:${NHTTP[i]}" >"$work/noop$i.log" 2>&1 &
  NOOP[i]=$!
done
for i in 0 1 2 3 4 5; do
  ok=; h=${HTTP[i]:-}; [ "$i" -ge 3 ] && h=${NHTTP[i-3]}
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$h/healthcheck" >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  [ -n "$ok" ] || { echo "instance $i did not become healthy"; cat "$work/svc$i.log"; exit 1; }
done
# A window that began before Redis started grants no lease (docs/leases.md).
sleep 1.2

cpu() { local s=0; for p in "$@"; do s=$((s + $(awk '{ printf "%d", $14 + $15 }' "/proc/$p/stat"))); done; echo $s; }
# cmds prints the commands the services sent: INFO commandstats also
# counts the commands a script calls; when scripts ran, only the scripts
# and the connection's own commands (PING, HELLO, SELECT, CLIENT, SCRIPT)
# are taken as sent, every other command as one a script called (as in
# scripts/bench-compare.sh).
cmds() { rc info commandstats | tr -d '\r' | awk -F'[:,=]' '
  /^cmdstat_/ && $1 != "cmdstat_info" && $1 !~ /^cmdstat_config/ {
    n = substr($1, 9); all += $3
    if (n ~ /^(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro)$/ && $3 > 0) scripts = 1
    if (n ~ /^(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro|ping|hello|select)$/ || n ~ /^(script|client)\|/) top += $3 }
  END { print (scripts ? top : all) + 0 }'; }
load() { # key duration [json-prefix]: the 3 clients, until they end
  local pids=() conc out addr
  for i in 0 1 2; do
    conc=17; [ "$i" = 2 ] && conc=16
    out=/dev/null; [ -n "${3:-}" ] && out="$3$i.json"
    addr=${GRPC[i]}; [ "$1" = noop ] && addr=${NGRPC[i]}
    "$work/rlload" --client h2 --addr "127.0.0.1:$addr" --concurrency $conc --keys 1 --key "$1" \
      --warmup 0 --duration "$2" --json >"$out" &
    pids+=($!)
  done
  wait "${pids[@]}"
}
# sample prints, every 100 ms until $work/stop exists, the largest value of
# the leased hot key's window counters ({<key>}:<window_start_us>).
sample() {
  local max=0 k v
  while [ ! -e "$work/stop" ]; do
    for k in $(rc --scan --pattern '*}:1*'); do
      v=$(rc get "$k"); [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt "$max" ] && max=$v
    done
    sleep 0.1
  done
  echo "$max"
}

run() { # mode round scenario
  local mode=$1 round=$2 sc=$3 key=hot pids=("${PIDS[@]}")
  [ "$mode" = leased ] && key=hotl
  [ "$sc" = under ] && key=${key}u
  [ "$mode" = noop ] && { key=noop; pids=("${NOOP[@]}"); }
  local lim=$LIMIT; [ "$sc" = under ] && lim=10000000
  load "$key" 1s ""
  # start on a whole second: the measured seconds are whole windows
  python3 -c 'import time; time.sleep(1 - time.time() % 1 + 0.002)'
  rc config resetstat >/dev/null
  rm -f "$work/stop"; sample >"$work/max" &
  local sp=$! c0 c1 t0 t1
  c0=$(cpu "${pids[@]}"); t0=$(date +%s.%N)
  load "$key" "$DUR" "$work/r"
  c1=$(cpu "${pids[@]}"); t1=$(date +%s.%N)
  local n; n=$(cmds)
  touch "$work/stop"; wait $sp
  python3 - "$mode:$sc" "$round" "$((c1 - c0))" "$(getconf CLK_TCK)" "$n" "$(cat "$work/max")" "$lim" "$(cut -d' ' -f1 /proc/loadavg)" "$t0" "$t1" "$work"/r{0,1,2}.json >>"$work/runs.jsonl" <<'PY'
import json, math, sys
mode, rnd, ticks, hz, n, mx, limit, load, t0, t1 = sys.argv[1:11]
rs = [json.load(open(p)) for p in sys.argv[11:]]
windows = math.floor(float(t1)) - math.floor(float(t0)) + 1
d = sum(r["decisions"] for r in rs); ok = sum(r["ok"] for r in rs)
secs = max(r["seconds"] for r in rs)
print(json.dumps({"mode": mode, "round": int(rnd), "rate": d / secs, "decisions": d, "ok": ok,
  "errors": sum(r["errors"] for r in rs), "cmds_per_dec": int(n) / max(d, 1),
  "svc_cpu": int(ticks) / int(hz) * 1e6 / max(d, 1), "share": ok / (int(limit) * windows), "windows": windows,
  "max_window": int(mx), "limit": int(limit), "p99": max(r["p99_us"] for r in rs), "load": float(load)}))
PY
  tail -1 "$work/runs.jsonl" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
mw = "%d" % r["max_window"] if r["mode"] == "leased" else "-"
sh = "%.3f" % r["share"] if r["mode"] != "noop" else "-"
print("  %-6s round %d: %8.0f decisions/s, %.4f cmds/decision, svc CPU %5.1f µs/decision, admitted %s of the limit, max window %s of %d, p99 %6.0f µs, errors %d, load %.1f" % (
  r["mode"], r["round"], r["rate"], r["cmds_per_dec"], r["svc_cpu"], sh, mw, r["limit"], r["p99"], r["errors"], r["load"]))'
}

echo "== machine: $(nproc) cores, redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2), $(go version | cut -d' ' -f3); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $ROUNDS rounds × (exact, leased) × (over: $LIMIT/s, under: 10,000,000/s) + noop, $DUR each, 3 instances, c=50"
for round in $(seq "$ROUNDS"); do
  for sc in over under; do
    if [ $((round % 2)) = 0 ]; then run leased "$round" $sc; run exact "$round" $sc; else run exact "$round" $sc; run leased "$round" $sc; fi
  done
  run noop "$round" under
done
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
modes = ("exact:over", "leased:over", "exact:under", "leased:under", "noop:under")
by = {m: [r for r in runs if r["mode"] == m] for m in modes}
med = lambda m, k: statistics.median(r[k] for r in by[m])
print("== medians over the rounds")
for m in modes:
    sh = "%.3f" % med(m, "share") if not m.startswith("noop") else "-"
    print("  %-13s %8.0f decisions/s, %.4f cmds/decision, svc CPU %5.1f µs/decision, admitted %s of the limit" % (
        m, med(m, "rate"), med(m, "cmds_per_dec"), med(m, "svc_cpu"), sh))
for sc in ("over", "under"):
    print("  %s: leased/exact throughput %.2f, CPU %.2f; noop floor / exact CPU %.2f" % (sc,
        med("leased:" + sc, "rate") / med("exact:" + sc, "rate"), med("leased:" + sc, "svc_cpu") / med("exact:" + sc, "svc_cpu"),
        med("noop:under", "svc_cpu") / med("exact:" + sc, "svc_cpu")))
for sc in ("over", "under"):
    L, E = "leased:" + sc, "exact:" + sc
    t = [("store commands per decision <= 0.01", med(L, "cmds_per_dec") <= 0.01),
         ("service CPU per decision <= 0.5 x exact", med(L, "svc_cpu") <= 0.5 * med(E, "svc_cpu")),
         ("throughput >= 1.5 x exact", med(L, "rate") >= 1.5 * med(E, "rate")),
         ("no window over the limit", all(r["max_window"] <= r["limit"] for r in by[L]))]
    if sc == "over":
        t.append((">= 95 % of the limit admitted", min(r["share"] for r in by[L]) >= 0.95))
    print("== targets (leased, %s)" % sc)
    for name, ok in t:
        print("  %-4s %s" % ("PASS" if ok else "MISS", name))
PY
