#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job: MXNet Gluon training on
# scikit-learn's handwritten digits through mx.kv.create('dist_hybrid'), data-parallel on
# this machine (scheduler, 2 servers and 2 workers started by hybridrun). Fails unless the
# test accuracy reaches 95%. Extra arguments go to train_digits.py (--help lists them).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh
build=${HYBRIDPS_BUILD_DIR:-$root/build}
export PYTHONPATH="$root/mxnet_kvstore:$build/mxnet_kvstore${PYTHONPATH:+:$PYTHONPATH}"
exec scripts/hybridrun -np 2 --servers 2 --bin-dir "$build" -- \
  "$root/.venv/bin/python" "$root/mxnet_kvstore/examples/train_digits.py" \
  --kvstore dist_hybrid --min-accuracy 0.95 "$@"
