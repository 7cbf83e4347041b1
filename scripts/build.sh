#!/usr/bin/env bash
# Configures and builds hybridps into build/ (override with HYBRIDPS_BUILD_DIR), -j2.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HYBRIDPS_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHYBRIDPS_PYTHON="$root/.venv/bin/python" ${HYBRIDPS_CMAKE_ARGS:-} > "$build.cmake.log" 2>&1 ||
  { cat "$build.cmake.log"; exit 1; }
grep -E "^-- hybridps:" "$build.cmake.log" || true
cmake --build "$build" -j "${HYBRIDPS_JOBS:-2}"
