"""Multi-process tests: a real scheduler, servers and workers on loopback. How jobs are
started, watched and cleaned up: harness.py."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import (BACKENDS, BUILD, DETECTION_BOUND, DirectJob, FAILURE_BOUND, HIERARCHICAL,
                     HYBRID_ONE_NODE, JobEnv, LOGREG, ONE_NODE, RUN_TIMEOUT, TEST_WORKER,
                     assert_every_round_ok, assert_nothing_left, error_lines, find_process,
                     hybridrun, segment_prefix, worker_lines)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_workers_two_servers_exact_sums(job: JobEnv, backend: str) -> None:
    rounds = 5
    run = hybridrun(job, 2, 2, [str(TEST_WORKER), "--rounds", str(rounds)], backend)
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    assert "warning" not in err, err
    for rank in range(2):
        lines = worker_lines(out, rank)
        assert [line for line in lines if line.startswith("round ")] == [
            f"round {k} ok" for k in range(rounds)], out
        assert f"worker {rank}: all {rounds} rounds ok" in lines, out
    assert_nothing_left(job.marker)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spinning_loops_keep_exact_sums(job: JobEnv, backend: str) -> None:
    """HYBRIDPS_SPIN_US: the worker's I/O thread, the servers' loops and the waits poll for
    a while after activity instead of sleeping; results and the job's end are unchanged."""
    spun = JobEnv(job.marker, {**job.env, "HYBRIDPS_SPIN_US": "300"})
    rounds = 20
    run = hybridrun(spun, 2, 2, [str(TEST_WORKER), "--rounds", str(rounds)], backend)
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    for rank in range(2):
        assert f"worker {rank}: all {rounds} rounds ok" in worker_lines(out, rank), out
    assert_nothing_left(job.marker)


def cpu_share(allowed: list[int], rank: int, size: int) -> list[int]:
    """What common/affinity.h's CpuShare(CoresOf(allowed), ...) gives local rank `rank` of
    `size`: whole cores (sysfs topology) while there are enough, else one CPU each, every
    core's first hardware thread before any core's second."""
    def topology(cpu: int, what: str) -> str | None:
        try:
            return Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/{what}").read_text().strip()
        except OSError:
            return None
    by_id: dict[tuple[str, str], list[int]] = {}
    cores = []
    for cpu in allowed:
        package, core = topology(cpu, "physical_package_id"), topology(cpu, "core_id")
        if package is None or core is None:
            cores.append([cpu])
        else:
            by_id.setdefault((package, core), []).append(cpu)
    cores = sorted(cores + list(by_id.values()))
    if len(cores) >= size:
        per_rank = len(cores) // size
        return sorted(c for core in cores[rank * per_rank:(rank + 1) * per_rank] for c in core)
    widest = max(len(core) for core in cores)
    every = [core[t] for t in range(widest) for core in cores if t < len(core)]
    return [every[rank % len(every)]]


def cpu_list(cpus: list[int]) -> str:
    """taskset's notation, as common/affinity.h's CpuList writes it."""
    runs: list[list[int]] = []
    for c in cpus:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bind_to_core_gives_each_worker_its_share_of_the_cpus(job: JobEnv,
                                                              backend: str) -> None:
    """hybridrun --bind-to core: each worker (local rank r of 3 here) binds itself to its
    share of the CPUs hybridrun may use and says which mask it then has (read back from
    the kernel), and the job's sums stay exact."""
    allowed = sorted(os.sched_getaffinity(0))
    run = hybridrun(job, 3, 2, [str(TEST_WORKER), "--rounds", "3"], backend,
                    options=("--bind-to", "core"))
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    for rank in range(3):
        assert f"worker {rank}: all 3 rounds ok" in worker_lines(out, rank), out
        said = (f"local rank {rank} of 3 bound to CPUs "
                f"{cpu_list(cpu_share(allowed, rank, 3))} (HYBRIDPS_BIND_TO=core)")
        assert said in out + err, f"worker {rank} should say {said!r}:\n{out}\n{err}"
    assert_nothing_left(job.marker)


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_worker_stops_the_job(job: JobEnv, backend: str) -> None:
    # The pause after each round lets the others print "round 1 ok" before worker 1 dies
    # (hybridrun then stops them at once).
    run = hybridrun(job, 3, 2, [str(TEST_WORKER), "--rounds", "200", "--sleep-ms", "300",
                                "--die-rank", "1", "--die-round", "2", "--expect-failure"],
                    backend, options=("--verbose",))
    run.err.wait_for(r"scheduler listens on port \d+", RUN_TIMEOUT)
    port = int(re.search(r"scheduler listens on port (\d+)", run.err.text()).group(1))
    run.out.wait_for(r"^\[worker 0\] round 1 ok$", RUN_TIMEOUT)
    # hybridrun makes the three workers one node: with dist_hybrid they reduce in shared
    # memory, and the killed rank leaves the node's segments for hybridrun to remove.
    token = re.search(r"HYBRIDPS_JOB_TOKEN=(\S+)", run.err.text()).group(1)
    mine = segment_prefix(port, token, 0).rsplit("-n", 1)[0] + "-n"
    in_use = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
    assert bool(in_use) == (backend == "dist_hybrid"), in_use
    died = run.out.wait_for(r"^\[worker 1\] worker 1: dying at round 2$", RUN_TIMEOUT)
    code, out, err, ended = run.finish(FAILURE_BOUND)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
    assert not left, f"hybridrun left the job's shared memory: {left}\n{err}"
    assert ended - died < FAILURE_BOUND
    assert code == 128 + signal.SIGKILL, f"{out}\n{err}"
    assert re.search(r"worker 1 .*(SIGKILL|signal 9)", err), err
    for rank in (0, 2):
        lines = worker_lines(out, rank)
        assert "round 1 ok" in lines, out
        # Round 2 cannot complete without worker 1.
        assert "round 2 ok" not in lines, out
    assert_nothing_left(job.marker)


def test_killed_hybridrun_ends_its_job(job: JobEnv) -> None:
    """hybridrun killed with SIGKILL cannot stop its job itself: its watchdog ends the
    job's processes and removes the node's shared memory, so nothing runs on or stays."""
    run = hybridrun(job, 2, 1, [str(TEST_WORKER), "--rounds", "100000", "--sleep-ms", "20",
                                "--expect-failure"], options=("--verbose",))
    run.err.wait_for(r"scheduler listens on port \d+", RUN_TIMEOUT)
    port = int(re.search(r"scheduler listens on port (\d+)", run.err.text()).group(1))
    token = re.search(r"HYBRIDPS_JOB_TOKEN=(\S+)", run.err.text()).group(1)
    run.out.wait_for(r"^\[worker 0\] round 1 ok$", RUN_TIMEOUT)
    mine = segment_prefix(port, token, 0).rsplit("-n", 1)[0] + "-n"
    assert [n for n in os.listdir("/dev/shm") if n.startswith(mine)]  # the node's, in use
    os.kill(run.proc.pid, signal.SIGKILL)
    run.finish(FAILURE_BOUND)  # and the output of everything that held its pipes
    assert_nothing_left(job.marker, timeout=FAILURE_BOUND)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
    assert not left, f"the job's shared memory outlived hybridrun: {left}"
    assert "its watchdog stopped the job's local processes" in run.err.text(), run.err.text()


def test_killed_server_stops_the_job(job: JobEnv) -> None:
    run = hybridrun(job, 2, 2, [str(TEST_WORKER), "--rounds", "400", "--sleep-ms", "20",
                                "--expect-failure"])
    run.out.wait_for(r"^\[worker 0\] round 3 ok$", RUN_TIMEOUT)
    os.kill(find_process(job.marker, "server", 1), signal.SIGKILL)
    killed = time.monotonic()
    code, out, err, ended = run.finish(FAILURE_BOUND)
    assert ended - killed < FAILURE_BOUND
    assert code != 0, f"{out}\n{err}"
    worker_errors = error_lines(worker_lines(out, 0) + worker_lines(out, 1))
    assert "server 1" in err or any("server 1" in e for e in worker_errors), f"{out}\n{err}"
    assert_nothing_left(job.marker)


@pytest.mark.parametrize("backend", [*BACKENDS, ONE_NODE, HIERARCHICAL])
def test_survivors_name_the_killed_worker(job: JobEnv, tmp_path: Path,
                                          direct: list[DirectJob], backend: str) -> None:
    j = DirectJob(job, tmp_path, workers=3, servers=2 if backend == "dist_hybrid" else 0,
                  worker_args=["--rounds", "200", "--sleep-ms", "20", "--die-rank", "1",
                               "--die-round", "2", "--expect-failure"], backend=backend)
    direct.append(j)
    assert j.wait("worker 1", RUN_TIMEOUT) == -signal.SIGKILL, j.text()
    died = j.exited["worker 1"]
    if backend in (ONE_NODE, HIERARCHICAL):  # the survivors waited in shared memory
        said = "CPU allreduces " + ("in shared memory" if backend == ONE_NODE
                                    else "hierarchical")
        assert any(said in line for line in j.lines("worker 0")), j.text()
    codes = j.wait_all(RUN_TIMEOUT)  # the job must end by itself
    for rank in (0, 2):
        label = f"worker {rank}"
        assert codes[label] == 3, j.text()
        assert j.exited[label] - died < DETECTION_BOUND, j.text()
        errors = error_lines(j.lines(label))
        assert len(errors) == 1 and "worker 1" in errors[0], j.text()
        assert "round 2 ok" not in j.lines(label), j.text()
    assert codes["scheduler"] == 1, j.text()
    for label in (label for label in codes if label.startswith("server")):
        assert codes[label] == 1, j.text()  # the surviving servers of a failed job fail too
    assert any(re.search(r"worker 1 .*died", line) for line in j.lines("scheduler")), j.text()
    assert max(j.exited.values()) - died < 2 * DETECTION_BOUND, j.text()
    assert_nothing_left(job.marker)


@pytest.mark.parametrize("backend", [*BACKENDS, ONE_NODE, HYBRID_ONE_NODE])
def test_survivors_name_a_worker_that_left_early(job: JobEnv, tmp_path: Path,
                                                 direct: list[DirectJob], backend: str) -> None:
    """Worker 1 runs fewer rounds than the others (a smaller data shard) and exits in
    order: the others fail at once, naming it, instead of at their operation timeout."""
    servers = 2 if backend in ("dist_hybrid", HYBRID_ONE_NODE) else 0
    j = DirectJob(job, tmp_path, workers=3, servers=servers,
                  worker_args=["--rounds", "200", "--sleep-ms", "20", "--leave-rank", "1",
                               "--leave-round", "2", "--expect-failure"], backend=backend)
    direct.append(j)
    assert j.wait("worker 1", RUN_TIMEOUT) == 0, j.text()
    left = j.exited["worker 1"]
    codes = j.wait_all(RUN_TIMEOUT)
    for rank in (0, 2):
        label = f"worker {rank}"
        assert codes[label] == 3, j.text()
        assert j.exited[label] - left < DETECTION_BOUND, j.text()
        errors = error_lines(j.lines(label))
        assert len(errors) == 1, j.text()
        assert re.search(r"(worker|rank) 1\b.*left the job", errors[0]), j.text()
        assert "round 1 ok" in j.lines(label) and "round 2 ok" not in j.lines(label), j.text()
    assert_nothing_left(job.marker)


@pytest.mark.parametrize("backend,victim", [("dist_hybrid", "worker 1"),
                                            ("dist_allreduce", "worker 1"),
                                            (ONE_NODE, "worker 1"),
                                            (HIERARCHICAL, "worker 1"),
                                            (HIERARCHICAL, "worker 2"),
                                            ("dist_hybrid", "server 1")])
def test_survivors_name_a_hung_peer(job: JobEnv, tmp_path: Path, direct: list[DirectJob],
                                    backend: str, victim: str) -> None:
    # A process that hangs (here: stopped) is alive to the kernel, so no socket closes;
    # its missing heartbeats must still end the job, naming it, instead of a silent wait
    # (with dist_allreduce the survivors are blocked inside a Gloo collective on it).
    j = DirectJob(job, tmp_path, workers=3, servers=2 if backend == "dist_hybrid" else 0,
                  worker_args=["--rounds", "100000", "--sleep-ms", "20", "--expect-failure"],
                  backend=backend)
    direct.append(j)
    j.output["worker 0"].wait_for(r"^round 3 ok$", RUN_TIMEOUT)
    os.killpg(j.procs[victim].pid, signal.SIGSTOP)
    stopped = time.monotonic()
    for label in (f"worker {r}" for r in range(3)):
        if label == victim:
            continue
        assert j.wait(label, RUN_TIMEOUT) == 3, j.text()
        assert j.exited[label] - stopped < DETECTION_BOUND + 1.0, j.text()
        errors = error_lines(j.lines(label))
        assert len(errors) == 1 and victim in errors[0], j.text()
    assert j.wait("scheduler", RUN_TIMEOUT) == 1, j.text()
    assert any(re.search(rf"{victim} .*(died|no heartbeat)", line)
               for line in j.lines("scheduler")), j.text()


def test_survivors_name_the_killed_server(job: JobEnv, tmp_path: Path,
                                          direct: list[DirectJob]) -> None:
    j = DirectJob(job, tmp_path, workers=2, servers=2,
                  worker_args=["--rounds", "400", "--sleep-ms", "20", "--expect-failure"])
    direct.append(j)
    j.output["worker 0"].wait_for(r"^round 3 ok$", RUN_TIMEOUT)
    os.kill(j.procs["server 1"].pid, signal.SIGKILL)
    killed = time.monotonic()
    codes = j.wait_all(RUN_TIMEOUT)  # the job must end by itself
    for rank in (0, 1):
        label = f"worker {rank}"
        assert codes[label] == 3, j.text()
        assert j.exited[label] - killed < DETECTION_BOUND, j.text()
        errors = error_lines(j.lines(label))
        assert len(errors) == 1 and "server 1" in errors[0], j.text()
    assert codes["server 1"] == -signal.SIGKILL
    assert codes["server 0"] == 1, j.text()  # a failed job's surviving server fails too
    assert codes["scheduler"] == 1, j.text()
    assert any(re.search(r"server 1 .*died", line) for line in j.lines("scheduler")), j.text()
    assert max(j.exited.values()) - killed < 2 * DETECTION_BOUND, j.text()
    assert_nothing_left(job.marker)


@pytest.mark.parametrize("backend", [*BACKENDS, ONE_NODE])
def test_killed_scheduler_fails_every_process(job: JobEnv, tmp_path: Path,
                                              direct: list[DirectJob], backend: str) -> None:
    # The scheduler is the job's control plane: without it there are no barriers, no
    # failure reports and no orderly end, so every process must stop, naming it, within
    # the heartbeat timeout (5 s) instead of running on or hanging at the end.
    servers = 2 if backend == "dist_hybrid" else 0
    j = DirectJob(job, tmp_path, workers=2, servers=servers,
                  worker_args=["--rounds", "100000", "--sleep-ms", "20", "--expect-failure"],
                  backend=backend)
    direct.append(j)
    j.output["worker 0"].wait_for(r"^round 3 ok$", RUN_TIMEOUT)
    os.kill(j.procs["scheduler"].pid, signal.SIGKILL)
    killed = time.monotonic()
    codes = j.wait_all(RUN_TIMEOUT)  # the job must end by itself
    assert codes["scheduler"] == -signal.SIGKILL
    for rank in (0, 1):
        label = f"worker {rank}"
        assert codes[label] == 3, j.text()
        assert j.exited[label] - killed < DETECTION_BOUND, j.text()
        errors = error_lines(j.lines(label))
        assert len(errors) == 1 and "scheduler" in errors[0], j.text()
    for i in range(servers):
        label = f"server {i}"
        assert codes[label] != 0, j.text()
        assert j.exited[label] - killed < DETECTION_BOUND, j.text()
        assert any("scheduler" in line for line in j.lines(label)), j.text()
    assert_nothing_left(job.marker)


def test_logistic_regression_demo(job: JobEnv) -> None:
    run = hybridrun(job, 2, 2, [str(LOGREG)])
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    assert re.search(r"^\[worker 0\] final loss \d", out, re.MULTILINE), out
    assert_nothing_left(job.marker)


# ---- nodes of several local ranks --------------------------------------------------------


def two_nodes_of_two(rank: int) -> dict[str, str]:
    """Workers 0,1 and 2,3: two nodes of two local ranks on this host."""
    return {"HYBRIDPS_LOCAL_RANK": str(rank % 2), "HYBRIDPS_LOCAL_SIZE": "2",
            "HYBRIDPS_NODE_ID": f"node{rank // 2}"}


def test_local_ranks_exact_sums_and_no_shared_memory_left(job: JobEnv, tmp_path: Path,
                                                          direct: list[DirectJob]) -> None:
    prefixes: list[str] = []

    def plant_stale(port: int) -> None:  # as if an earlier job on this port had crashed
        for node in (0, 1):
            prefixes.append(segment_prefix(port, job.marker, node))
            Path("/dev/shm", prefixes[-1] + "00000000deadbeef").write_bytes(b"stale")

    j = DirectJob(job, tmp_path, workers=4, servers=2, worker_args=["--rounds", "5"],
                  worker_env=two_nodes_of_two, before_workers=plant_stale)
    direct.append(j)
    assert_every_round_ok(j, workers=4, rounds=5)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(tuple(prefixes))]
    assert not left, left
    assert_nothing_left(job.marker)


def test_a_process_of_another_job_is_refused(job: JobEnv, tmp_path: Path,
                                            direct: list[DirectJob]) -> None:
    """A worker started with another job's HYBRIDPS_JOB_TOKEN (a stale process, a second
    launch on the same port) that reaches this job's scheduler first is refused at the
    handshake: it exits with an error naming the token, takes no rank, and the job itself
    runs."""
    stray: list[subprocess.CompletedProcess[str]] = []

    def start_stray(port: int) -> None:
        env = {**job.env, "HYBRIDPS_SCHEDULER_ADDR": "127.0.0.1",
               "HYBRIDPS_SCHEDULER_PORT": str(port), "HYBRIDPS_NUM_WORKERS": "2",
               "HYBRIDPS_NUM_SERVERS": "1", "HYBRIDPS_JOB_TOKEN": "another-job",
               "HYBRIDPS_BACKEND": "dist_hybrid", "HYBRIDPS_ROLE": "worker",
               "HYBRIDPS_RANK": "0"}
        stray.append(subprocess.run([str(TEST_WORKER), "--rounds", "3"], env=env,
                                    stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    errors="replace", timeout=RUN_TIMEOUT))

    j = DirectJob(job, tmp_path, workers=2, servers=1, worker_args=["--rounds", "3"],
                  before_workers=start_stray)
    direct.append(j)
    out = stray[0].stdout + stray[0].stderr
    assert stray[0].returncode != 0, out
    assert "does not hold this job's token: HYBRIDPS_JOB_TOKEN" in out, out
    assert "round 0 ok" not in out, out
    assert_every_round_ok(j, workers=2, rounds=3)
    registered = [line for line in j.lines("scheduler") if "registered from" in line]
    assert len(registered) == 3, j.text()  # the job's 2 workers and its server only
    assert_nothing_left(job.marker)


def test_a_server_of_another_version_fails_the_job_at_start(job: JobEnv,
                                                          tmp_path: Path) -> None:
    """A job whose server is of another hybridps version than its scheduler and workers
    (here a copy of the built server with the version after its tag patched, as a second
    build would be) fails at its start, every message naming both versions."""
    ours = subprocess.run([str(BUILD / "server" / "hybridps-server"), "--version"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          stdin=subprocess.DEVNULL).stdout.split()[-1]
    other = str((int(ours[0]) + 1) % 10) + ours[1:]  # same length, another version
    tag = b"hybridps-version="
    binary = (BUILD / "server" / "hybridps-server").read_bytes()
    assert binary.count(tag + ours.encode() + b"\0") == 1, "the version tag is not unique"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hybridps-server").write_bytes(
        binary.replace(tag + ours.encode() + b"\0", tag + other.encode() + b"\0"))
    (bin_dir / "hybridps-server").chmod(0o755)
    (bin_dir / "hybridps-scheduler").symlink_to(BUILD / "scheduler" / "hybridps-scheduler")
    done = subprocess.run([str(bin_dir / "hybridps-server"), "--version"], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    assert done.stdout == f"hybridps-server {other}\n", done.stdout
    run = hybridrun(job, 1, 1, [str(TEST_WORKER), "--rounds", "3"],
                    options=("--bin-dir", str(bin_dir)))
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code != 0, f"{out}\n{err}"
    assert (f"hybridps versions differ: the scheduler runs {ours}, the connecting server runs "
            f"{other}; every process of a job must run the same version") in out + err, out + err
    assert "round 0 ok" not in out, out
    assert_nothing_left(job.marker)


def test_workers_with_other_settings_fail_the_job_at_start(job: JobEnv, tmp_path: Path,
                                                          direct: list[DirectJob]) -> None:
    """Workers started with different HYBRIDPS_PARTITION_BYTES (a per-rank environment
    gone wrong) would cut tensors differently and hang in their first round. The scheduler
    compares the settings at registration: every process exits non-zero at once, naming
    the setting and both values, long before the start timeout."""
    slow_start = {"HYBRIDPS_START_TIMEOUT_MS": "3600000"}  # only the refusal can end it
    j = DirectJob(job, tmp_path, workers=2, servers=1, worker_args=["--rounds", "3"],
                  worker_env=lambda rank: {**slow_start, **(
                      {"HYBRIDPS_PARTITION_BYTES": "1048576"} if rank == 1 else {})})
    direct.append(j)
    codes = j.wait_all(RUN_TIMEOUT)
    assert all(code != 0 for code in codes.values()), (codes, j.text())
    for worker in ("worker 0", "worker 1"):
        out = "\n".join(j.lines(worker))
        assert "HYBRIDPS_PARTITION_BYTES=" in out, j.text()
        assert "1048576" in out and job.env["HYBRIDPS_PARTITION_BYTES"] in out, j.text()
        assert "round 0 ok" not in out, j.text()
    assert any("the job cannot start" in line for line in j.lines("scheduler")), j.text()
    assert_nothing_left(job.marker)


def non_loopback_address() -> str:
    """An IPv4 address of this machine other than loopback (the one its default route
    leaves from); the test fails if the machine has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("240.0.0.1", 9))  # no packet is sent: this only picks the route
        addr = s.getsockname()[0]
    assert not addr.startswith("127."), f"this machine has no address but loopback ({addr})"
    return addr


def test_allreduce_workers_on_hosts_that_cannot_reach_each_other_fail_at_start(
        job: JobEnv, tmp_path: Path, direct: list[DirectJob]) -> None:
    """A dist_allreduce job across hosts (the scheduler not on loopback) whose workers
    would give Gloo an address the others cannot reach: worker 1's host name (in a UTS
    namespace of its own) resolves to nothing, worker 0's to loopback while worker 1 is on
    another host. Each fails at once, naming the host name and HYBRIDPS_INTERFACE,
    instead of hanging until the start timeout (or Gloo crashing on the name). Needs
    root (a UTS namespace) and a host-name lookup that does not resolve any current host
    name (Debian's: files, then DNS)."""
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"this test needs `unshare --uts` (root): {probe.stderr.strip()}")
    slow_start = {"HYBRIDPS_START_TIMEOUT_MS": "3600000"}  # only the refusal can end it
    j = DirectJob(job, tmp_path, workers=2, servers=0, worker_args=["--rounds", "1"],
                  backend="dist_allreduce", scheduler_addr=non_loopback_address(),
                  worker_env=lambda rank: slow_start,
                  worker_wrap=lambda rank: [] if rank == 0 else [
                      "unshare", "--uts", "sh", "-c",
                      'hostname hps-unresolvable-host && exec "$@"', "sh"])
    direct.append(j)
    codes = j.wait_all(RUN_TIMEOUT)
    assert codes["worker 0"] != 0 and codes["worker 1"] != 0, (codes, j.text())
    zero = "\n".join(j.lines("worker 0"))
    one = "\n".join(j.lines("worker 1"))
    assert "'hps-unresolvable-host' does not resolve" in one, j.text()
    assert "HYBRIDPS_INTERFACE" in one, j.text()
    if "resolves to the loopback address" in zero:  # this host's name is a loopback one
        assert "worker 1 on host hps-unresolvable-host cannot reach" in zero, j.text()
    assert "round 0 ok" not in zero + one, j.text()
    assert_nothing_left(job.marker)


def test_killed_local_rank_fails_its_node_peers(job: JobEnv, tmp_path: Path,
                                                direct: list[DirectJob]) -> None:
    j = DirectJob(job, tmp_path, workers=4, servers=1,
                  worker_args=["--rounds", "200", "--sleep-ms", "20", "--die-rank", "1",
                               "--die-round", "2", "--expect-failure"],
                  worker_env=two_nodes_of_two)
    direct.append(j)
    assert j.wait("worker 1", RUN_TIMEOUT) == -signal.SIGKILL, j.text()
    died = j.exited["worker 1"]
    codes = j.wait_all(RUN_TIMEOUT)  # no hang in the node's shared memory
    for rank in (0, 2, 3):
        label = f"worker {rank}"
        assert codes[label] == 3, j.text()
        assert j.exited[label] - died < DETECTION_BOUND, j.text()
        errors = error_lines(j.lines(label))
        assert len(errors) == 1 and "worker 1" in errors[0], j.text()
    assert_nothing_left(job.marker)


# ---- GPU tensors (dist_allreduce on NCCL) -------------------------------------------------
# Run as their own CTest test (label gpu, `-k gpu`); skipped without a GPU. With one GPU
# both worker processes use it (--shared-gpu: a distinct NCCL_HOSTID per process, so NCCL
# connects them over its socket transport instead of refusing two ranks on one GPU).


def visible_gpus() -> int:
    out = subprocess.run([str(TEST_WORKER), "--count-gpus"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    match = re.fullmatch(r"gpus (\d+)\n", out)
    assert match, out
    return int(match.group(1))


def nccl_gpu_args(ranks: int) -> list[str]:
    """--gpu, plus --shared-gpu where fewer GPUs than `ranks` are visible; skips without."""
    gpus = visible_gpus()
    if gpus < 1:
        pytest.skip(f"needs a GPU, CUDA reports {gpus}: not run")
    return ["--gpu"] + (["--shared-gpu"] if gpus < ranks else [])


def test_gpu_two_workers_exact_sums(job: JobEnv) -> None:
    rounds = 5
    run = hybridrun(job, 2, 0, [str(TEST_WORKER), *nccl_gpu_args(2), "--rounds", str(rounds)],
                    "dist_allreduce")
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    for rank in range(2):
        assert f"worker {rank}: all {rounds} rounds ok" in worker_lines(out, rank), out
    assert_nothing_left(job.marker)


def test_gpu_survivor_names_the_killed_worker(job: JobEnv, tmp_path: Path,
                                              direct: list[DirectJob]) -> None:
    j = DirectJob(job, tmp_path, workers=2, servers=0,
                  worker_args=[*nccl_gpu_args(2), "--rounds", "200", "--sleep-ms", "20",
                               "--die-rank", "1", "--die-round", "2", "--expect-failure"],
                  backend="dist_allreduce")
    direct.append(j)
    assert j.wait("worker 1", RUN_TIMEOUT) == -signal.SIGKILL, j.text()
    died = j.exited["worker 1"]
    codes = j.wait_all(RUN_TIMEOUT)  # nothing stays stuck in NCCL
    assert codes["worker 0"] == 3, j.text()
    assert j.exited["worker 0"] - died < DETECTION_BOUND, j.text()
    errors = error_lines(j.lines("worker 0"))
    assert len(errors) == 1 and "worker 1" in errors[0], j.text()
    assert_nothing_left(job.marker)


# ---- GPU tensors with dist_hybrid (host staging) ------------------------------------------
# Every worker process on GPU 0 (`rank % devices`): staging involves no NCCL, so one GPU
# runs them all. Part of the CTest test multiproc_gpu (label gpu); skipped without a GPU.


def test_gpu_hybrid_one_node_of_three_local_ranks(job: JobEnv) -> None:
    gpus = visible_gpus()
    if gpus < 1:
        pytest.skip(f"needs a GPU, CUDA reports {gpus}: not run")
    rounds = 5
    # hybridrun on one host: the 3 workers form one node and reduce in shared memory.
    run = hybridrun(job, 3, 2, [str(TEST_WORKER), "--gpu", "--rounds", str(rounds)])
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    for rank in range(3):
        assert f"worker {rank}: all {rounds} rounds ok" in worker_lines(out, rank), out
    assert_nothing_left(job.marker)


@pytest.mark.parametrize("local", [1, 2])
def test_gpu_hybrid_nodes_of_local_ranks(job: JobEnv, tmp_path: Path,
                                         direct: list[DirectJob], local: int) -> None:
    gpus = visible_gpus()
    if gpus < 1:
        pytest.skip(f"needs a GPU, CUDA reports {gpus}: not run")

    def nodes(rank: int) -> dict[str, str]:  # 4 workers: nodes of `local` local ranks
        return {"HYBRIDPS_LOCAL_RANK": str(rank % local), "HYBRIDPS_LOCAL_SIZE": str(local),
                "HYBRIDPS_NODE_ID": f"node{rank // local}"}

    j = DirectJob(job, tmp_path, workers=4, servers=2, worker_args=["--gpu", "--rounds", "5"],
                  worker_env=nodes)
    direct.append(j)
    assert_every_round_ok(j, workers=4, rounds=5)
    assert_nothing_left(job.marker)


# ---- dist_hybrid, the node's GPUs reducing with NCCL (HYBRIDPS_GPU_LOCAL_REDUCE=nccl) -------
# A node's local ranks are NCCL ranks: on a one-GPU machine --shared-gpu gives each process
# its own NCCL_HOSTID, so that NCCL takes them for ranks of different hosts on one GPU.


def nccl_nodes(local: int) -> Callable[[int], dict[str, str]]:
    """Worker environment: nodes of `local` local ranks reducing with NCCL."""
    def env(rank: int) -> dict[str, str]:
        return {"HYBRIDPS_LOCAL_RANK": str(rank % local), "HYBRIDPS_LOCAL_SIZE": str(local),
                "HYBRIDPS_NODE_ID": f"node{rank // local}", "HYBRIDPS_GPU_LOCAL_REDUCE": "nccl"}
    return env


@pytest.mark.parametrize("local", [2, 3])
def test_gpu_hybrid_nccl_node_reduction(job: JobEnv, tmp_path: Path,
                                        direct: list[DirectJob], local: int) -> None:
    workers = 2 * local
    j = DirectJob(job, tmp_path, workers=workers, servers=2,
                  worker_args=[*nccl_gpu_args(local), "--rounds", "5"],
                  worker_env=nccl_nodes(local))
    direct.append(j)
    assert_every_round_ok(j, workers=workers, rounds=5)
    assert_nothing_left(job.marker)


def test_gpu_hybrid_nccl_ranks_sharing_a_gpu_are_told(job: JobEnv, tmp_path: Path,
                                                     direct: list[DirectJob]) -> None:
    """Local ranks on one GPU with HYBRIDPS_GPU_LOCAL_REDUCE=nccl (no NCCL_HOSTID): every
    rank fails at its first GPU push_pull with an error that says so, not NCCL's."""
    if visible_gpus() < 1:
        pytest.skip("needs a GPU: not run")
    j = DirectJob(job, tmp_path, workers=2, servers=1,
                  worker_args=["--gpu", "--same-gpu", "--rounds", "1", "--expect-failure"],
                  worker_env=nccl_nodes(2))
    direct.append(j)
    codes = j.wait_all(RUN_TIMEOUT)
    for rank in range(2):
        assert codes[f"worker {rank}"] == 3, j.text()
        errors = error_lines(j.lines(f"worker {rank}"))
        assert errors and "local ranks 0 and 1 of this node both put their tensors on the GPU" \
            in errors[0], j.text()
    assert_nothing_left(job.marker)


def test_gpu_hybrid_nccl_node_survivor_names_the_killed_local_rank(
        job: JobEnv, tmp_path: Path, direct: list[DirectJob]) -> None:
    j = DirectJob(job, tmp_path, workers=2, servers=1,
                  worker_args=[*nccl_gpu_args(2), "--rounds", "200", "--sleep-ms", "20",
                               "--die-rank", "1", "--die-round", "2", "--expect-failure"],
                  worker_env=nccl_nodes(2))
    direct.append(j)
    assert j.wait("worker 1", RUN_TIMEOUT) == -signal.SIGKILL, j.text()
    died = j.exited["worker 1"]
    codes = j.wait_all(RUN_TIMEOUT)  # nothing stays stuck in NCCL or the node's rounds
    assert codes["worker 0"] == 3, j.text()
    assert j.exited["worker 0"] - died < DETECTION_BOUND, j.text()
    errors = error_lines(j.lines("worker 0"))
    assert errors and "worker 1" in errors[0], j.text()
    assert_nothing_left(job.marker)


# ---- what crosses the wire ------------------------------------------------------------------

class LoopbackCapture:
    """Every byte of every packet on the loopback interface while it runs (a raw packet
    socket: root)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)
        self.chunks: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.chunks.append(self.sock.recv(1 << 17))
            except OSError:
                continue

    def finish(self) -> bytes:
        self.stop.set()
        self.thread.join()
        self.sock.close()
        return b"".join(self.chunks)


@pytest.mark.parametrize("encrypt", ["0", "1"])
def test_what_the_wire_shows(job: JobEnv, encrypt: str) -> None:
    """The job token never crosses the wire; tensor names and values do in clear unless
    HYBRIDPS_ENCRYPT=1, with which nothing of them can be read on the loopback."""
    if os.geteuid() != 0:
        pytest.fail("capturing the loopback needs root (a raw packet socket); CI runs as root")
    token = f"tok{uuid.uuid4().hex}"
    prefix = f"clear{uuid.uuid4().hex[:12]}."
    job.env.update(HYBRIDPS_JOB_TOKEN=token, HYBRIDPS_ENCRYPT=encrypt)
    capture = LoopbackCapture()
    try:
        run = hybridrun(job, 2, 2, [str(TEST_WORKER), "--rounds", "2", "--name-prefix", prefix])
        code, out, err, _ = run.finish(RUN_TIMEOUT)
    finally:
        wire = capture.finish()
    assert code == 0, f"{out}\n{err}"
    assert "all 2 rounds ok" in "\n".join(worker_lines(out, 0)), out
    assert len(wire) > 100_000, len(wire)  # the job's traffic was captured
    assert token.encode() not in wire
    assert (prefix.encode() in wire) == (encrypt == "0")
    assert_nothing_left(job.marker)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_strangers_get_nothing_and_cost_nothing(job: JobEnv, tmp_path: Path,
                                                direct: list[DirectJob]) -> None:
    """A process without the token floods a running job's scheduler and server (Hellos,
    forged Auths, 64 KiB pushes at round 2^62, key-value sets): nothing is accepted, the
    scheduler's and the server's memory stay put, their logs say so once a second at most,
    and the job's sums stay exact."""
    stranger = TEST_WORKER.parent / "hybridps-test-stranger"
    rounds = 600
    j = DirectJob(job, tmp_path, workers=2, servers=1,
                  worker_args=["--rounds", str(rounds), "--sleep-ms", "20"])
    direct.append(j)
    j.output["worker 0"].wait_for(r"^round 1 ok$", RUN_TIMEOUT)
    j.output["server 0"].wait_for(r"serving on tcp://", RUN_TIMEOUT)
    server = next(m.group(1) for line in j.lines("server 0")
                  if (m := re.search(r"serving on (tcp://\S+)", line)))
    before = {label: rss_kib(j.procs[label].pid) for label in ("scheduler", "server 0")}
    started = time.monotonic()
    for endpoint in (f"tcp://127.0.0.1:{j.port}", server):
        done = subprocess.run([str(stranger), endpoint, "500"], capture_output=True,
                              text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{endpoint}: {done.stdout}{done.stderr}"
        assert "2000 messages, 2000 replies, 0 accepted" in done.stdout, done.stdout
    flood_s = time.monotonic() - started
    after = {label: rss_kib(j.procs[label].pid) for label in before}
    assert j.procs["worker 0"].poll() is None, "the job ended before the flood did"
    assert_every_round_ok(j, workers=2, rounds=rounds)
    for label in before:
        assert after[label] - before[label] < 8 * 1024, (label, before, after)
        refusals = [line for line in j.lines(label) if "refused" in line or "rejected" in line]
        assert len(refusals) <= 3 * (flood_s + 2), (label, len(refusals), flood_s)
    assert_nothing_left(job.marker)
