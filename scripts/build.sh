#!/usr/bin/env bash
# Configures and builds hybridps into build/ (override with HYBRIDPS_BUILD_DIR), -j2.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HYBRIDPS_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHYBRIDPS_BUILD_TESTS=ON -DHYBRIDPS_BUILD_BENCH=ON \
  -DHYBRIDPS_PYTHON="$root/.venv/bin/python" ${HYBRIDPS_CMAKE_ARGS:-} > "$build.cmake.log" 2>&1 ||
  { cat "$build.cmake.log"; exit 1; }
grep -E "^-- hybridps:" "$build.cmake.log" || true
cmake --build "$build" -j "${HYBRIDPS_JOBS:-2}"
# Puts the Python package hybridps (sources here, the extension in the build tree) on the
# project virtual environment's path, with the hook that turns a forgotten
# `import hybridps.mxnet` into a clear error.
if [ -x "$root/.venv/bin/python" ] && [ -e "$build/mxnet_kvstore" ]; then
  "$root/.venv/bin/python" - "$root/mxnet_kvstore" "$build/mxnet_kvstore" <<'PY'
import sys, sysconfig, pathlib
src, ext = sys.argv[1], sys.argv[2]
site = pathlib.Path(sysconfig.get_paths()["purelib"])
# hybridps-dev.pth: not the installed wheel's hybridps.pth, which `pip install` may write
old = site / "hybridps.pth"
if old.exists() and old.read_text().startswith(f"{src}\n"):
    old.unlink()  # what earlier versions of this script wrote
pth = site / "hybridps-dev.pth"
text = (f"{src}\n{ext}\n"
        "import sys; exec('try:\\n import hybridps._mxnet_hook as h; h.install()\\n"
        "except Exception: pass')\n")
if not pth.exists() or pth.read_text() != text:
    pth.write_text(text)
    print(f"build: wrote {pth}")
PY
fi
