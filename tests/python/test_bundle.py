"""Tests of scripts/bundle: a self-contained folder of the binaries and their libraries.

A bundle is made from the build tree ($HYBRIDPS_BUILD_DIR, CTest sets it, else
<repo>/build) into a temporary folder; a real job (scheduler, server, two workers of the
logistic-regression example) then runs from the bundle alone: its hybridrun, its
binaries, its libraries first on the loader's path.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "scripts" / "bundle"
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR") or REPO / "build")
TIMEOUT = 120.0


def make(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUNDLE), "--build-dir", str(BUILD), *extra, str(out)],
                          capture_output=True, text=True, timeout=TIMEOUT)


def bundle_env(out: Path) -> dict[str, str]:
    """The environment after `source OUT/env.sh`, from a clean start."""
    script = f'unset HYBRIDPS_BIN_DIR HYBRIDPS_BUILD_DIR; source "{out}/env.sh"; env -0'
    done = subprocess.run(["bash", "-c", script], capture_output=True, timeout=TIMEOUT,
                          check=True)
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return dict(pairs)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "hybridps"
    done = make(out, "--with-tests")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_layout_binaries_and_libraries(bundle: Path) -> None:
    for rel in ["scheduler/hybridps-scheduler", "server/hybridps-server",
                "examples/hybridps-train-logreg", "tests/multiproc/hybridps-test-worker"]:
        path = bundle / "build" / rel
        assert path.is_file() and os.access(path, os.X_OK), rel
    libs = {p.name for p in (bundle / "lib").iterdir()}
    assert any(name.startswith("libzmq.so") for name in libs), libs
    assert any(name.startswith("libprotobuf.so") for name in libs), libs
    # The C library family and the GPU driver stack come from the target host.
    for name in libs:
        assert not name.startswith(("libc.so", "libm.so", "libpthread.so", "libcuda.so",
                                    "libcudart.so", "libnccl.so")), name
    assert (bundle / "scripts" / "hybridrun").is_file()
    assert (bundle / "mxnet_kvstore" / "hybridps" / "launcher" / "cli.py").is_file()
    assert list((bundle / "build" / "mxnet_kvstore").glob("_hybridps_core*.so"))
    # The multi-process tests (device-checks runs their GPU cases) load with their harness.
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         str(bundle / "tests" / "multiproc" / "test_multiproc.py")],
        env={**os.environ, "HYBRIDPS_BUILD_DIR": str(bundle / "build")},
        capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    text = (bundle / "BUNDLE.txt").read_text()
    assert "build/scheduler/hybridps-scheduler" in text, text


def test_env_sh_points_at_the_bundle(bundle: Path) -> None:
    env = bundle_env(bundle)
    assert env["HYBRIDPS_BIN_DIR"] == str(bundle / "build")
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(bundle / "lib")
    # The interpreter the project's .venv was made from (no project .pth) imports the
    # package and its extension from the bundle alone.
    done = subprocess.run(
        [sys._base_executable, "-c", "import hybridps, hybridps._core as c; "
         "print(hybridps.__file__, c.core.__file__, hybridps.__version__)"],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=bundle.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    package, extension, _ = done.stdout.split()
    assert package.startswith(str(bundle / "mxnet_kvstore")), package
    assert extension.startswith(str(bundle / "build" / "mxnet_kvstore")), extension


def test_a_job_runs_from_the_bundle_alone(bundle: Path, tmp_path: Path) -> None:
    env = bundle_env(bundle)
    env["HYBRIDPS_JOB_TOKEN"] = "bundle-test"
    done = subprocess.run(
        [str(bundle / "scripts" / "hybridrun"), "-np", "2", "--servers", "1", "--",
         str(bundle / "build" / "examples" / "hybridps-train-logreg")],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final loss" in done.stdout, done.stdout
    # hybridrun takes the bundle's scheduler and server (not the build tree's).
    plan = subprocess.run(
        [str(bundle / "scripts" / "hybridrun"), "--dry-run", "-np", "2", "--servers", "1",
         "--", "true"], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert f"on localhost: {bundle / 'build' / 'scheduler' / 'hybridps-scheduler'}" in (
        plan.stdout), plan.stdout
    assert f"on localhost: {bundle / 'build' / 'server' / 'hybridps-server'}" in (
        plan.stdout), plan.stdout


def test_device_checks_run_from_the_bundle_within_their_budget(bundle: Path,
                                                               tmp_path: Path) -> None:
    """scripts/device-checks, as a GPU host would run it, with a budget that leaves room for
    the dist_allreduce benchmark steps only (60 s each): the longer steps say they were
    skipped, the benchmark's ratios are in the summary."""
    out = tmp_path / "checks"
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYBRIDPS_BIN_DIR", "HYBRIDPS_BUILD_DIR")}
    done = subprocess.run([str(bundle / "scripts" / "device-checks"), "--quick", "--budget",
                           "100", str(out)], capture_output=True, text=True, timeout=TIMEOUT,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (out / "SUMMARY.txt").read_text()
    for skipped in ("gpu_tests", "multiproc_gpu", "gpu_bench.1", "gpu_node_host.1",
                    "gpu_node_nccl.1", "local_bench", "local_bench_inline"):
        assert re.search(rf"^{re.escape(skipped)}: (skipped|not built)", summary, re.M), summary
    assert re.search(r"^allreduce_default\.1: exit 0 ", summary, re.M), summary
    ratios = re.search(r"^  allreduce_default\.1: (.*)$", summary, re.M)
    assert ratios and "1048576=" in ratios.group(1), summary
    assert "done after" in summary, summary


def test_refuses_a_non_empty_folder_and_a_missing_build(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    done = make(busy)
    assert done.returncode == 2 and "not empty" in done.stderr, done.stderr
    done = subprocess.run([str(BUNDLE), "--build-dir", str(tmp_path / "nowhere"),
                           str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 2 and "build first" in done.stderr, done.stderr
    done = subprocess.run([str(BUNDLE)], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2 and "usage" in done.stderr, done.stderr
