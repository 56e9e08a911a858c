#!/usr/bin/env bash
# Installs redis-server and redis-cli from Debian's packages when missing.
# Tests start their own redis-server processes on free loopback ports; this
# script never starts a service.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends redis-server redis-tools >/dev/null 2>&1 || {
  $SUDO apt-get update >/dev/null
  $SUDO apt-get install -y --no-install-recommends redis-server redis-tools >/dev/null
}
# Debian's package starts a system service; our tests never use it.
$SUDO systemctl disable --now redis-server >/dev/null 2>&1 || $SUDO service redis-server stop >/dev/null 2>&1 || true
command -v redis-server >/dev/null
