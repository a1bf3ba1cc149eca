#!/usr/bin/env bash
# Installs the Debian packages ringlane builds against, then the npm packages
# of tests/openai_client (the pinned `openai` client) and tests/helm (the
# pinned kubernetes-models schemas). Idempotent: does nothing
# when every package is already installed and node_modules is up to date. Uses
# sudo only when not root.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

PACKAGES=(
  cmake g++ make pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libibverbs-dev librdmacm-dev
  libboost-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev libicu-dev librocksdb-dev
  gnuplot-nox prometheus
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev
  debootstrap podman
  ccache clang openssl
  python3-torch python3-numpy
)

# Node.js and npm for tests/openai_client; Debian's when none is installed (a
# node from elsewhere, with its own npm, is kept).
if ! command -v node >/dev/null 2>&1; then PACKAGES+=(nodejs npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The npm packages of tests/openai_client and tests/helm, as their
# package-lock.json pins them, when node_modules is missing or older than the
# lock (npm ci rewrites node_modules/.package-lock.json, the stamp). A failure here only warns:
# `make serve` does not need them, and the test itself says what is missing.
for NPM_DIR in "$ROOT/tests/openai_client" "$ROOT/tests/helm"; do
  if [ -f "$NPM_DIR/package.json" ] &&
     { [ ! -f "$NPM_DIR/node_modules/.package-lock.json" ] ||
       [ "$NPM_DIR/package-lock.json" -nt "$NPM_DIR/node_modules/.package-lock.json" ]; }; then
    if ! command -v npm >/dev/null 2>&1; then
      echo "install_deps: npm not found; ${NPM_DIR#"$ROOT"/} needs Node.js 20+ with npm" >&2
    else
      echo "install_deps: npm ci in ${NPM_DIR#"$ROOT"/}" >&2
      (cd "$NPM_DIR" && npm ci --no-audit --no-fund --prefer-offline --loglevel=error >/dev/null) ||
        echo "install_deps: npm ci in ${NPM_DIR#"$ROOT"/} failed" >&2
    fi
  fi
done
