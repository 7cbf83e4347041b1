#!/usr/bin/env bash
# Installs what is needed, builds, checks the sources with clang's thread-safety analysis
# (scripts/clang-check.sh), and runs every test (CTest: unit, cluster, multiproc, python;
# gpu-labelled tests skip themselves without a GPU).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh
# clang's thread-safety analysis over our sources (syntax only, the build's flags).
bash scripts/clang-check.sh
build=${HYBRIDPS_BUILD_DIR:-$root/build}
ctest --test-dir "$build" --output-on-failure --timeout 900 "$@"
