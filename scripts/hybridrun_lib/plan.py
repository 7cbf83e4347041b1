"""What a job consists of: hosts, processes and the environment of each.

Only local mode exists now. Multi-host support plugs in here: a ``Host`` per
``-H``/``--hostfile`` entry (placement decides ``host`` of each ProcessSpec and
``worker_placement``), and a launcher per host (``launcher_for``) that wraps the
command in a remote-shell template such as ``ssh {host} {command}``.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

BACKENDS = ("dist_hybrid", "dist_allreduce")
DEFAULT_BACKEND = "dist_hybrid"
PORT_PLACEHOLDER = "<port written by the scheduler>"

# Variables set by hybridrun. Inherited values are dropped first, so a value left
# over from an enclosing job cannot reach a role that does not set it itself.
MANAGED_VARS = frozenset({
    "HYBRIDPS_ROLE", "HYBRIDPS_RANK", "HYBRIDPS_LOCAL_RANK", "HYBRIDPS_LOCAL_SIZE",
    "HYBRIDPS_SCHEDULER_ADDR", "HYBRIDPS_SCHEDULER_PORT", "HYBRIDPS_NUM_WORKERS",
    "HYBRIDPS_NUM_SERVERS", "HYBRIDPS_PORT_FILE", "HYBRIDPS_BACKEND",
    "HYBRIDPS_JOB_TOKEN",
})
CHILD_DEFAULTS = {"PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Host:
    """A machine that runs processes of the job."""

    name: str = "localhost"
    slots: int = 0          # worker slots (0: unlimited); used by -H host:slots later
    address: str = "127.0.0.1"  # how processes on other hosts reach this one

    @property
    def is_local(self) -> bool:
        return self.name == "localhost"


LOCALHOST = Host()


@dataclass
class ProcessSpec:
    """One process of the job: what runs, where, and the variables it gets."""

    role: str                 # "scheduler", "server" or "worker"
    index: int | None         # server index or worker rank; None for the scheduler
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # set on top of the inherited env
    host: Host = LOCALHOST

    @property
    def label(self) -> str:
        return self.role if self.index is None else f"{self.role} {self.index}"


@dataclass
class JobPlan:
    scheduler: ProcessSpec
    servers: list[ProcessSpec]
    workers: list[ProcessSpec]

    def processes(self) -> list[ProcessSpec]:
        return [self.scheduler, *self.servers, *self.workers]

    def set_scheduler_port(self, port: int) -> None:
        """Tell every process but the scheduler where the scheduler listens."""
        for spec in [*self.servers, *self.workers]:
            spec.env["HYBRIDPS_SCHEDULER_PORT"] = str(port)


def worker_placement(rank: int, num_workers: int) -> tuple[int, int]:
    """Return (local rank, local size) of worker ``rank``.

    All workers run on this host, so they form one node: the local ranks reduce in
    shared memory and only one push per partition leaves the host.
    """
    return rank, num_workers


def build_plan(*, num_workers: int, num_servers: int, backend: str,
               scheduler_bin: Path, server_bin: Path | None, command: list[str],
               job_token: str, port_file: str,
               scheduler_host: Host = LOCALHOST) -> JobPlan:
    """Describe every process of a job; the scheduler port is filled in later."""
    common = {
        "HYBRIDPS_SCHEDULER_ADDR": scheduler_host.address,
        "HYBRIDPS_NUM_WORKERS": str(num_workers),
        "HYBRIDPS_NUM_SERVERS": str(num_servers),
        "HYBRIDPS_BACKEND": backend,
        "HYBRIDPS_JOB_TOKEN": job_token,
    }
    scheduler = ProcessSpec("scheduler", None, [str(scheduler_bin)], {
        "HYBRIDPS_ROLE": "scheduler", **common,
        "HYBRIDPS_SCHEDULER_PORT": "0", "HYBRIDPS_PORT_FILE": port_file,
    }, scheduler_host)
    others = {**common, "HYBRIDPS_SCHEDULER_PORT": PORT_PLACEHOLDER}
    servers = []
    if num_servers:
        assert server_bin is not None
        servers = [ProcessSpec("server", i, [str(server_bin)],
                               {"HYBRIDPS_ROLE": "server", **others,
                                "HYBRIDPS_RANK": str(i)})
                   for i in range(num_servers)]
    workers = []
    for rank in range(num_workers):
        local_rank, local_size = worker_placement(rank, num_workers)
        workers.append(ProcessSpec("worker", rank, list(command), {
            "HYBRIDPS_ROLE": "worker", **others, "HYBRIDPS_RANK": str(rank),
            "HYBRIDPS_LOCAL_RANK": str(local_rank),
            "HYBRIDPS_LOCAL_SIZE": str(local_size),
        }))
    return JobPlan(scheduler, servers, workers)


def child_environment(base: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """The inherited environment minus hybridrun's own variables, plus ``overrides``."""
    env = {k: v for k, v in base.items() if k not in MANAGED_VARS}
    env.update(CHILD_DEFAULTS)
    env.update(overrides)
    return env


class Launcher(Protocol):
    def prepare(self, spec: ProcessSpec,
                base_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """Return (argv, environment) that start ``spec`` from this machine."""


class LocalLauncher:
    """Starts processes on this machine directly."""

    def prepare(self, spec: ProcessSpec,
                base_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        return list(spec.argv), child_environment(base_env, spec.env)


def launcher_for(host: Host) -> Launcher:
    """The launcher of a host. A remote-shell launcher (template such as
    ``ssh {host} {command}``, passing the variables with ``env VAR=...``) goes here."""
    if host.is_local:
        return LocalLauncher()
    raise NotImplementedError(f"remote host {host.name!r}: only local mode is implemented")


def describe(spec: ProcessSpec) -> str:
    """Readable description of a process: command line and the variables it is given."""
    env = {**CHILD_DEFAULTS, **spec.env}
    lines = [f"[{spec.label}] on {spec.host.name}: {shlex.join(spec.argv)}"]
    lines += [f"    {key}={shlex.quote(env[key])}" for key in sorted(env)]
    return "\n".join(lines)
