#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test (CTest: unit, cluster, multiproc,
# python; gpu-labelled tests skip themselves without a GPU).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh
build=${HYBRIDPS_BUILD_DIR:-$root/build}
ctest --test-dir "$build" --output-on-failure --timeout 900 "$@"
