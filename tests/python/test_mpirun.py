"""mpirun (Debian's Open MPI) starting a whole job, and workers under mpirun whose count
disagrees with the job's.

The MPMD command of docs/deployment.md starts the scheduler, the servers and the workers
as app contexts; each process takes its role, rank and the counts from Open MPI's
variables. A rank that dies ends every process, and mpirun exits non-zero with the
failure named. Workers-only mpirun whose HYBRIDPS_NUM_WORKERS differs from -np say both
numbers.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from procs import pids_with  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR") or REPO / "build")
SCHEDULER = BUILD / "scheduler" / "hybridps-scheduler"
SERVER = BUILD / "server" / "hybridps-server"
WORKER = BUILD / "tests" / "multiproc" / "hybridps-test-worker"
TIMEOUT = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mpirun() -> list[str]:
    found = shutil.which("mpirun")
    assert found, "mpirun not found: scripts/install-deps.sh installs Debian's openmpi-bin"
    for binary in (SCHEDULER, SERVER, WORKER):
        assert os.access(binary, os.X_OK), f"not built: {binary}"
    # As root (CI) Open MPI needs --allow-run-as-root; a 2-core machine needs
    # --oversubscribe for 5 processes.
    return [found, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HYBRIDPS_", "OMPI_", "PMIX_"))}
    env.update(HYBRIDPS_SCHEDULER_ADDR="127.0.0.1", HYBRIDPS_SCHEDULER_PORT=str(free_port()),
               HYBRIDPS_JOB_TOKEN="mpirun-test-token", HYBRIDPS_TIMEOUT_MS="30000",
               HYBRIDPS_START_TIMEOUT_MS="60000")
    env.update(extra)
    return env


def exports(env: dict[str, str]) -> list[str]:
    """-x for every HYBRIDPS_* variable: what mpirun hands to every process."""
    return [arg for k in sorted(env) if k.startswith("HYBRIDPS_") for arg in ("-x", k)]


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # capture_output reads both streams to their end before returning.
    return subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd=BUILD)


def assert_nothing_left(port: str) -> None:
    """No process of this job survives mpirun (each carries its port in its environment)."""
    left = pids_with("HYBRIDPS_SCHEDULER_PORT", port)
    assert not left, f"processes left: {left}"


@pytest.mark.parametrize("store", ["dist_hybrid", "dist_allreduce"])
def test_mpirun_starts_the_whole_job(mpirun: list[str], store: str) -> None:
    env = job_env()
    servers = [":", "-np", "2", str(SERVER)] if store == "dist_hybrid" else []
    done = run([*mpirun, *exports(env), "-np", "1", str(SCHEDULER), *servers,
                ":", "-np", "2", str(WORKER), "--rounds", "5"], env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for rank in range(2):
        assert f"worker {rank}: all 5 rounds ok" in out, out
    assert len(re.findall(r"^round 4 ok$", done.stdout, re.M)) == 2, out
    registered = re.findall(r"all 2 workers and (\d) servers registered", out)
    assert registered == (["2"] if store == "dist_hybrid" else ["0"]), out
    assert_nothing_left(env["HYBRIDPS_SCHEDULER_PORT"])


def test_a_rank_that_dies_ends_the_job_named(mpirun: list[str]) -> None:
    env = job_env()
    done = run([*mpirun, *exports(env), "-np", "1", str(SCHEDULER), ":", "-np", "2",
                str(SERVER), ":", "-np", "2", str(WORKER), "--rounds", "50",
                "--sleep-ms", "20", "--die-rank", "1", "--die-round", "3"], env)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    # mpirun names the process by its rank; that process said at its start which worker
    # it is (worker 1: world rank 1 scheduler + 2 servers + 1 = 4).
    assert "mpirun noticed that process rank 4" in out, out
    assert re.search(r"joined the job as worker 1 of 2 .*\(mpirun rank 4\)$", out, re.M), out
    assert "worker 0: all 50 rounds ok" not in out, out
    assert_nothing_left(env["HYBRIDPS_SCHEDULER_PORT"])


def test_roles_out_of_order_are_named(mpirun: list[str]) -> None:
    env = job_env()
    done = run([*mpirun, *exports(env), "-np", "1", str(SERVER), ":", "-np", "1",
                str(SCHEDULER), ":", "-np", "1", str(WORKER)], env)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert ("this server is in mpirun's app context 0 of 3 (1 : 1 : 1 processes), the "
            "schedulers' place") in out, out
    assert_nothing_left(env["HYBRIDPS_SCHEDULER_PORT"])


def test_workers_under_mpirun_with_another_count_say_both(mpirun: list[str]) -> None:
    """The README's old mpirun block: the scheduler's count (HYBRIDPS_NUM_WORKERS=1, given
    to every process) against mpirun -np 2."""
    env = job_env(HYBRIDPS_NUM_WORKERS="1", HYBRIDPS_NUM_SERVERS="1")
    done = run([*mpirun, *exports(env), "-np", "2", str(WORKER)], env)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    for rank in range(2):
        assert (f"HYBRIDPS_NUM_WORKERS=1 (the job's worker count, which the scheduler and "
                f"the servers read too) but OMPI_COMM_WORLD_SIZE=2 (the workers the launcher "
                f"started; this one is OMPI_COMM_WORLD_RANK={rank})") in out, out
    assert_nothing_left(env["HYBRIDPS_SCHEDULER_PORT"])
