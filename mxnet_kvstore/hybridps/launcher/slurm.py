"""hybridrun inside a Slurm allocation (salloc, sbatch): the worker hosts and their slots
come from the job, and remote processes start as srun steps of it.

Detection is automatic, as mpirun does it: SLURM_JOB_ID and SLURM_JOB_NODELIST set and
neither -H nor --hostfile given. ``--slurm`` insists (an error outside an allocation),
``--no-slurm`` ignores the allocation (local mode, or ssh with -H). An explicit
``--remote-shell`` keeps the hosts from Slurm but starts the processes its own way.

Hosts: ``scontrol show hostnames $SLURM_JOB_NODELIST``, in that order. Slots per node:
SLURM_TASKS_PER_NODE (what --ntasks/--ntasks-per-node asked for), else
SLURM_JOB_CPUS_PER_NODE, else 1. Nodes named in --server-hosts run servers only (a
node list split: dedicated servers on their own nodes of the same job).
"""
from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Mapping, Sequence

from .hosts import HostSlots
from .remote import DEFAULT_REMOTE_SHELL

# One step per process, on one node of the allocation:
# --overlap      steps share the job's CPUs, memory and GRES, so that every process of a
#                node runs at once (by default a step waits for CPUs another step holds);
#                without --exact a step gets all of the node's CPUs and GPUs of the job;
# --kill-on-bad-exit=1  Slurm ends the step when its task fails, whatever the cluster's
#                KillOnBadExit says;
# --export=ALL   the process sees hybridrun's environment (PATH, PYTHONPATH, -x) even in
#                an `sbatch --export=NONE` job;
# --mpi=none     no PMI/PMIx set-up for a process that does not use MPI;
# --quiet        no "job step created" chatter (errors, naming the node, still show).
# The task's stdin is hybridrun's pipe: the job token, then EOF when hybridrun stops the
# process or dies, which makes the remote wrapper kill its process group (remote.py).
SRUN_REMOTE_SHELL = ("srun --nodes=1 --ntasks=1 --nodelist={host} --overlap "
                     "--kill-on-bad-exit=1 --export=ALL --mpi=none --quiet sh -c {command}")
SCONTROL_TIMEOUT_S = 30.0
# "2(x3)" in SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE: 2 on each of 3 nodes.
_COUNT_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class SlurmError(Exception):
    """The allocation cannot be read, or does not fit the options; the message says why."""


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Whether this runs inside a Slurm job (salloc's shell, an sbatch script)."""
    return bool(environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"))


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """Decide whether this job takes its hosts from Slurm (``args.slurm``) and fill in
    ``args.remote_shell`` (srun steps then, else ssh) when it was not given. Returns a
    usage error, or None."""
    explicit_hosts = bool(args.hosts or args.hostfile)
    if args.slurm is None:
        args.slurm = in_allocation(environ) and not explicit_hosts
    elif args.slurm:
        if explicit_hosts:
            return "--slurm takes the hosts from the Slurm allocation: drop -H/--hostfile"
        if not in_allocation(environ):
            return ("--slurm: not inside a Slurm allocation (SLURM_JOB_ID and "
                    "SLURM_JOB_NODELIST are not set); run hybridrun under salloc or in "
                    "an sbatch script")
    if args.remote_shell is None:
        args.remote_shell = SRUN_REMOTE_SHELL if args.slurm else DEFAULT_REMOTE_SHELL
    return None


def expand_counts(text: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1]: Slurm's compressed per-node counts."""
    counts = []
    for item in text.split(","):
        match = _COUNT_RE.match(item.strip())
        if not match:
            raise SlurmError(f"cannot read the per-node count {item!r} of {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def node_names(nodelist: str) -> list[str]:
    """The nodes of a Slurm node list (``n[1-3],gpu7``), in order, by scontrol."""
    argv = ["scontrol", "show", "hostnames", nodelist]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise SlurmError("cannot run scontrol (Slurm's client commands) to read "
                         f"SLURM_JOB_NODELIST={nodelist}; is this a Slurm node?") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{' '.join(argv)} gave no answer within "
                         f"{SCONTROL_TIMEOUT_S:g} s") from exc
    names = done.stdout.split()
    if done.returncode != 0 or not names:
        said = done.stderr.strip() or "it printed no node"
        raise SlurmError(f"{' '.join(argv)} failed (code {done.returncode}): {said}")
    return names


def allocation_hosts(environ: Mapping[str, str]) -> list[HostSlots]:
    """Every node of the job with its slots (see the module's docstring)."""
    nodelist = environ["SLURM_JOB_NODELIST"]
    names = node_names(nodelist)
    for var in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        if environ.get(var):
            counts = expand_counts(environ[var])
            if len(counts) != len(names):
                raise SlurmError(
                    f"{var}={environ[var]} counts {len(counts)} nodes but "
                    f"SLURM_JOB_NODELIST={nodelist} has {len(names)} (inside an srun "
                    "step? run hybridrun in the sbatch script or salloc's shell)")
            return [HostSlots(name, count) for name, count in zip(names, counts)]
    return [HostSlots(name, 1) for name in names]


def worker_hosts(environ: Mapping[str, str],
                 server_hosts: Sequence[HostSlots] | None) -> list[HostSlots]:
    """The job's nodes that run workers: all of them, less the --server-hosts ones
    (which must be nodes of the job: srun reaches no other)."""
    hosts = allocation_hosts(environ)
    if not server_hosts:
        return hosts
    names = {h.name for h in hosts}
    where = f"Slurm job {environ.get('SLURM_JOB_ID')} ({environ['SLURM_JOB_NODELIST']})"
    unknown = [h.name for h in server_hosts if h.name not in names]
    if unknown:
        raise SlurmError(f"--server-hosts {','.join(unknown)}: not a node of {where}")
    servers = {h.name for h in server_hosts}
    workers = [h for h in hosts if h.name not in servers]
    if not workers:
        raise SlurmError(f"--server-hosts names every node of {where}: none is left "
                         "for the workers")
    return workers
