#!/usr/bin/env bash
# Tools and checks for deploy/ (SPEC section 8; tests in tests/deploy/).
#
#   scripts/check_deploy.sh install    install the missing tools (quick when all are present)
#   scripts/check_deploy.sh            install, then run tests/deploy with .venv's pytest
#
# Tools: promtool and prometheus (Debian `prometheus`), yamllint, docker-compose, kubectl (with
# `kubectl kustomize`), systemd-analyze. `install` never fails the build: a tool it could not
# install makes the tests that need it fail in CI (CI=true) or skip elsewhere, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "check_deploy: $*" >&2; }

# command -> Debian package
declare -A PACKAGES=(
  [promtool]=prometheus [prometheus]=prometheus [yamllint]=yamllint
  [docker-compose]=docker-compose [kubectl]=kubectl [systemd-analyze]=systemd
)

apt_install() {
  local sudo=() policy=/usr/sbin/policy-rc.d created=0 rc=0
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null && sudo=(sudo -n) || { log "not root and no sudo"; return 1; }
  fi
  # The prometheus package starts its service on install where it can; forbid that (exit 101)
  # unless the machine already has a policy.
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    created=1
  fi
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -y
    -o Dpkg::Use-Pty=0 install --no-install-recommends)
  if ! "${apt[@]}" "$@" >/dev/null; then
    # Stale package lists, or one package this machine's sources lack: update, then one by one.
    log "apt-get install failed; updating the package lists and retrying"
    "${sudo[@]}" apt-get -qq update >/dev/null || rc=1
    local package
    for package in "$@"; do
      "${apt[@]}" "$package" >/dev/null || { log "could not install $package"; rc=1; }
    done
  fi
  ((created)) && "${sudo[@]}" rm -f "$policy"
  return $rc
}

install() {
  local tool missing=()
  for tool in "${!PACKAGES[@]}"; do
    command -v "$tool" >/dev/null || missing+=("${PACKAGES[$tool]}")
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  log "installing ${missing[*]}"
  apt_install "${missing[@]}" || log "could not install ${missing[*]}; tests/deploy will say"
  return 0
}

case ${1:-check} in
  install) install ;;
  check) install; exec .venv/bin/pytest tests/deploy ${PYTEST_ARGS:-} ;;
  *) echo "usage: $0 [install|check]" >&2; exit 2 ;;
esac
