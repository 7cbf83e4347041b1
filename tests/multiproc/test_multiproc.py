"""Multi-process tests: a real scheduler, servers and workers on loopback.

Jobs run through scripts/hybridrun, with hybridps-test-worker (test_worker.cc) as the
worker: it checks exact sums every round and prints "round K ok". hybridrun stops the
whole job as soon as one process dies, before the survivors could notice the death
themselves; so the tests of what the survivors report start the processes directly
(DirectJob) and let the job end by itself.

Every process of a job carries HYBRIDPS_TEST_MARKER=<unique id> in its environment; the
tests find a job's processes (and prove none is left) by scanning /proc for it.

Binaries come from $HYBRIDPS_BUILD_DIR (CTest sets it), else <repo>/build.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HYBRIDRUN = REPO / "scripts" / "hybridrun"
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR") or REPO / "build")
TEST_WORKER = BUILD / "tests" / "multiproc" / "hybridps-test-worker"
SCHEDULER = BUILD / "scheduler" / "hybridps-scheduler"
SERVER = BUILD / "server" / "hybridps-server"
LOGREG = BUILD / "examples" / "hybridps-train-logreg"

MARKER_VAR = "HYBRIDPS_TEST_MARKER"
RUN_TIMEOUT = 30.0    # s: the most any one job may take
FAILURE_BOUND = 20.0  # s: from a death to hybridrun's exit
# s: from a death to the survivors' error. The heartbeat timeout is 1 s (below); the
# operation deadline (30 s) must not be what ends them.
DETECTION_BOUND = 6.0
ERROR_PREFIX = "hybridps-test-worker: error: "

# Fast failure detection; small partitions so the test tensors span every server.
JOB_ENV = {
    "HYBRIDPS_HEARTBEAT_INTERVAL_MS": "100",
    "HYBRIDPS_HEARTBEAT_TIMEOUT_MS": "1000",
    "HYBRIDPS_PARTITION_BYTES": "4096",
    "HYBRIDPS_TIMEOUT_MS": "30000",
    "HYBRIDPS_START_TIMEOUT_MS": "20000",
}


# ---- finding a job's processes ---------------------------------------------------------

def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def job_processes(marker: str) -> dict[int, dict[str, str]]:
    """Live (not zombie) processes whose environment has this job's marker: pid -> the
    HYBRIDPS_* variables it started with."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            items = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle not in items or _state(int(entry)) in (None, "Z", "X"):
            continue
        env = {}
        for item in items:
            key, sep, value = item.decode(errors="replace").partition("=")
            if sep and key.startswith("HYBRIDPS_"):
                env[key] = value
        found[int(entry)] = env
    return found


def find_process(marker: str, role: str, rank: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, env in job_processes(marker).items():
            if env.get("HYBRIDPS_ROLE") == role and env.get("HYBRIDPS_RANK") == str(rank):
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no {role} {rank} among {job_processes(marker)}")


def assert_nothing_left(marker: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while job_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = job_processes(marker)
    assert not left, f"processes of the job are still running: {left}"


def kill_leftovers(marker: str) -> None:
    for pid in job_processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ---- output ------------------------------------------------------------------------------

class Lines:
    """The lines a stream produced, collected by a thread, each with its arrival time."""

    def __init__(self, stream) -> None:  # noqa: ANN001 (a text pipe)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # noqa: ANN001
        for line in stream:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()
        stream.close()

    def wait_for(self, pattern: str, timeout: float) -> float:
        """Waits for a line matching ``pattern``; returns when it came."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for when, line in self.lines:
                    if regex.search(line):
                        return when
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    raise AssertionError(f"no line matching {pattern!r} in:\n{self.text()}")
                self._cond.wait(min(left, 0.1))

    def join(self, timeout: float) -> None:
        """Waits until the stream ended (every line is in ``lines``), at most ``timeout``."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the output did not end within {timeout:g} s of the "
                                 f"process's exit (a child holds it open?):\n{self.text()}")

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def worker_lines(out: str, rank: int) -> list[str]:
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]


def error_lines(lines: list[str]) -> list[str]:
    return [line[line.index(ERROR_PREFIX):] for line in lines if ERROR_PREFIX in line]


# ---- jobs --------------------------------------------------------------------------------

@dataclass
class JobEnv:
    marker: str
    env: dict[str, str]


@pytest.fixture
def job() -> Iterator[JobEnv]:
    missing = [p for p in (TEST_WORKER, SCHEDULER, SERVER, LOGREG) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"not built: {', '.join(map(str, missing))} (build everything first, "
                    "or set HYBRIDPS_BUILD_DIR)")
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDPS_")}
    env.update(JOB_ENV)
    env[MARKER_VAR] = marker
    try:
        yield JobEnv(marker, env)
    finally:
        kill_leftovers(marker)


@dataclass
class HybridRun:
    """A running hybridrun, its output collected as it comes."""

    proc: subprocess.Popen[str]
    out: Lines
    err: Lines
    started: float = field(default_factory=time.monotonic)

    def finish(self, timeout: float) -> tuple[int, str, str, float]:
        """Waits for the exit: (code, stdout, stderr, time of the exit)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"hybridrun still running after {timeout:g} s:\n"
                                 f"{self.out.text()}\n{self.err.text()}") from None
        ended = time.monotonic()
        self.out.join(10.0)
        self.err.join(10.0)
        return code, self.out.text(), self.err.text(), ended


def hybridrun(job: JobEnv, np: int, servers: int, command: list[str],
              backend: str = "dist_hybrid", options: tuple[str, ...] = ()) -> HybridRun:
    """hybridrun -np NP; with dist_allreduce no servers are started (`servers` unused)."""
    placement = (["--servers", str(servers)] if backend == "dist_hybrid" else [])
    proc = subprocess.Popen(
        [sys.executable, str(HYBRIDRUN), "-np", str(np), *placement, "--backend", backend,
         "--bin-dir", str(BUILD), *options, "--", *command],
        env=job.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, errors="replace")
    assert proc.stdout is not None and proc.stderr is not None
    return HybridRun(proc, Lines(proc.stdout), Lines(proc.stderr))


class DirectJob:
    """Scheduler, servers and workers started by the test, each in its own process
    group, left to end by themselves after a failure."""

    def __init__(self, job: JobEnv, tmp: Path, workers: int, servers: int,
                 worker_args: list[str], backend: str = "dist_hybrid",
                 worker_env: Callable[[int], dict[str, str]] = lambda rank: {},
                 before_workers: Callable[[int], None] = lambda port: None) -> None:
        if backend in (ONE_NODE, HYBRID_ONE_NODE):
            backend = "dist_allreduce" if backend == ONE_NODE else "dist_hybrid"
            worker_env = lambda rank: {"HYBRIDPS_LOCAL_RANK": str(rank),  # noqa: E731
                                       "HYBRIDPS_LOCAL_SIZE": str(workers)}
        elif backend == HIERARCHICAL:
            backend = "dist_allreduce"
            worker_env = lambda rank: {  # noqa: E731
                "HYBRIDPS_LOCAL_RANK": str(rank if rank < 2 else 0),
                "HYBRIDPS_LOCAL_SIZE": "2" if rank < 2 else "1",
                "HYBRIDPS_NODE_ID": "a" if rank < 2 else "b",
                "HYBRIDPS_HIERARCHICAL_ALLREDUCE": "1"}
        self.job = job
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.output: dict[str, Lines] = {}
        self.exited: dict[str, float] = {}
        common = {"HYBRIDPS_SCHEDULER_ADDR": "127.0.0.1",
                  "HYBRIDPS_NUM_WORKERS": str(workers),
                  "HYBRIDPS_NUM_SERVERS": str(servers),
                  "HYBRIDPS_JOB_TOKEN": job.marker,
                  "HYBRIDPS_BACKEND": backend}
        port_file = tmp / "scheduler.port"
        self._start("scheduler", [str(SCHEDULER)], {
            **common, "HYBRIDPS_ROLE": "scheduler", "HYBRIDPS_SCHEDULER_PORT": "0",
            "HYBRIDPS_PORT_FILE": str(port_file)})
        deadline = time.monotonic() + 10.0
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            assert time.monotonic() < deadline, "the scheduler wrote no port file"
            assert self.procs["scheduler"].poll() is None, self.output["scheduler"].text()
            time.sleep(0.02)
        common["HYBRIDPS_SCHEDULER_PORT"] = port_file.read_text().strip()
        self.port = int(common["HYBRIDPS_SCHEDULER_PORT"])
        before_workers(self.port)
        for i in range(servers):
            self._start(f"server {i}", [str(SERVER)],
                        {**common, "HYBRIDPS_ROLE": "server", "HYBRIDPS_RANK": str(i)})
        for r in range(workers):
            self._start(f"worker {r}", [str(TEST_WORKER), *worker_args],
                        {**common, "HYBRIDPS_ROLE": "worker", "HYBRIDPS_RANK": str(r),
                         **worker_env(r)})

    def _start(self, label: str, argv: list[str], env: dict[str, str]) -> None:
        proc = subprocess.Popen(argv, env={**self.job.env, **env}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
        assert proc.stdout is not None
        self.procs[label] = proc
        self.output[label] = Lines(proc.stdout)

    def wait(self, label: str, timeout: float) -> int:
        """Waits for one process's exit (recording when it came) and for the end of its
        output, so that ``lines(label)`` holds all of it; its return code."""
        proc = self.procs[label]
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{label} still running after {timeout:g} s:\n"
                                 f"{self.text()}") from None
        self.exited.setdefault(label, time.monotonic())
        self.output[label].join(10.0)
        return code

    def wait_all(self, timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        codes = {}
        while len(codes) < len(self.procs):
            for label, proc in self.procs.items():
                if label not in codes and proc.poll() is not None:
                    codes[label] = self.wait(label, 0)
            if len(codes) < len(self.procs):
                if time.monotonic() >= deadline:
                    running = sorted(set(self.procs) - set(codes))
                    raise AssertionError(f"{running} still running {timeout:g} s on:\n"
                                         f"{self.text()}")
                time.sleep(0.02)
        return codes

    def lines(self, label: str) -> list[str]:
        return [line for _, line in self.output[label].lines]

    def text(self) -> str:
        return "\n".join(f"[{label}] {line}" for label, out in self.output.items()
                         for _, line in out.lines)

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait(timeout=5.0)
        # A job whose local rank was killed leaves its tensor segments for the next job on
        # its endpoint to remove; no test job reuses an endpoint, so this one's go now
        # (only names of this job: its port and random token are in the prefix).
        if hasattr(self, "port"):
            mine = segment_prefix(self.port, self.job.marker, 0).rsplit("-n", 1)[0] + "-n"
            for name in os.listdir("/dev/shm"):
                if name.startswith(mine):
                    try:
                        os.unlink(os.path.join("/dev/shm", name))
                    except OSError:
                        pass


@pytest.fixture
def direct(job: JobEnv, tmp_path: Path) -> Iterator[list[DirectJob]]:
    jobs: list[DirectJob] = []
    try:
        yield jobs
    finally:
        for j in jobs:
            j.kill()


# ---- tests -------------------------------------------------------------------------------

BACKENDS = ["dist_hybrid", "dist_allreduce"]
# dist_allreduce with every worker a local rank of one node (DirectJob): its CPU allreduces
# run in shared memory, where a dead or hung peer must end the survivors' waits too.
ONE_NODE = "dist_allreduce_one_node"
# dist_allreduce over a node of workers 0, 1 and a node of worker 2, hierarchical: each
# node sums in shared memory (worker 2 alone), the nodes' local ranks 0 over Gloo.
HIERARCHICAL = "dist_allreduce_hierarchical"
# dist_hybrid with every worker a local rank of one node (what hybridrun -np N gives): the
# node reduces in shared memory before its one push.
HYBRID_ONE_NODE = "dist_hybrid_one_node"


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


def assert_every_round_ok(j: DirectJob, workers: int, rounds: int) -> None:
    """Every worker exited 0 after printing "round K ok" for each round, in order."""
    codes = j.wait_all(RUN_TIMEOUT)
    assert all(code == 0 for code in codes.values()), j.text()
    for rank in range(workers):
        lines = j.lines(f"worker {rank}")
        assert [line for line in lines if line.startswith("round ")] == [
            f"round {k} ok" for k in range(rounds)], j.text()


def segment_prefix(port: int, token: str, node: int) -> str:
    """The /dev/shm name prefix of a node's segments (worker/ps/local/local_reduce.cc)."""
    h = 1469598103934665603
    for byte in f"tcp://127.0.0.1:{port}|{token}".encode():
        h = ((h ^ byte) * 1099511628211) % (1 << 64)
    return f"hybridps-{h:016x}-n{node}-"


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
    launch on the same port) that reaches this job's scheduler first is refused: it exits
    with an error naming the token, takes no rank, and the job itself runs."""
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
    assert "has a different HYBRIDPS_JOB_TOKEN from the job of the scheduler" in out, out
    assert "round 0 ok" not in out, out
    assert_every_round_ok(j, workers=2, rounds=3)
    assert any("refused a registration" in line for line in j.lines("scheduler")), j.text()
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
