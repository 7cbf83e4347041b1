"""The job's watchdog: ends the local processes of a job whose hybridrun died.

hybridrun stops its job itself on a failure, a signal it can catch, or the job's end.
When it cannot (SIGKILL, the OOM killer), its local processes would run on: the
scheduler and servers until the workers stop, the workers until a write to hybridrun's
closed pipe kills them, leaving their node's shared memory behind. So hybridrun starts
this watchdog first, in a session of its own, and tells it through a pipe (one line per
fact) what to clean up:

    group PGID     a local process group it started
    shm PREFIX     the /dev/shm name prefix of the job's segments (on this host)
    done           hybridrun has stopped everything itself: exit quietly

End of input before "done" means hybridrun died: the watchdog sends SIGTERM to every
group, SIGKILL to those still alive after the grace, and removes the job's segments.
Remote processes need no watchdog: their wrapper stops them when the ssh pipe closes
(remote.py).

Run as ``python -m hybridps.launcher.watchdog GRACE_SECONDS`` with the folder above
the hybridps package on the module path.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from .shm import remove_local

POLL_S = 0.05


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(groups: Iterable[int], grace: float) -> None:
    """SIGTERM to every group, then SIGKILL to those still alive after ``grace`` s."""
    groups = [g for g in groups if _alive(g)]
    for g in groups:
        _signal(g, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for g in groups:
        if _alive(g):
            _signal(g, signal.SIGKILL)


def watch(lines: Iterable[str], grace: float) -> bool:
    """Follows hybridrun's lines to their end; True when it had to stop the job."""
    groups: list[int] = []
    prefixes: list[str] = []
    for line in lines:
        what, _, arg = line.strip().partition(" ")
        if what == "done":
            return False
        if what == "group" and arg.isdigit():
            groups.append(int(arg))
        elif what == "shm" and arg.startswith("hybridps-"):
            prefixes.append(arg)
    stop_groups(groups, grace)
    for prefix in prefixes:
        remove_local(prefix)
    return True


def main(argv: list[str]) -> int:
    # Ctrl-C in hybridrun's terminal, or the terminal closing, is hybridrun's to handle.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    grace = float(argv[1]) if len(argv) > 1 else 3.0
    if watch(sys.stdin, grace):
        try:
            print("hybridrun died: its watchdog stopped the job's local processes and "
                  "removed their shared memory", file=sys.stderr, flush=True)
        except OSError:
            pass  # nobody reads hybridrun's stderr any more
    return 0


class Watchdog:
    """hybridrun's end of the pipe: starts the watchdog and tells it what to clean up."""

    def __init__(self, grace: float) -> None:
        package_parent = str(Path(__file__).resolve().parent.parent.parent)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ,
               "PYTHONPATH": package_parent + (os.pathsep + path if path else "")}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "hybridps.launcher.watchdog", str(grace)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
            start_new_session=True, close_fds=True)

    def tell(self, line: str) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except OSError:
            pass  # the watchdog is gone: nothing to do about it here

    def close(self) -> None:
        """hybridrun stopped everything itself: the watchdog exits without acting."""
        self.tell("done")
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
