"""One child process: start it in its own process group, forward its output with
a prefix, report its exit, and signal its whole group."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
import time
from collections.abc import Iterable
from typing import BinaryIO, TextIO

from .plan import ProcessSpec, stdin_preamble

MAX_LINE_BYTES = 1 << 16  # a longer line without a newline is forwarded in pieces


class OutputSink:
    """Serialises prefixed child output (to stdout) and hybridrun's messages (stderr).

    With ``output_dir`` (``--output-filename DIR``) each process's lines also go, without
    the prefix, to a file of its own: DIR/scheduler.log, DIR/server.N.log,
    DIR/worker.N.log (the rank, whatever host it runs on)."""

    def __init__(self, out: BinaryIO | None = None, err: TextIO | None = None,
                 output_dir: Path | None = None) -> None:
        self._out = out if out is not None else sys.stdout.buffer
        self._err = err if err is not None else sys.stderr
        self._encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        self._lock = threading.Lock()
        self._dir = output_dir
        self._files: dict[str, BinaryIO] = {}

    def _file(self, prefix: str) -> BinaryIO | None:
        """The open log file of the process whose lines carry ``prefix`` ("[worker 1@h] ")."""
        if self._dir is None:
            return None
        label = prefix.strip().strip("[]").split("@")[0]
        name = label.replace(" ", ".") + ".log"
        if name not in self._files:
            try:
                self._files[name] = open(self._dir / name, "wb")  # noqa: SIM115
            except OSError as exc:
                print(f"hybridrun: cannot write {self._dir / name}: {exc}; per-process "
                      "output files stop here", file=self._err, flush=True)
                self._dir = None  # the console alone from now on
                return None
        return self._files[name]

    def child_lines(self, prefix: str, lines: list[bytes]) -> None:
        """Print complete lines of one child, each behind ``prefix``."""
        text = "".join(f"{prefix}{raw.decode('utf-8', errors='replace')}\n"
                       for raw in lines)
        data = text.encode(self._encoding, errors="replace")
        with self._lock:
            own = self._file(prefix)
            if own is not None:
                try:
                    own.write(b"".join(raw + b"\n" for raw in lines))
                    own.flush()
                except OSError as exc:  # a full disk must not stop the job's output
                    print(f"hybridrun: cannot write to {self._dir}: {exc}; per-process "
                          "output files stop here", file=self._err, flush=True)
                    self._close_files()
            try:
                self._out.write(data)
                self._out.flush()
            except (OSError, ValueError):  # closed or broken stdout: keep draining
                pass

    def _close_files(self) -> None:
        """Closes the output files for good: later lines go to the console only."""
        self._dir = None
        for f in self._files.values():
            try:
                f.close()
            except OSError:
                pass
        self._files.clear()

    def close(self) -> None:
        with self._lock:
            self._close_files()

    def message(self, text: str) -> None:
        with self._lock:
            try:
                self._out.flush()
                print(f"hybridrun: {text}", file=self._err, flush=True)
            except (OSError, ValueError):
                pass


def describe_status(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"killed by signal {-returncode}{name}"


def status_to_exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def _group_has_live_members(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = None
    if entries is None:  # no procfs: zombies count as alive
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


class ManagedProcess:
    """A started child; its exit is put on ``events`` when it is reaped."""

    def __init__(self, spec: ProcessSpec, argv: list[str], env: dict[str, str],
                 sink: OutputSink, events: queue.Queue[ManagedProcess]) -> None:
        self.spec = spec
        self.label = spec.label
        self.role = spec.role
        self.returncode: int | None = None
        self.exited = threading.Event()
        self.lines_printed = 0
        self._sink = sink
        self._events = events
        # A remote process is watched through its stdin: closing the pipe (or our
        # death) makes the remote wrapper kill it (remote.py). Local ones get /dev/null.
        self.remote = not spec.host.is_local
        self._popen = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE if self.remote else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            close_fds=True)
        self.pid = self._popen.pid
        self.pgid = self._popen.pid  # start_new_session: the child leads its group
        if self.remote and self._popen.stdin is not None:
            try:  # the job token, which the remote wrapper reads before anything else
                self._popen.stdin.write(stdin_preamble(spec).encode())
                self._popen.stdin.flush()
            except OSError:
                pass  # the remote shell already failed: its exit says why
        self._reader = threading.Thread(target=self._forward_output,
                                        name=f"output {self.label}", daemon=True)
        self._waiter = threading.Thread(target=self._wait, name=f"wait {self.label}",
                                        daemon=True)
        self._reader.start()
        self._waiter.start()

    @property
    def running(self) -> bool:
        return not self.exited.is_set()

    @property
    def exit_code(self) -> int:
        assert self.returncode is not None
        return status_to_exit_code(self.returncode)

    def describe_exit(self) -> str:
        assert self.returncode is not None
        text = describe_status(self.returncode)
        if self.remote and 128 < self.returncode < 160:
            try:  # the remote wrapper reports a signal as 128+N
                text += f" (killed by {signal.Signals(self.returncode - 128).name}?)"
            except ValueError:
                pass
        return text

    def close_stdin(self) -> None:
        """Tell a remote wrapper to stop its process (no-op for local ones)."""
        if self._popen.stdin is not None and not self._popen.stdin.closed:
            try:
                self._popen.stdin.close()
            except OSError:
                pass

    def group_alive(self) -> bool:
        return self.running or _group_has_live_members(self.pgid)

    def signal_group(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGKILL):
            self.close_stdin()
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def join_output(self, timeout: float) -> None:
        self._reader.join(timeout)

    def _wait(self) -> None:
        self.returncode = self._popen.wait()
        self.close_stdin()
        self.exited.set()
        self._events.put(self)

    def _forward_output(self) -> None:
        prefix = f"[{self.label}] "
        stream = self._popen.stdout
        assert stream is not None
        pending = b""
        try:
            while True:
                try:
                    chunk = os.read(stream.fileno(), 65536)
                except OSError:
                    break
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > MAX_LINE_BYTES:
                    lines.append(pending)
                    pending = b""
                self._emit(prefix, lines)
        finally:
            if pending:
                self._emit(prefix, [pending])
            stream.close()

    def _emit(self, prefix: str, lines: list[bytes]) -> None:
        if lines:
            self.lines_printed += len(lines)
            self._sink.child_lines(prefix, lines)


def terminate(procs: Iterable[ManagedProcess], grace: float) -> list[ManagedProcess]:
    """SIGTERM the groups of ``procs`` still alive, SIGKILL those alive after
    ``grace`` seconds, and reap the leaders. Returns the processes that got SIGKILL."""
    targets = [p for p in procs if p.group_alive()]
    for proc in targets:
        proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.group_alive() for p in targets):
        time.sleep(0.02)
    stubborn = [p for p in targets if p.group_alive()]
    for proc in stubborn:
        proc.signal_group(signal.SIGKILL)
    for proc in targets:
        proc.exited.wait(timeout=2.0)
    return stubborn


def kill_now(procs: Iterable[ManagedProcess]) -> None:
    """Last resort (atexit): SIGKILL every group that may still have members."""
    for proc in procs:
        proc.signal_group(signal.SIGKILL)
