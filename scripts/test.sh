#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (ctest: unit, server, e2e;
# tests labelled gpu skip themselves without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j 2 "$@"
