#!/usr/bin/env bash
# Redis' instructions per decision (valgrind --tool=callgrind on
# redis-server), for ratelimitd (native mode and reference mode), the
# reference (envoyproxy/ratelimit, REF_VERSION), a minimal EVALSHA
# INCRBY+PEXPIRE script (the floor of any script-based design) and any Lua
# script given. Instruction counts do not depend on the machine's load, so
# they compare designs where INFO commandstats' times cannot. Each
# workload runs against its own redis-server under callgrind: N
# decisions after a warm-up, between `callgrind_control --zero` and
# `--dump` (and CONFIG RESETSTAT, so the commands counted are the
# measured ones); the figure is Ir (instructions executed in
# redis-server's user space: command parsing, scripts, replies, the event
# loop; not the kernel's socket work) / N.
#
#   scripts/callgrind-redis.sh [decisions=2000]
#
# Redis' serverCron runs 10 times a second whatever the load, so a
# workload that lasts longer (a slower service, a busier machine) counts
# more of it per decision: each line also gives Ir per decision without
# serverCron (callgrind_annotate --inclusive) and its ratio, which compare
# runs of different lengths.
#
# Per workload it prints Ir per decision, the ratio to the reference's
# workload of the same shape (ref-c1, ref-c50 or ref-hot-c50; tb and sw
# against the reference's fixed window; N > 1 without its own against
# c50) when that ran before it, decisions per script call (EVALSHA/EVAL/FCALL: the batch size
# Redis saw) and the commands per decision: which scripts or native
# commands the service sent, and what the scripts called.
#
# Workloads (WORKLOADS, default below; the reference's first), named <service>[-<key>]-c<N>:
#   service  ours (ratelimitd, serve --config: native mode), refmode (the
#            same binary with the reference's environment instead of
#            flags: reference mode), ref (the reference)
#   key      none: user (fixed window 1000/s, 10,000 keys, almost all OK);
#            hot (one key on 10/hour: OVER_LIMIT after 10); tb, sw
#            (ratelimitd's token_bucket and sliding_window; the
#            reference's and refmode's config has them as fixed windows)
#   N        requests in flight (rlload --concurrency). Under callgrind
#            Redis runs far slower, so batches at c=50 are larger than at
#            full speed; scripts/bench-compare.sh prints the decisions per
#            script call at full speed: pick the N whose decisions per call
#            here match it (e.g. ours-c16) to measure that batch size.
# and
#   floor    redis-benchmark -c 1 EVALSHA of
#            "INCRBY KEYS[1] ARGV[1]; PEXPIRE KEYS[1] 60000"
#   floor-bB the minimal loop script, B keys per call: INCRBY each key by
#            1 and PEXPIRE it when that created it (window keys of 10,000,
#            new to their window); the floor of any script deciding B
#            fixed-window hits per call. Compared with ref-c1 (B = 1) or
#            ref-c50.
#   lean-bB  redis-benchmark -c 1 EVALSHA of pkg/backend/redis/window.lua
#            (the fixed-window script, no TIME read) deciding B one-hit
#            requests per call on 10,000 window keys of a 1000/hour limit
#            (mostly first hits of a window); lean-rep-bB the same on 100
#            keys (repeat hits). Compared with ref-c1 (B = 1) or ref-c50.
#   script   redis-benchmark -c 1 EVALSHA of the Lua file CG_SCRIPT with
#            the arguments CG_SCRIPT_ARGS (default "1 k:__rand_int__ 1":
#            numkeys, keys, args; __rand_int__ is one of 10,000), one
#            decision per call: a new script's cost alone, before a
#            service uses it
# and, for the scripts of the sliding window and token bucket alone, at
# an exact number of decisions per call (redis-benchmark -c 1 EVALSHA,
# allowed takes of cost 1 on random keys of 10,000; the server's TIME is
# asked for with "T" instead of the empty argument, which redis-benchmark
# cannot send):
#   lean-sw-b<B>, lean-tb-b<B>    lean.lua (--redis-window-keys), B
#                                 decisions per call (B > 1: the short
#                                 form of a batch of one limit and cost)
#   take1-sw-b<B>, take1-tb-b<B>  take1.lua (the default layout), B
#                                 decisions per call
# RATELIMITD (a binary) replaces the ratelimitd built from this tree (e.g.
# an older build, for an A/B of the scripts). CG_KEEP (a directory) keeps
# each workload's callgrind output there as <workload>.callgrind, for
# callgrind_annotate. Configs: scripts/bench/compare/.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
WORKLOADS=${WORKLOADS:-ref-c1 ref-c50 ref-hot-c50 ours-c1 ours-c50 ours-hot-c50 ours-tb-c1 ours-sw-c1 refmode-c1 refmode-c50 refmode-hot-c50 floor}
REF_VERSION=${REF_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)"; exit 1; }
./scripts/ensure-redis.sh >/dev/null
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
case " $WORKLOADS " in *" script "*)
  [ -f "${CG_SCRIPT:-}" ] || { echo "workload script: CG_SCRIPT must name a Lua file"; exit 2; } ;;
esac
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
# measure runs "$@" between a zero and a dump and prints Ir.
measure() {
  redis-cli -p "$RP" config resetstat >/dev/null
  callgrind_control --zero "$VG" >/dev/null 2>&1
  "$@" >"$work/load.txt" 2>&1 || { cat "$work/load.txt"; exit 1; }
  callgrind_control --dump "$VG" >/dev/null 2>&1
  local f ir
  f=$(ls -t "$work"/cg.out.* | head -1)
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$f")
  if [ -n "${CG_KEEP:-}" ]; then cp "$f" "$CG_KEEP/$W.callgrind"; fi
  # serverCron's inclusive Ir, for the figure without it
  CRON=$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null | awk '/:serverCron / { gsub(",", "", $1); print $1; exit }')
  echo "$CRON" >"$work/cron"
  echo "$ir"
}
wait_healthy() { # what
  for _ in $(seq 300); do curl -fs "http://127.0.0.1:$HP/healthcheck" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "$1 did not become healthy"; cat "$work/svc.log"; exit 1
}
# ref_env: the reference's environment (as scripts/bench-compare.sh sets
# it), with a Redis timeout that callgrind's slowdown does not reach.
ref_env() {
  echo RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" REDIS_TIMEOUT=2s USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=error \
    HOST=127.0.0.1 PORT="$HP" GRPC_HOST=127.0.0.1 GRPC_PORT="$GP" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$DP"
}
start_svc() { # ours | refmode | ref
  GP=$(free_port); HP=$(free_port); DP=$(free_port)
  local e
  case "$1" in
    ours)
      "$work/ratelimitd" serve --config scripts/bench/compare/ratelimitd/config.yaml --backend redis \
        --redis-url "redis://127.0.0.1:$RP/0" --grpc-addr "127.0.0.1:$GP" --http-addr "127.0.0.1:$HP" \
        --debug-addr "127.0.0.1:$DP" --log-level error --redis-timeout 2s >"$work/svc.log" 2>&1 & ;;
    refmode)
      read -r -a e <<<"$(ref_env)"
      env "${e[@]}" "$work/ratelimitd" serve >"$work/svc.log" 2>&1 & ;;
    ref)
      read -r -a e <<<"$(ref_env)"
      env "${e[@]}" "$work/refbin/service_cmd" >"$work/svc.log" 2>&1 & ;;
  esac
  SVC=$!
  wait_healthy "$1"
}
stop_svc() { kill "$SVC" 2>/dev/null || true; wait "$SVC" 2>/dev/null || true; }
load() { # concurrency key keys requests
  "$work/rlload" --client h2 --addr "127.0.0.1:$GP" --concurrency "$1" --key "$2" --keys "$3" \
    --requests "$4" --timeout 30s
}
# stats prints "<script calls>\t<commands per decision>" from INFO
# commandstats (reset before the measurement).
stats() {
  redis-cli -p "$RP" info commandstats | tr -d '\r' | awk -F'[:,=]' -v n="$N" '
  /^cmdstat_/ && $1 != "cmdstat_info" && $1 != "cmdstat_config|resetstat" {
    c = substr($1, 9)
    if (c ~ /^(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro)$/) s += $3
    l = l sprintf("%s %.2f ", c, $3 / n) }
  END { printf "%d\t%s\n", s, l }'
}

declare -A IR XC
echo "== redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2), valgrind $(valgrind --version); $N decisions per workload"
printf '%-16s %14s %9s %8s %13s %9s %12s  %s\n' workload Ir Ir/dec "× ref" "w/o cron/dec" "× ref" "dec/script" "commands per decision (measured)"
for w in $WORKLOADS; do
  W=$w
  start_redis
  case "$w" in
    ours-*|refmode-*|ref-*)
      svc=${w%%-*}; conc=${w##*-c}; key=user; keys=10000
      [[ "$w" =~ -c[0-9]+$ ]] || { echo "workload $w: want <service>[-<key>]-c<N>"; exit 2; }
      case "$w" in *-tb-*) key=tb ;; *-sw-*) key=sw ;; *-hot-*) key=hot; keys=1 ;; esac
      start_svc "$svc"
      load "$conc" "$key" "$keys" 200 >/dev/null # warm-up: connections, script load
      ir=$(measure load "$conc" "$key" "$keys" "$N")
      stop_svc ;;
    lean-b*|lean-rep-b*)
      B=${w##*-b}; space=10000; case "$w" in lean-rep-*) space=100 ;; esac
      sha=$(redis-cli -p "$RP" script load "$(cat pkg/backend/redis/window.lua)")
      period=3600000000; mapfile -t tm < <(redis-cli -p "$RP" time | tr -d '\r'); now=$((tm[0] * 1000000 + tm[1]))
      ws=$((now - now % period))
      args=("$B")
      for _ in $(seq "$B"); do args+=("{k:__rand_int__}:v2:$ws"); done
      args+=(1000 3601000) # rate, TTL: one class, every cost 1 (Store.Take's usual call)
      calls=$((N / B))
      redis-benchmark -p "$RP" -c 1 -n "$calls" -r "$space" -q evalsha "$sha" "${args[@]}" >/dev/null 2>&1
      redis-cli -p "$RP" flushall >/dev/null
      ir=$(measure redis-benchmark -p "$RP" -c 1 -n "$calls" -r "$space" -q evalsha "$sha" "${args[@]}") ;;
    floor-b*)
      B=${w##*-b}
      src="for i = 1, #KEYS do if redis.call('INCRBY', KEYS[i], '1') == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[1]) end end return 1"
      sha=$(redis-cli -p "$RP" script load "$src")
      ws=$(( $(date -u +%s) / 3600 * 3600000000 ))
      args=("$B")
      for _ in $(seq "$B"); do args+=("{k:__rand_int__}:v2:$ws"); done
      args+=(3601000)
      calls=$((N / B))
      redis-benchmark -p "$RP" -c 1 -n "$calls" -r 10000 -q evalsha "$sha" "${args[@]}" >/dev/null 2>&1
      redis-cli -p "$RP" flushall >/dev/null
      ir=$(measure redis-benchmark -p "$RP" -c 1 -n "$calls" -r 10000 -q evalsha "$sha" "${args[@]}")
      ir=$(( ir * N / (calls * B) )) ;; # per N decisions
    floor|script)
      if [ "$w" = floor ]; then
        src="redis.call('INCRBY', KEYS[1], ARGV[1]); redis.call('PEXPIRE', KEYS[1], 60000); return 1"
        read -r -a args <<<"1 k:__rand_int__ 1"
      else
        src=$(cat "$CG_SCRIPT")
        read -r -a args <<<"${CG_SCRIPT_ARGS:-1 k:__rand_int__ 1}"
      fi
      sha=$(redis-cli -p "$RP" script load "$src")
      redis-benchmark -p "$RP" -c 1 -n 200 -r 10000 -q evalsha "$sha" "${args[@]}" >/dev/null 2>&1
      ir=$(measure redis-benchmark -p "$RP" -c 1 -n "$N" -r 10000 -q evalsha "$sha" "${args[@]}") ;;
    lean-*-b*|take1-*-b*)
      # one call decides B hits: the script from this tree, and its
      # arguments for B segments of one hit (see the scripts' headers)
      B=${w##*-b}; kind=${w#*-}; kind=${kind%%-*}
      ws=$(( $(date -u +%s) / 86400 * 86400000000 )); wsp=$(( ws - 86400000000 ))
      args=()
      case "$w" in
        lean-sw-*)
          args+=($((2 * B)))
          for _ in $(seq "$B"); do args+=("{sw:__rand_int__}:v2s:$ws" "{sw:__rand_int__}:v2s:$wsp"); done
          args+=(T 1 s 1000 86400000000 "$ws" 172801)
          if [ "$B" = 1 ]; then args+=(1 t1 0 1); else args+=(= "$B" 0 1); fi ;;
        lean-tb-*)
          args+=("$B")
          for _ in $(seq "$B"); do args+=("{tb:__rand_int__}:v2g"); done
          args+=(T 1 g 1000 1000000 1000 2001)
          if [ "$B" = 1 ]; then args+=(1 t1 0 1); else args+=(= "$B" 0 1); fi ;;
        take1-*)
          k=1; [ "$kind" = tb ] && k=3
          args+=("$B")
          for _ in $(seq "$B"); do args+=("$kind:__rand_int__"); done
          for _ in $(seq "$B"); do args+=(T "$k" 1000 86400000000 0 1); done ;;
      esac
      src=$(sed "s/== '' then/== 'T' then/" "pkg/backend/redis/${w%%-*}.lua")
      sha=$(redis-cli -p "$RP" script load "$src")
      redis-benchmark -p "$RP" -c 1 -n 200 -r 10000 -q evalsha "$sha" "${args[@]}" >/dev/null 2>&1
      ir=$(measure redis-benchmark -p "$RP" -c 1 -n $((N / B)) -r 10000 -q evalsha "$sha" "${args[@]}")
      ir=$(( ir * N / (N / B * B) )) ;; # per N decisions
    *) echo "unknown workload $w"; exit 2 ;;
  esac
  IFS=$'\t' read -r scripts cmds < <(stats)
  IR[$w]=$ir
  cron=$(cat "$work/cron"); XC[$w]=$(( ir - ${cron:-0} ))
  # the reference's workload of the same shape
  ref=; case "$w" in ours-*|refmode-*) ref=ref-${w#*-}; ref=${ref/-tb-/-}; ref=${ref/-sw-/-} ;;
    lean-*-b1|lean-b1|floor-b1) ref=ref-c1 ;; lean-*|floor-b*) ref=ref-c50 ;; esac
  if [ -n "$ref" ] && [ -z "${IR[$ref]:-}" ] && [ "${ref##*-c}" != 1 ]; then ref=${ref%-c*}-c50; fi
  x=–; xc=–; if [ -n "$ref" ] && [ -n "${IR[$ref]:-}" ]; then
    x=$(printf '%.2f' "$(echo "$ir / ${IR[$ref]}" | bc -l)"); xc=$(printf '%.2f' "$(echo "${XC[$w]} / ${XC[$ref]}" | bc -l)"); fi
  b=–; if [ "$scripts" -gt 0 ]; then b=$(printf '%.1f' "$(echo "$N / $scripts" | bc -l)"); fi
  printf '%-16s %14s %9.0f %8s %13.0f %9s %12s  %s\n' "$w" "$ir" "$(echo "$ir / $N" | bc -l)" "$x" "$(echo "${XC[$w]} / $N" | bc -l)" "$xc" "$b" "$cmds"
  stop_redis
done
