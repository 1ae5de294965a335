#!/usr/bin/env bash
# Installs what tidemark needs (run as root): Debian 12's packages, and a virtual environment
# outside the checkout with the newest torch 2.x from PyPI, `transformers` (and `accelerate`, for
# its Trainer) and `memray` ($TIDEMARK_VENV, default /opt/tidemark-venv; reused by every clone).
# Does nothing when all of it is already there, so it is cheap to call from every script.
set -euo pipefail
VENV=${TIDEMARK_VENV:-/opt/tidemark-venv}

PACKAGES=(
  g++ cmake ninja-build pkg-config git clang-format clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libssl-dev openssl
  libsqlite3-dev sqlite3 nlohmann-json3-dev zlib1g-dev
  libpq-dev postgresql python3-psycopg2
  qt6-base-dev libgl-dev
  libgtest-dev
  python3 python3-venv python3-dev pybind11-dev python3-torch libtorch-dev libopenblas0-pthread
  xvfb
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
install_packages() {
  if [ ${#missing[@]} -eq 0 ]; then
    return
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
}

# torch 2.x beside Debian's 1.13: the e2e suites run under both (tests/CMakeLists.txt).
install_torch2() {
  if "$VENV/bin/python" -c "import torch, transformers, accelerate, memray" 2>/dev/null; then
    return
  fi
  echo "install-deps: making $VENV with torch 2.x, transformers, accelerate and memray from PyPI" >&2
  [ -x "$VENV/bin/pip" ] || /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q torch numpy transformers accelerate memray >/dev/null
  "$VENV/bin/python" -c "import torch; print('install-deps: torch', torch.__version__, 'in $VENV')" >&2
}

install_packages
install_torch2
