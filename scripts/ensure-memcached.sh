#!/usr/bin/env bash
# Installs memcached from Debian's package when missing. Tests start their
# own memcached processes on free loopback ports (pkg/backend/memcache/
# memcachetest); this script never starts a service.
set -euo pipefail
if command -v memcached >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends memcached >/dev/null 2>&1 || {
  $SUDO apt-get update >/dev/null
  $SUDO apt-get install -y --no-install-recommends memcached >/dev/null
}
# Debian's package starts a system service; our tests never use it.
$SUDO systemctl disable --now memcached >/dev/null 2>&1 || $SUDO service memcached stop >/dev/null 2>&1 || true
command -v memcached >/dev/null
