#!/usr/bin/env bash
# Installs PostgreSQL from Debian's packages when no initdb is found on PATH
# or under /usr/lib/postgresql/*/bin. Tests start their own throwaway
# clusters on free loopback ports (pkg/backend/postgres/pgtest); this script
# never starts a service.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
  exit 0
fi
for d in /usr/lib/postgresql/*/bin; do
  if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then
    exit 0
  fi
done
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends postgresql >/dev/null 2>&1 || {
  $SUDO apt-get update >/dev/null
  $SUDO apt-get install -y --no-install-recommends postgresql >/dev/null
}
# Debian's package starts a system cluster; our tests never use it.
$SUDO systemctl disable --now postgresql >/dev/null 2>&1 || $SUDO service postgresql stop >/dev/null 2>&1 || true
ls /usr/lib/postgresql/*/bin/initdb >/dev/null
