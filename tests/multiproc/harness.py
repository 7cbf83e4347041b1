"""The multi-process tests' harness (test_multiproc.py; fixtures in conftest.py).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
                 before_workers: Callable[[int], None] = lambda port: None,
                 scheduler_addr: str = "127.0.0.1",
                 worker_wrap: Callable[[int], list[str]] = lambda rank: []) -> None:
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
        common = {"HYBRIDPS_SCHEDULER_ADDR": scheduler_addr,
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
            self._start(f"worker {r}", [*worker_wrap(r), str(TEST_WORKER), *worker_args],
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


def segment_prefix(port: int, token: str, node: int) -> str:
    """The /dev/shm name prefix of a node's segments (worker/ps/local/local_reduce.cc)."""
    h = 1469598103934665603
    for byte in f"tcp://127.0.0.1:{port}|{token}".encode():
        h = ((h ^ byte) * 1099511628211) % (1 << 64)
    return f"hybridps-{h:016x}-n{node}-"


# ---- job layouts --------------------------------------------------------------------------

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


def assert_every_round_ok(j: DirectJob, workers: int, rounds: int) -> None:
    """Every worker exited 0 after printing "round K ok" for each round, in order."""
    codes = j.wait_all(RUN_TIMEOUT)
    assert all(code == 0 for code in codes.values()), j.text()
    for rank in range(workers):
        lines = j.lines(f"worker {rank}")
        assert [line for line in lines if line.startswith("round ")] == [
            f"round {k} ok" for k in range(rounds)], j.text()
