#!/usr/bin/env bash
# Debian packages the test suite drives as real programs, installed when missing:
#   redis-server  the store's integration tests start their own Redis processes
#   chromium      the status page is checked in headless Chromium
#   strace        the reliability suite traces the daemon's file system calls
#   openssl       the reliability suite makes a self-signed certificate for TLS Redis
# Quick when everything is present (only `command -v` runs). Needs root or sudo to install.
set -euo pipefail

declare -A PACKAGE_OF=(
  [redis-server]=redis-server
  [chromium]=chromium
  [strace]=strace
  [openssl]=openssl
)

missing=()
for program in "${!PACKAGE_OF[@]}"; do
  command -v "$program" >/dev/null 2>&1 || missing+=("${PACKAGE_OF[$program]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
