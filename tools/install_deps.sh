#!/usr/bin/env bash
# Installs the Debian packages ringlane builds against. Idempotent: does
# nothing when every package is already installed. Uses sudo only when not root.
set -euo pipefail

PACKAGES=(
  cmake g++ make pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libibverbs-dev librdmacm-dev
  libboost-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev libicu-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}" >&2
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
