#!/usr/bin/env bash
# Installs what is needed, builds, makes the wheel from the same build directory
# (scripts/build-wheel into <build>/dist, for the install test), checks the sources with
# clang's thread-safety analysis (scripts/clang-check.sh), and runs every test (CTest:
# unit, cluster, multiproc, python; gpu-labelled tests skip themselves without a GPU).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh
build=${HYBRIDPS_BUILD_DIR:-$root/build}
rm -rf "$build/dist"
bash scripts/build-wheel --build-dir "$build" "$build/dist" > "$build/wheel.log" 2>&1 ||
  { cat "$build/wheel.log"; exit 1; }
tail -1 "$build/wheel.log"
# clang's thread-safety analysis over our sources (syntax only, the build's flags).
bash scripts/clang-check.sh
ctest --test-dir "$build" --output-on-failure --timeout 900 "$@"
