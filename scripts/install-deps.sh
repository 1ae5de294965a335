#!/usr/bin/env bash
# Installs what tidemark needs from Debian 12's packages (run as root). Does nothing when all
# of it is already there, so it is cheap to call from every script.
set -euo pipefail

PACKAGES=(
  g++ cmake ninja-build pkg-config git clang-format clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libssl-dev openssl
  libsqlite3-dev sqlite3 nlohmann-json3-dev zlib1g-dev
  qt6-base-dev libgl-dev
  libgtest-dev
  python3 python3-torch libtorch-dev libopenblas0-pthread
  xvfb
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

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
