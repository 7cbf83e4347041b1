#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job: a small data-parallel training
# run on this machine (scheduler, 2 servers and 2 workers started locally by hybridrun).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh
build=${HYBRIDPS_BUILD_DIR:-$root/build}
exec scripts/hybridrun -np 2 --servers 2 -- "$build/examples/hybridps-train-logreg" "$@"
