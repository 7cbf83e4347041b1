"""Installing hybridps as users do, and using only what was installed.

The wheel (scripts/build-wheel; scripts/test.sh builds it into <build>/dist before CTest
runs) goes into a fresh virtual environment outside the source tree, with MXNet from the
package index; from another folder, with no PYTHONPATH and no build tree on any path, the
installed `hybridrun` runs the digits example on both stores. Every ELF file the wheel
installs resolves its libraries inside the wheel or from the C library family, and none
needs the CUDA runtime or NCCL. `cmake --install` gives a prefix against which the
out-of-tree C++ consumer (examples/cpp_consumer) builds and runs a job.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR") or REPO / "build")
TIMEOUT = 600.0
# What a manylinux host provides itself (auditwheel's policy): nothing else may come from
# outside the wheel.
SYSTEM_LIBS = re.compile(r"^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|"
                         r"libresolv|libutil|libstdc\+\+|libgcc_s|libz)\.so")


def run(args: list[str | Path], **kw) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", TIMEOUT)
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing of the source tree or the build tree."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HYBRIDPS_", "PYTHON", "VIRTUAL_ENV", "LD_LIBRARY_PATH"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", os.defpath).split(os.pathsep)
                                  if not p.startswith((str(REPO), str(BUILD))))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel() -> Path:
    found = sorted((BUILD / "dist").glob("hybridps-*.whl"))
    assert found, (f"no wheel in {BUILD / 'dist'}: scripts/test.sh builds it "
                   f"(scripts/build-wheel {BUILD / 'dist'})")
    return found[-1]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel and MXNet installed."""
    root = tmp_path_factory.mktemp("user") / "venv"
    # The interpreter the project's .venv was made from: the wheel's extension is for it.
    done = run([sys._base_executable, "-m", "venv", root], env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    done = run([root / "bin" / "python", "-m", "pip", "install", "-q",
                "--disable-pip-version-check", f"{wheel}[mxnet]", "scikit-learn"],
               env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def test_the_wheel_carries_its_libraries_and_no_cuda(venv: Path) -> None:
    site = site_packages(venv)
    elves = [site / "hybridps" / "bin" / "hybridps-scheduler",
             site / "hybridps" / "bin" / "hybridps-server",
             *site.glob("_hybridps_core*.so"), *(site / "hybridps.libs").iterdir()]
    assert len(elves) > 5 and all(p.is_file() for p in elves), elves
    names = {p.name for p in (site / "hybridps.libs").iterdir()}
    for lib in ("libzmq", "libprotobuf", "libsodium", "libabsl_status", "libgloo"):
        assert any(n.startswith(lib) for n in names), (lib, sorted(names))
    for elf in elves:
        done = run(["ldd", elf], env=clean_env())
        assert done.returncode == 0, (elf, done.stdout + done.stderr)
        assert "not found" not in done.stdout, (elf, done.stdout)
        for line in done.stdout.splitlines():
            if "statically linked" in line:  # a library that needs no other
                continue
            name = line.split()[0]
            path = line.split("=>")[1].split("(")[0].strip() if "=>" in line else name
            assert not name.startswith(("libcudart", "libnccl", "libcuda.")), (elf, line)
            inside = os.path.normpath(path).startswith(str(site / "hybridps.libs"))
            assert inside or SYSTEM_LIBS.match(Path(name).name), (elf, line)


def test_versions_agree_everywhere(venv: Path) -> None:
    site = site_packages(venv)
    version = run([venv / "bin" / "python", "-c", "import hybridps, hybridps._core as c; "
                   "print(hybridps.__version__, c.core.__version__, hybridps.__file__)"],
                  env=clean_env(), cwd=venv.parent)
    assert version.returncode == 0, version.stdout + version.stderr
    ours, ext, where = version.stdout.split()
    assert ours == ext and where.startswith(str(site)), version.stdout
    entrypoint = run([venv / "bin" / "hybridps-k8s-entrypoint", "--help"], env=clean_env())
    assert entrypoint.returncode == 0 and "usage" in entrypoint.stdout.lower(), entrypoint
    for command, name in ((venv / "bin" / "hybridrun", "hybridrun (hybridps)"),
                          (site / "hybridps" / "bin" / "hybridps-server", "hybridps-server"),
                          (site / "hybridps" / "bin" / "hybridps-scheduler",
                           "hybridps-scheduler")):
        done = run([command, "--version"], env=clean_env(), cwd=venv.parent)
        assert done.returncode == 0 and done.stdout == f"{name} {ours}\n", done


def test_a_forgotten_plugin_import_is_explained(venv: Path) -> None:
    done = run([venv / "bin" / "python", "-c", "import mxnet as mx; mx.kv.create('dist_hybrid')"],
               env=clean_env(), cwd=venv.parent)
    assert done.returncode != 0
    assert "the hybridps plugin was not imported" in done.stderr, done.stderr


@pytest.mark.parametrize("store", ["dist_hybrid", "dist_allreduce"])
def test_the_installed_hybridrun_trains_the_digits(venv: Path, store: str,
                                                   tmp_path: Path) -> None:
    script = tmp_path / "train_digits.py"
    shutil.copy(REPO / "mxnet_kvstore" / "examples" / "train_digits.py", script)
    servers = ["--servers", "2"] if store == "dist_hybrid" else []
    # dist_hybrid as on a host without CUDA: the CUDA runtime and NCCL cannot be loaded.
    no_cuda = ({"HYBRIDPS_CUDART_LIBRARY": "/nonexistent/libcudart.so",
                "HYBRIDPS_NCCL_LIBRARY": "/nonexistent/libnccl.so"}
               if store == "dist_hybrid" else {})
    done = run([venv / "bin" / "hybridrun", "-np", "2", *servers, "--backend", store, "--",
                venv / "bin" / "python", script, "--kvstore", store, "--epochs", "5",
                "--min-accuracy", "0.9"],
               env=clean_env(**no_cuda), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = [line for line in done.stdout.splitlines() if "RESULT test_accuracy" in line]
    assert len(result) == 1 and result[0].startswith("[worker 0] ") and (
        f"({store}, 2 workers)" in result[0]), done.stdout
    # Its scheduler and servers are the wheel's.
    plan = run([venv / "bin" / "hybridrun", "--dry-run", "-np", "2", *servers, "--", "true"],
               env=clean_env(), cwd=tmp_path)
    assert f"on localhost: {site_packages(venv) / 'hybridps' / 'bin'}" in plan.stdout, plan


@pytest.mark.parametrize("store", ["dist_hybrid", "dist_allreduce"])
def test_a_cpp_program_builds_against_cmake_install(store: str,
                                                   tmp_path_factory: pytest.TempPathFactory
                                                   ) -> None:
    base = tmp_path_factory.getbasetemp() / "cpp"
    prefix, consumer = base / "prefix", base / "consumer"
    if not (consumer / "hybridps-consumer").exists():
        done = run(["cmake", "--install", BUILD, "--component", "cpp", "--prefix", prefix])
        assert done.returncode == 0, done.stdout + done.stderr
        assert (prefix / "lib" / "cmake" / "hybridps" / "hybridpsConfig.cmake").is_file()
        assert (prefix / "include" / "hybridps" / "worker" / "kvstore.h").is_file()
        done = run(["cmake", "-S", REPO / "examples" / "cpp_consumer", "-B", consumer,
                    f"-DCMAKE_PREFIX_PATH={prefix}"], env=clean_env())
        assert done.returncode == 0, done.stdout + done.stderr
        done = run(["cmake", "--build", consumer], env=clean_env())
        assert done.returncode == 0, done.stdout + done.stderr
        ldd = run(["ldd", consumer / "hybridps-consumer"]).stdout
        assert str(prefix / "lib" / "libhybridps.so") in ldd, ldd
        assert "libcudart" not in ldd and "libnccl" not in ldd, ldd
    servers = ["--servers", "1"] if store == "dist_hybrid" else []
    done = run([prefix / "bin" / "hybridrun", "-np", "2", *servers, "--backend", store, "--",
                consumer / "hybridps-consumer"], env=clean_env(), cwd=base)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert (f"[worker {rank}] hybridps-consumer: worker {rank} of 2: broadcast and sum "
                "exact") in done.stdout, done.stdout
