#!/usr/bin/env bash
# Configures and builds tidemark into build/ (reused between runs, so rebuilds are incremental).
# Warnings are errors. BUILD_DIR overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIDEMARK_WERROR=ON >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
