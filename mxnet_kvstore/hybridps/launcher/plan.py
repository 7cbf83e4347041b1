"""What a job consists of: hosts, processes and the environment of each.

Local mode (no -H/--hostfile): every process on this machine, each worker its own
node. Multi-host mode: a ``Host`` per -H/--hostfile/--server-hosts entry, a
``hosts.Placement`` that says where each worker and server runs, and a launcher per
host (``launcher_for``) that wraps remote commands in a remote-shell template such as
``ssh {host} {command}`` (see remote.py). The scheduler always runs here.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .hosts import Placement
from .remote import remote_argv, secret_lines, wrapped_command

BACKENDS = ("dist_hybrid", "dist_allreduce")
DEFAULT_BACKEND = "dist_hybrid"
PORT_PLACEHOLDER = "<port written by the scheduler>"

# Variables set by hybridrun. Inherited values are dropped first, so a value left
# over from an enclosing job cannot reach a role that does not set it itself.
MANAGED_VARS = frozenset({
    "HYBRIDPS_ROLE", "HYBRIDPS_RANK", "HYBRIDPS_LOCAL_RANK", "HYBRIDPS_LOCAL_SIZE",
    "HYBRIDPS_SCHEDULER_ADDR", "HYBRIDPS_SCHEDULER_PORT", "HYBRIDPS_NUM_WORKERS",
    "HYBRIDPS_NUM_SERVERS", "HYBRIDPS_PORT_FILE", "HYBRIDPS_BACKEND",
    "HYBRIDPS_JOB_TOKEN", "HYBRIDPS_JOB_TOKEN_FILE", "HYBRIDPS_INTERFACE",
    "HYBRIDPS_DEPLOYMENT", "HYBRIDPS_NODE_ID", "HYBRIDPS_EXTRA_SERVERS",
})
CHILD_DEFAULTS = {"PYTHONUNBUFFERED": "1"}
# Variables a remote process reads from its stdin instead of its command line.
SECRET_VARS = ("HYBRIDPS_JOB_TOKEN",)


@dataclass(frozen=True)
class Host:
    """A machine that runs processes of the job."""

    name: str = "localhost"
    address: str = "127.0.0.1"  # how processes on other hosts reach this one
    # Remote-shell template that starts processes there; None: started directly.
    remote_shell: str | None = None

    @property
    def is_local(self) -> bool:
        return self.remote_shell is None


LOCALHOST = Host()


@dataclass
class ProcessSpec:
    """One process of the job: what runs, where, and the variables it gets."""

    role: str                 # "scheduler", "server" or "worker"
    index: int | None         # server index or worker rank; None for the scheduler
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # set on top of the inherited env
    host: Host = LOCALHOST
    show_host: bool = False   # multi-host jobs: labels read "worker 3@host"

    @property
    def label(self) -> str:
        base = self.role if self.index is None else f"{self.role} {self.index}"
        return f"{base}@{self.host.name}" if self.show_host else base


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


def worker_placement(rank: int, num_workers: int,
                     placement: Placement | None = None) -> tuple[int, int]:
    """Return (local rank, local size) of worker ``rank``.

    Local mode: all workers run on this host, so they form one node: the local ranks
    reduce in shared memory and only one push per partition leaves the host. Multi-host
    mode: (position of the rank among the workers of its host, workers on that host).
    """
    if placement is None:
        return rank, num_workers
    return placement.local_placement(rank)


@dataclass
class MultiHost:
    """What a multi-host job adds to build_plan's arguments."""

    placement: Placement
    hosts: dict[str, Host]           # every host by name


def build_plan(*, num_workers: int, num_servers: int, backend: str,
               scheduler_bin: Path, server_bin: Path | None, command: list[str],
               job_token: str, port_file: str,
               scheduler_host: Host = LOCALHOST,
               multi: MultiHost | None = None, interface: str | None = None,
               extra_env: Mapping[str, str] | None = None) -> JobPlan:
    """Describe every process of a job; the scheduler port is filled in later.

    ``interface`` (--network-interface) becomes HYBRIDPS_INTERFACE of every process;
    ``extra_env`` (-x) is set for every process, remote ones included."""
    common = {
        "HYBRIDPS_SCHEDULER_ADDR": scheduler_host.address,
        "HYBRIDPS_NUM_WORKERS": str(num_workers),
        "HYBRIDPS_NUM_SERVERS": str(num_servers),
        "HYBRIDPS_BACKEND": backend,
        "HYBRIDPS_JOB_TOKEN": job_token,
    }
    common = {**(extra_env or {}), **common}
    if interface:
        common["HYBRIDPS_INTERFACE"] = interface
    placement = multi.placement if multi else None
    if placement:
        common["HYBRIDPS_DEPLOYMENT"] = placement.deployment
        common["HYBRIDPS_EXTRA_SERVERS"] = str(placement.extra_servers)

    def host_of(names: list[str], index: int) -> Host:
        return multi.hosts[names[index]] if multi else LOCALHOST

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
                                "HYBRIDPS_RANK": str(i)},
                               host_of(placement.server_hosts if placement else [], i),
                               show_host=multi is not None)
                   for i in range(num_servers)]
    workers = []
    for rank in range(num_workers):
        local_rank, local_size = worker_placement(rank, num_workers, placement)
        workers.append(ProcessSpec("worker", rank, list(command), {
            "HYBRIDPS_ROLE": "worker", **others, "HYBRIDPS_RANK": str(rank),
            "HYBRIDPS_LOCAL_RANK": str(local_rank),
            "HYBRIDPS_LOCAL_SIZE": str(local_size),
            # The node is the host as named here (hosts such as network namespaces may
            # share one host name); locally the default, the host name, is right.
            **({"HYBRIDPS_NODE_ID": placement.worker_hosts[rank]} if placement else {}),
        }, host_of(placement.worker_hosts if placement else [], rank),
            show_host=multi is not None))
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


class RemoteLauncher:
    """Starts processes on another host through its remote-shell template. The remote
    process gets the job's variables (``env VAR=...``; stale managed ones removed),
    runs in this folder when it exists there, and is watched by a wrapper that kills
    its process group when hybridrun closes the remote shell's stdin (remote.py)."""

    def __init__(self, template: str) -> None:
        self.template = template

    def prepare(self, spec: ProcessSpec,
                base_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        remote_env = {**CHILD_DEFAULTS, **spec.env}
        unset = sorted(MANAGED_VARS - remote_env.keys())
        # The job token goes through the remote shell's stdin (process.py writes it), never
        # on a command line that `ps` shows to every user of either host.
        secrets = [name for name in SECRET_VARS if name in remote_env]
        shown = {k: v for k, v in remote_env.items() if k not in secrets}
        line = wrapped_command(spec.argv, shown, unset, os.getcwd(), secrets)
        return (remote_argv(self.template, spec.host.name, line),
                child_environment(base_env, {}))


def stdin_preamble(spec: ProcessSpec) -> str:
    """What a remote process's stdin must carry first (RemoteLauncher): its secrets."""
    env = {**CHILD_DEFAULTS, **spec.env}
    return secret_lines(env, [name for name in SECRET_VARS if name in env])


def launcher_for(host: Host) -> Launcher:
    """The launcher of a host: direct for this machine, else its remote shell."""
    if host.remote_shell is None:
        return LocalLauncher()
    return RemoteLauncher(host.remote_shell)


def describe(spec: ProcessSpec) -> str:
    """Readable description of a process: command line and the variables it is given."""
    env = {**CHILD_DEFAULTS, **spec.env}
    lines = [f"[{spec.label}] on {spec.host.name}: {shlex.join(spec.argv)}"]
    if not spec.host.is_local:
        lines.append(f"    (through {spec.host.remote_shell})")
    lines += [f"    {key}={shlex.quote(env[key])}" for key in sorted(env)]
    return "\n".join(lines)
