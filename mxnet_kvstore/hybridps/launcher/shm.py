"""The shared-memory segments a job's local ranks leave when one of them is killed.

A node of several local ranks reduces in POSIX shared memory (worker/ps/local/local_reduce.cc).
The last local rank to leave unlinks the job's segments; when a rank is killed that
never happens, and the segments would stay in /dev/shm until the next job on the same
scheduler endpoint starts. hybridrun knows the endpoint and the job token, so it removes
them itself when a job fails or is interrupted, on every host that ran workers.
"""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
from collections.abc import Mapping, Sequence

from .plan import Host, ProcessSpec
from .remote import remote_argv

SHM_DIR = "/dev/shm"
REMOTE_TIMEOUT_S = 10.0


def fnv1a64(text: str) -> int:
    """64-bit FNV-1a of the UTF-8 bytes, as common/hash.h computes it."""
    h = 1469598103934665603
    for byte in text.encode():
        h = ((h ^ byte) * 1099511628211) % (1 << 64)
    return h


def job_segment_prefix(env: Mapping[str, str]) -> str | None:
    """The /dev/shm name prefix of every node's segments of the job whose worker
    environment is ``env``, or None when the scheduler's port is not known yet."""
    port = env.get("HYBRIDPS_SCHEDULER_PORT", "")
    if not port.isdigit():
        return None
    where = (f"tcp://{env.get('HYBRIDPS_SCHEDULER_ADDR', '')}:{port}|"
             f"{env.get('HYBRIDPS_JOB_TOKEN', '')}")
    return f"hybridps-{fnv1a64(where):016x}-"


def remove_local(prefix: str, directory: str = SHM_DIR) -> None:
    """Unlink every entry of ``directory`` whose name starts with ``prefix``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass  # e.g. a rank that was still leaving got there first


def _remove_remote(host: Host, prefix: str) -> str | None:
    """rm through the host's remote shell; an error line, or None."""
    assert host.remote_shell is not None
    argv = remote_argv(host.remote_shell, host.name, f"rm -f {SHM_DIR}/{prefix}*")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=REMOTE_TIMEOUT_S,
                              start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"host {host.name}: {exc}"
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return f"host {host.name}: exit {done.returncode}: {said[-1] if said else ''}"
    return None


def remove_job_segments(workers: Sequence[ProcessSpec]) -> list[str]:
    """Remove the job's segments on every host that ran one of ``workers`` (remote
    hosts in parallel, each within REMOTE_TIMEOUT_S); one warning line per host where
    that failed."""
    if not workers:
        return []
    prefix = job_segment_prefix(workers[0].env)
    if prefix is None:
        return []
    if any(w.host.is_local for w in workers):
        remove_local(prefix)
    remote = list({w.host.name: w.host for w in workers if not w.host.is_local}.values())
    errors = []
    if remote:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(remote), 32)) as pool:
            errors = [e for e in pool.map(lambda h: _remove_remote(h, prefix), remote) if e]
    return [f"warning: could not remove the job's shared memory ({SHM_DIR}/{prefix}*) "
            f"on {e}" for e in errors]
