#!/usr/bin/env bash
# Runs envoyproxy/ratelimit's own integration suite (its test/integration,
# taken from the Go module cache at run time, never committed here) against
# the ratelimitd binary built from this checkout, and prints one line per
# test case (PASS/FAIL) and the totals.
#
# The suite's import of the reference's src/service_cmd/runner is rewritten
# to scripts/refsuite/runner, which starts ratelimitd with the reference's
# environment variables instead of the reference's in-process server
# (docs/migrating.md, "The reference's own integration suite").
#
# The suite uses fixed ports; this script starts the servers the suite does
# not start itself (Redis behind TLS, Sentinel, Cluster) on the reference's
# ports and stops them on exit. It refuses to run when one of those ports is
# taken. It is an on-demand measurement, not part of make test.
#
# Environment:
#   REFSUITE_VERSION   reference module version (default: the one below)
#   REFSUITE_WORK      working directory (default: a new mktemp -d); kept
#   REFSUITE_RUN       go test -run pattern (default: all)
#   REFSUITE_TIMEOUT   -test.timeout of each top-level test (default: 30m)
#   REFSUITE_BIN       a ratelimitd binary to test instead of building one
#   RATELIMITD_ARGS    its arguments, space-separated (default: serve)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${REFSUITE_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}"
MODULE=github.com/envoyproxy/ratelimit
WORK="${REFSUITE_WORK:-$(mktemp -d /tmp/refsuite.XXXXXX)}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
LOG="$WORK/refsuite.log"
PASSWORD=password123

die() { echo "refsuite: $*" >&2; exit 1; }

# Ports the suite uses: started here (Redis TLS, Sentinel, Cluster and its bus
# ports) or by the suite itself (plain Redis, memcached, ratelimitd's
# listeners, its xDS server).
OWN_PORTS=(6381 6382 6361 16381 16382 16361 6392 6393 26394 26395 26396 6397 6398 26399 26400 26401
  6386 6387 6388 6389 6390 6391 16386 16387 16388 16389 16390 16391)
SUITE_PORTS=(6380 6383 6384 6385 6394 6494 6495 8082 8083 8084 18000)

port_taken() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
  (exec 3<>"/dev/tcp/::1/$1") 2>/dev/null && return 0
  return 1
}
taken=()
for p in "${OWN_PORTS[@]}" "${SUITE_PORTS[@]}"; do
  if port_taken "$p"; then taken+=("$p"); fi
done
[ ${#taken[@]} -eq 0 ] || die "ports in use: ${taken[*]} (the reference's suite needs them; stop what listens there)"

"$ROOT/scripts/ensure-redis.sh"
if ! command -v memcached >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends memcached >/dev/null
  $SUDO systemctl disable --now memcached >/dev/null 2>&1 || $SUDO service memcached stop >/dev/null 2>&1 || true
fi
command -v openssl >/dev/null || die "openssl is needed for the Redis TLS certificate"

# The reference's source, from the module cache (downloaded if missing).
SRC="$(cd "$ROOT" && go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[ -n "$SRC" ] && [ -d "$SRC/test/integration" ] || die "no test/integration in $MODULE@$VERSION (dir: '${SRC}')"
echo "refsuite: reference $MODULE@$VERSION from $SRC"
echo "refsuite: working directory $WORK"

# The test module: our shim, the reference's integration tests with their
# runner import rewritten, the reference module required for the rest
# (settings, utils, memcached, test/common and their dependencies).
MOD="$WORK/mod"
rm -rf "$MOD"
mkdir -p "$MOD"
cp -r "$ROOT/scripts/refsuite/." "$MOD/"
cp -r "$SRC/test/integration" "$MOD/integration"
chmod -R u+w "$MOD"
rm -f "$MOD/integration/dump.rdb"
for f in "$MOD"/integration/*.go; do
  sed -i "s#\"$MODULE/src/service_cmd/runner\"#\"refsuite.local/runner\"#" "$f"
done
(cd "$MOD" && go mod edit -require="$MODULE@$VERSION" && GOFLAGS=-mod=mod go mod tidy)

# ratelimitd.
if [ -n "${REFSUITE_BIN:-}" ]; then
  [ -x "$REFSUITE_BIN" ] || die "REFSUITE_BIN=$REFSUITE_BIN is not an executable"
  RATELIMITD_BIN="$(cd "$(dirname "$REFSUITE_BIN")" && pwd)/$(basename "$REFSUITE_BIN")"
else
  (cd "$ROOT" && go build -o "$WORK/ratelimitd" ./cmd/ratelimitd)
  RATELIMITD_BIN="$WORK/ratelimitd"
fi
export RATELIMITD_BIN

# The certificate of the TLS Redis servers, where the suite looks for it
# (PROJECT_DIR/cert.pem, key.pem; the reference's Makefile makes it the same
# way). The reference installs it in the system trust store; here only
# ratelimitd's process trusts it, through SSL_CERT_FILE.
PROJ="$WORK/project"
mkdir -p "$PROJ"
if [ ! -f "$PROJ/cert.pem" ]; then
  openssl req -new -newkey rsa:2048 -days 30 -nodes -x509 \
    -subj "/C=US/ST=Denial/L=Springfield/O=Dis/CN=localhost" \
    -addext "subjectAltName = DNS:localhost" \
    -keyout "$PROJ/key.pem" -out "$PROJ/cert.pem" 2>/dev/null
fi
export PROJECT_DIR="$PROJ"
export SSL_CERT_FILE="$PROJ/cert.pem"

# Servers the suite does not start itself (the reference's Makefile target
# tests_with_redis starts them the same way, with stunnel for TLS where
# Redis' own TLS listener is used here).
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
SRV="$WORK/servers"
rm -rf "$SRV"
mkdir -p "$SRV"
redis() { # name, then redis-server arguments
  local name="$1"
  shift
  mkdir -p "$SRV/$name"
  (cd "$SRV/$name" && exec redis-server --bind 127.0.0.1 -::1 --save "" --appendonly no "$@" >"$SRV/$name.log" 2>&1) &
  PIDS+=($!)
}
wait_port() {
  for _ in $(seq 1 100); do
    if port_taken "$1"; then return 0; fi
    sleep 0.1
  done
  die "nothing listens on $1 (see $SRV/*.log)"
}
tls_args=(--tls-cert-file "$PROJ/cert.pem" --tls-key-file "$PROJ/key.pem" --tls-ca-cert-file "$PROJ/cert.pem")
redis tls-6381 --port 6381 --requirepass "$PASSWORD" --tls-port 16381 "${tls_args[@]}" --tls-auth-clients no
redis tls-6382 --port 6382 --requirepass "$PASSWORD" --tls-port 16382 "${tls_args[@]}" --tls-auth-clients no
redis tls-6361 --port 6361 --requirepass "$PASSWORD" --tls-port 16361 "${tls_args[@]}" --tls-auth-clients yes
redis sentinel-6392 --port 6392 --requirepass "$PASSWORD"
redis sentinel-6393 --port 6393 --requirepass "$PASSWORD" --replicaof 127.0.0.1 6392 --masterauth "$PASSWORD"
redis sentinel-6397 --port 6397 --requirepass "$PASSWORD"
redis sentinel-6398 --port 6398 --requirepass "$PASSWORD" --replicaof 127.0.0.1 6397 --masterauth "$PASSWORD"
for p in 6386 6387 6388 6389 6390 6391; do
  redis "cluster-$p" --port "$p" --cluster-enabled yes --requirepass "$PASSWORD"
done
for p in 6392 6397 6386 6387 6388 6389 6390 6391 16381 16382 16361; do wait_port "$p"; done
sentinel() { # port, conf
  mkdir -p "$SRV/s$1"
  cp "$MOD/integration/conf/$2" "$SRV/s$1/sentinel.conf"
  (cd "$SRV/s$1" && exec redis-server "$SRV/s$1/sentinel.conf" --sentinel --port "$1" --bind 127.0.0.1 -::1 >"$SRV/s$1.log" 2>&1) &
  PIDS+=($!)
}
for p in 26394 26395 26396; do sentinel "$p" sentinel.conf; done
for p in 26399 26400 26401; do sentinel "$p" sentinel-pre-second.conf; done
for p in 26394 26395 26396 26399 26400 26401; do wait_port "$p"; done
redis-cli --cluster create -a "$PASSWORD" 127.0.0.1:6386 127.0.0.1:6387 127.0.0.1:6388 --cluster-replicas 0 --cluster-yes >"$SRV/cluster-a.log" 2>&1 ||
  die "cluster 6386-6388 not created (see $SRV/cluster-a.log)"
redis-cli --cluster create -a "$PASSWORD" 127.0.0.1:6389 127.0.0.1:6390 127.0.0.1:6391 --cluster-replicas 0 --cluster-yes >"$SRV/cluster-b.log" 2>&1 ||
  die "cluster 6389-6391 not created (see $SRV/cluster-b.log)"
for p in 6386 6389; do
  ok=""
  for _ in $(seq 1 100); do
    if redis-cli -p "$p" -a "$PASSWORD" --no-auth-warning cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then ok=1; break; fi
    sleep 0.1
  done
  [ -n "$ok" ] || die "cluster of $p not ok (see $SRV)"
done
echo "refsuite: servers up (TLS Redis, Sentinel, Cluster); running the suite"

# The suite, compiled once. Its tests read runtime/ relative to their
# package directory. Each top-level test runs in its own process: a panic in
# one of the reference's tests (they index responses without checking the
# error) ends its process, so that test is run again with the subtests
# already reported skipped (-test.skip), until it ends without a panic.
(cd "$MOD/integration" && go test -tags=integration -c -o "$WORK/suite.test" .) || die "the suite does not compile"
: >"$LOG"
RUNS="$WORK/runs"
rm -rf "$RUNS"
mkdir -p "$RUNS"
rc=0
tests="$(cd "$MOD/integration" && "$WORK/suite.test" -test.list "${REFSUITE_RUN:-.}" | grep '^Test' || true)"
[ -n "$tests" ] || die "no test matches '${REFSUITE_RUN:-.}'"
quote() { sed 's/[][\\.*^$()+?{}|]/\\&/g'; }
for t in $tests; do
  done_subs=""
  for attempt in $(seq 1 50); do
    out="$RUNS/$t.$attempt.log"
    args=(-test.v -test.count=1 -test.timeout "${REFSUITE_TIMEOUT:-30m}" -test.run "^$t\$")
    if [ -n "$done_subs" ]; then args+=(-test.skip "^$t\$/^($done_subs)\$"); fi
    echo "=== refsuite: $t (run $attempt${done_subs:+, skipping subtests already reported})" | tee -a "$LOG"
    # In a session of its own, so that what it leaves behind when it panics
    # (the suite's redis-server and memcached children) is stopped with it.
    (cd "$MOD/integration" && exec setsid "$WORK/suite.test" "${args[@]}") >"$out" 2>&1 &
    tpid=$!
    set +e
    wait "$tpid"
    trc=$?
    set -e
    kill -- "-$tpid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 -- "-$tpid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$tpid" 2>/dev/null || true
    cat "$out" >>"$LOG"
    [ "$trc" -eq 0 ] || rc=1
    if [ "$trc" -eq 0 ] || ! grep -q '^panic: ' "$out" || grep -q '^panic: test timed out' "$out"; then break; fi
    subs="$(grep -oE -- "--- (PASS|FAIL|SKIP): $t/[^ ]+" "$out" | sed "s#^--- [A-Z]*: $t/##; s#/.*##" | sort -u | quote | paste -sd'|' -)"
    [ -n "$subs" ] || break
    before="$done_subs"
    done_subs="${done_subs:+$done_subs|}$subs"
    [ "$before" != "$done_subs" ] || break
    echo "=== refsuite: $t panicked; running its remaining subtests" | tee -a "$LOG"
  done
done

# The table: every test and subtest, then the totals. A case is a test or
# subtest without subtests of its own.
awk '
  /^[[:space:]]*--- (PASS|FAIL|SKIP): / {
    res = $2; sub(":", "", res); name = $3
    if (!(name in seen)) { order[++n] = name; seen[name] = 1 }
    if (result[name] != "FAIL") result[name] = res
  }
  END {
    for (i = 1; i <= n; i++) {
      name = order[i]; parent = name
      while (sub("/[^/]*$", "", parent)) { haschild[parent] = 1 }
    }
    printf "%-110s %s\n", "TEST", "RESULT"
    for (i = 1; i <= n; i++) {
      name = order[i]
      if (name in haschild) continue
      printf "%-110s %s\n", name, result[name]
      total[result[name]]++; cases++
    }
    printf "\ncases: %d  PASS: %d  FAIL: %d  SKIP: %d\n", cases, total["PASS"], total["FAIL"], total["SKIP"]
    for (i = 1; i <= n; i++) { name = order[i]; if (name !~ /\//) { top++; ttotal[result[name]]++ } }
    printf "top-level tests: %d  PASS: %d  FAIL: %d  SKIP: %d\n", top, ttotal["PASS"], ttotal["FAIL"], ttotal["SKIP"]
  }' "$LOG"
grep -E '^panic: ' "$LOG" | sort | uniq -c | sed 's/^/refsuite: panics: /' || true
echo "refsuite: full log $LOG"
exit "$rc"
