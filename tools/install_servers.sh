#!/usr/bin/env bash
# Installs the real servers the fleet tests start (PostgreSQL and Redis) from Debian's packages
# when they are missing. Tests start them in temporary directories on free ports; nothing is
# started or enabled here.
set -euo pipefail

need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
  echo "install_servers: missing ${need[*]}; install them with your package manager (Debian: apt-get install ${need[*]})" >&2
  exit 1
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d 101: the packages must not start system-wide services on install.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  $SUDO sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d'
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "install_servers: installed ${need[*]}"
