"""Running a whole job: scheduler first, then servers and workers; watch them;
stop everything on the first failure or signal; orderly shutdown otherwise."""
from __future__ import annotations

import atexit
import os
import queue
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from .plan import JobPlan, ProcessSpec, describe, launcher_for
from .process import ManagedProcess, OutputSink, kill_now, terminate
from .shm import job_segment_prefix, remove_job_segments
from .watchdog import Watchdog

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.05


@dataclass
class JobOptions:
    start_timeout: float = 60.0
    shutdown_timeout: float = 30.0
    kill_grace: float = 3.0
    # A scheduler or server that exits 0 while workers run is a failure unless all
    # workers finish successfully within this many seconds (exit-order race).
    early_exit_grace: float = 3.0
    verbose: bool = False


class JobFailedError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class JobInterruptedError(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def read_port_file(path: Path) -> int | None:
    """The port in ``path``, or None while the file is absent or incomplete."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return None
    if not text.endswith("\n"):
        return None
    value = text.strip()
    if value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    raise JobFailedError(f"scheduler wrote an invalid port {text!r} to {path}; "
                     "stopping the job", 1)


class Job:
    def __init__(self, plan: JobPlan, options: JobOptions, sink: OutputSink,
                 base_env: Mapping[str, str] | None = None) -> None:
        self.plan = plan
        self.options = options
        self.sink = sink
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.events: queue.Queue[ManagedProcess] = queue.Queue()
        self.procs: list[ManagedProcess] = []
        self._signal: int | None = None
        self._watchdog: Watchdog | None = None

    # -- entry point ---------------------------------------------------------
    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in HANDLED_SIGNALS}
        atexit.register(self._emergency_kill)
        failed = True
        # Ends the local processes and removes the job's shared memory should hybridrun
        # itself be killed (watchdog.py).
        self._watchdog = Watchdog(self.options.kill_grace)
        try:
            try:
                self._run()
                failed = False
                return 0
            except JobFailedError as failure:
                self.sink.message(failure.message)
                return failure.code
            except JobInterruptedError as interrupted:
                name = signal.Signals(interrupted.signum).name
                self.sink.message(f"received {name}; stopping the job")
                return 128 + interrupted.signum
        finally:
            self._stop_everything()
            if failed:
                self._remove_shared_memory()
            self._watchdog.close()
            atexit.unregister(self._emergency_kill)
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _run(self) -> None:
        scheduler = self._start(self.plan.scheduler)
        port_file = Path(self.plan.scheduler.env["HYBRIDPS_PORT_FILE"])
        port = self._wait_for_port(scheduler, port_file)
        self._log(f"scheduler listens on port {port}")
        self.plan.set_scheduler_port(port)
        prefix = job_segment_prefix(self.plan.workers[0].env) if self.plan.workers else None
        if prefix is not None and any(w.host.is_local for w in self.plan.workers):
            assert self._watchdog is not None
            self._watchdog.tell(f"shm {prefix}")
        for spec in [*self.plan.servers, *self.plan.workers]:
            self._check_signal()
            self._start(spec)
        self._watch_workers()
        self._shutdown_services()

    # -- phases --------------------------------------------------------------
    def _start(self, spec: ProcessSpec) -> ManagedProcess:
        argv, env = launcher_for(spec.host).prepare(spec, self.base_env)
        if self.options.verbose:
            self.sink.message("starting " + describe(spec))
        try:
            proc = ManagedProcess(spec, argv, env, self.sink, self.events)
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            raise JobFailedError(f"cannot start {spec.label} ({argv[0]}): "
                             f"{exc.strerror or exc}; stopping the job", code) from exc
        self.procs.append(proc)
        if not proc.remote and self._watchdog is not None:
            self._watchdog.tell(f"group {proc.pgid}")
        return proc

    def _wait_for_port(self, scheduler: ManagedProcess, port_file: Path) -> int:
        deadline = time.monotonic() + self.options.start_timeout
        while True:
            self._check_signal()
            port = read_port_file(port_file)
            if port is not None:
                return port
            if not scheduler.running:
                scheduler.join_output(1.0)
                said = "" if scheduler.lines_printed else " (it printed nothing)"
                raise JobFailedError(
                    f"scheduler {scheduler.describe_exit()} before writing its port "
                    f"to {port_file}{said}; stopping the job",
                    scheduler.exit_code or 1)
            if time.monotonic() >= deadline:
                said = ("its output is above" if scheduler.lines_printed
                        else "it printed nothing")
                raise JobFailedError(
                    f"scheduler did not write its port to {port_file} within "
                    f"{self.options.start_timeout:g} s (--start-timeout; {said}); "
                    "stopping the job", 1)
            scheduler.exited.wait(0.02)

    def _watch_workers(self) -> None:
        """Return once every worker exited 0; raise on the first failure."""
        workers_left = {p for p in self.procs if p.role == "worker"}
        early: tuple[ManagedProcess, float] | None = None
        while workers_left:
            self._check_signal()
            try:
                proc: ManagedProcess | None = self.events.get(timeout=POLL_S)
            except queue.Empty:
                proc = None
            if proc is not None:
                self._log(f"{proc.label} {proc.describe_exit()}")
                if proc.returncode != 0:
                    raise self._failure(early[0] if early else proc)
                if proc.role == "worker":
                    workers_left.discard(proc)
                elif proc.role == "scheduler":
                    # It exits 0 only once every worker has left the job: the workers
                    # are exiting (a Python worker's teardown can take seconds).
                    grace = max(self.options.early_exit_grace, self.options.shutdown_timeout)
                    early = (early[0] if early else proc, time.monotonic() + grace)
                elif early is None:
                    early = (proc, time.monotonic() + self.options.early_exit_grace)
            if early and workers_left and time.monotonic() >= early[1]:
                raise self._failure(early[0])
        if early:
            self._log(f"{early[0].label} exited just before the last worker; "
                      "all workers succeeded")

    def _shutdown_services(self) -> None:
        """Give the scheduler and servers time to exit by themselves, then kill them."""
        services = [p for p in self.procs if p.role != "worker"]
        deadline = time.monotonic() + self.options.shutdown_timeout
        while any(p.running for p in services) and time.monotonic() < deadline:
            self._check_signal()
            try:
                proc = self.events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if proc.returncode != 0:
                self.sink.message(f"warning: {proc.label} {proc.describe_exit()} "
                                  "during shutdown")
            else:
                self._log(f"{proc.label} {proc.describe_exit()}")
        left = [p for p in services if p.running]
        if left:
            names = ", ".join(p.label for p in left)
            self.sink.message(
                f"warning: {names} still running {self.options.shutdown_timeout:g} s "
                "after the workers finished; killing them")
            forced = terminate(left, self.options.kill_grace)
            if forced:
                self.sink.message("warning: " + ", ".join(p.label for p in forced)
                                  + " did not stop on SIGTERM; sent SIGKILL")

    def _stop_everything(self) -> None:
        """Kill every process group still alive and drain the output."""
        leftovers = [p for p in self.procs if p.group_alive()]
        if leftovers:
            self._log("stopping " + ", ".join(p.label for p in leftovers))
            terminate(leftovers, self.options.kill_grace)
        for proc in self.procs:
            proc.join_output(1.0)

    def _remove_shared_memory(self) -> None:
        """A killed local rank leaves its node's shared-memory segments behind (the
        last rank to leave removes them); remove the job's on every worker host."""
        for warning in remove_job_segments(self.plan.workers):
            self.sink.message(warning)

    # -- helpers -------------------------------------------------------------
    def _failure(self, proc: ManagedProcess) -> JobFailedError:
        proc.join_output(0.5)  # its last lines before our message
        if proc.returncode == 0:
            return JobFailedError(f"{proc.label} exited with code 0 while workers were "
                              "still running; stopping the job", 1)
        return JobFailedError(f"{proc.label} {proc.describe_exit()}; stopping the job",
                          proc.exit_code)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self._signal is None:
            self._signal = signum

    def _check_signal(self) -> None:
        if self._signal is not None:
            raise JobInterruptedError(self._signal)

    def _emergency_kill(self) -> None:
        kill_now(self.procs)

    def _log(self, text: str) -> None:
        if self.options.verbose:
            self.sink.message(text)
