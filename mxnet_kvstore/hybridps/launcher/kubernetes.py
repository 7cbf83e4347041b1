"""hybridps-k8s-entrypoint: the container entrypoint of a hybridps job on Kubernetes.

    hybridps-k8s-entrypoint scheduler
    hybridps-k8s-entrypoint server [--hold-after-exit]
    hybridps-k8s-entrypoint worker -- python train.py

The manifests of deploy/kubernetes/ run every pod through it. It takes what Kubernetes
gives a pod and turns it into the HYBRIDPS_* variables of one process of the job:

- the role: its first argument;
- the rank: a worker's from JOB_COMPLETION_INDEX (an Indexed Job); a server's from the
  ordinal its StatefulSet puts at the end of the pod's host name (hybridps-server-1 -> 1),
  or from JOB_COMPLETION_INDEX when the servers run as an Indexed Job;
- the scheduler's address: the scheduler pod's DNS name, <scheduler host>.<Service>
  (hybridps-scheduler.hybridps: its hostname and subdomain under the headless Service);
  the scheduler itself binds its pod's IP;
- HYBRIDPS_INTERFACE: the pod's IP (POD_IP, from the downward API), which servers bind and
  advertise and Gloo binds; HYBRIDPS_NODE_ID of a worker: the pod's host name (each pod
  is a node of its own: it has its own /dev/shm).

The job's own settings (HYBRIDPS_NUM_WORKERS, HYBRIDPS_NUM_SERVERS,
HYBRIDPS_SCHEDULER_PORT, HYBRIDPS_BACKEND...) come from the job's ConfigMap and the token
from its Secret, as HYBRIDPS_JOB_TOKEN_FILE: checked here first, so that a missing one
is named with where it should come from. The process then runs as the entrypoint's
child: the entrypoint is the container's PID 1, which the kernel gives no default
signal actions, so it forwards SIGTERM and SIGINT (kubectl delete) to the process and
exits with its code (128 + N for a signal N, as a shell does).

--hold-after-exit (the servers' StatefulSet): once the process has exited, wait for
SIGTERM instead of exiting: a StatefulSet restarts every container that exits, which
would start a server into a job that has ended. The pod stays until the job's
resources are deleted (kubectl delete -k ...).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .binaries import (SCHEDULER_BINARY, SERVER_BINARY, BinaryNotFoundError,
                       find_binary)

PROG = "hybridps-k8s-entrypoint"
ROLES = ("scheduler", "server", "worker")
DEFAULT_SERVICE = "hybridps"
DEFAULT_SCHEDULER_HOST = "hybridps-scheduler"
# Set by Kubernetes: the index of an Indexed Job's pod; the pod IP is given by the
# manifests through the downward API (fieldRef status.podIP).
INDEX_VAR = "JOB_COMPLETION_INDEX"
POD_IP_VAR = "POD_IP"
CONFIG_HINT = "the job's ConfigMap (deploy/kubernetes: hybridps-job, through envFrom)"
# A StatefulSet pod's name and host name: <statefulset name>-<ordinal>.
ORDINAL = re.compile(r"^(?P<set>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<ordinal>[0-9]+)$")


class EntrypointError(Exception):
    """What the pod lacks or has wrong, in words that name it."""


@dataclass
class Launch:
    """The process to run: its argv, its whole environment, and what to call it."""

    argv: list[str]
    env: dict[str, str]
    label: str


def _number(env: Mapping[str, str], name: str, where: str) -> int:
    value = env.get(name, "")
    if not value:
        raise EntrypointError(f"{name} is not set: {where} sets it")
    if not value.isdigit():
        raise EntrypointError(f"{name}={value!r} is not a non-negative integer ({where})")
    return int(value)


def _check_token(env: Mapping[str, str]) -> None:
    """The same rule as common/options.cc ReadJobToken, said in Kubernetes' terms."""
    direct, path = env.get("HYBRIDPS_JOB_TOKEN"), env.get("HYBRIDPS_JOB_TOKEN_FILE")
    if direct and path:
        raise EntrypointError("both HYBRIDPS_JOB_TOKEN and HYBRIDPS_JOB_TOKEN_FILE are set: "
                              "set one of them")
    if direct:
        return
    if not path:
        raise EntrypointError(
            "no job token: set HYBRIDPS_JOB_TOKEN_FILE to the file of the job's Secret "
            "(the manifests mount the Secret hybridps-job-token at /etc/hybridps/token; "
            "make it with: openssl rand -hex 16 | kubectl create secret generic "
            "hybridps-job-token --from-file=token=/dev/stdin)")
    try:
        st = os.stat(path)
    except OSError as e:
        raise EntrypointError(
            f"HYBRIDPS_JOB_TOKEN_FILE={path}: {e.strerror}: is the Secret "
            "hybridps-job-token mounted there, with the key 'token'?") from None
    if st.st_mode & 0o077:
        raise EntrypointError(
            f"HYBRIDPS_JOB_TOKEN_FILE={path} has mode {st.st_mode & 0o7777:04o}: others "
            "can read it, and hybridps refuses such a token file; give the Secret's volume "
            "defaultMode: 0400 and the pod no fsGroup (which adds group read)")


def _server_rank(env: Mapping[str, str], hostname: str) -> tuple[int, str]:
    if env.get(INDEX_VAR):
        return _number(env, INDEX_VAR, "an Indexed Job"), f"{INDEX_VAR}={env[INDEX_VAR]}"
    m = ORDINAL.match(hostname)
    if not m:
        raise EntrypointError(
            f"cannot tell this server's rank: the host name {hostname!r} does not end in "
            "-<ordinal> as a StatefulSet pod's does (hybridps-server-1), and "
            f"{INDEX_VAR} is not set (an Indexed Job's pod); run the servers as a "
            "StatefulSet or an Indexed Job")
    return int(m.group("ordinal")), f"host name {hostname}"


def derive(role: str, command: Sequence[str], env: Mapping[str, str], *,
           service: str = DEFAULT_SERVICE, scheduler_host: str = DEFAULT_SCHEDULER_HOST,
           hostname: str | None = None) -> Launch:
    """The process and environment of ``role`` in a pod whose environment is ``env``."""
    if role not in ROLES:
        raise EntrypointError(f"the role must be one of {', '.join(ROLES)}, not {role!r}")
    if role == "worker" and not command:
        raise EntrypointError("a worker needs its command after --: "
                              f"{PROG} worker -- python train.py")
    if role != "worker" and command:
        raise EntrypointError(f"the {role} runs hybridps-{role}: it takes no command "
                              f"(got {' '.join(command)!r})")
    out = dict(env)
    hostname = hostname or env.get("HOSTNAME") or socket.gethostname()
    backend = env.get("HYBRIDPS_BACKEND") or "dist_hybrid"
    _number(env, "HYBRIDPS_SCHEDULER_PORT", CONFIG_HINT)
    workers = _number(env, "HYBRIDPS_NUM_WORKERS", CONFIG_HINT)
    servers = (_number(env, "HYBRIDPS_NUM_SERVERS", CONFIG_HINT)
               if backend != "dist_allreduce" else 0)
    _check_token(env)

    interface = env.get("HYBRIDPS_INTERFACE") or env.get(POD_IP_VAR)
    if not interface:
        raise EntrypointError(
            f"{POD_IP_VAR} is not set: give the container the pod's IP through the "
            f"downward API (env {POD_IP_VAR} from fieldRef status.podIP), or set "
            "HYBRIDPS_INTERFACE; servers bind it and tell the workers it")
    out["HYBRIDPS_INTERFACE"] = interface
    out["HYBRIDPS_ROLE"] = role

    if role == "scheduler":
        # Others reach the scheduler by its DNS name; it binds its pod's address (the IP:
        # HYBRIDPS_INTERFACE may name a network interface instead).
        out["HYBRIDPS_SCHEDULER_ADDR"] = env.get(POD_IP_VAR) or interface
        out.pop("HYBRIDPS_RANK", None)
        binary = find_binary(SCHEDULER_BINARY, bin_dir=None, env=env, repo_root=None)
        return Launch([str(binary)], out, "scheduler")

    if not env.get("HYBRIDPS_SCHEDULER_ADDR"):
        out["HYBRIDPS_SCHEDULER_ADDR"] = f"{scheduler_host}.{service}"
    if role == "server":
        if backend == "dist_allreduce":
            raise EntrypointError("HYBRIDPS_BACKEND=dist_allreduce runs no servers: leave "
                                  "the servers' StatefulSet out (or set replicas: 0)")
        rank, source = _server_rank(env, hostname)
        if rank >= servers:
            raise EntrypointError(
                f"server rank {rank} (from the {source}) is not below "
                f"HYBRIDPS_NUM_SERVERS={servers}: the StatefulSet's replicas and "
                "HYBRIDPS_NUM_SERVERS of the job's ConfigMap differ")
    else:
        if not env.get(INDEX_VAR):
            raise EntrypointError(
                f"{INDEX_VAR} is not set: run the workers as an Indexed Job "
                "(completionMode: Indexed), whose pods Kubernetes numbers 0..completions-1")
        rank = _number(env, INDEX_VAR, "an Indexed Job")
        source = f"{INDEX_VAR}={rank}"
        if rank >= workers:
            raise EntrypointError(
                f"worker rank {rank} (from {source}) is not below "
                f"HYBRIDPS_NUM_WORKERS={workers}: the Job's completions and "
                "HYBRIDPS_NUM_WORKERS of the job's ConfigMap differ")
        # One worker process per pod, a node of its own.
        out.setdefault("HYBRIDPS_LOCAL_RANK", "0")
        out.setdefault("HYBRIDPS_LOCAL_SIZE", "1")
        out.setdefault("HYBRIDPS_NODE_ID", hostname)
    given = env.get("HYBRIDPS_RANK")
    if given and given != str(rank):
        raise EntrypointError(f"HYBRIDPS_RANK={given} is set, but the {source} makes this "
                              f"{role} rank {rank}: remove HYBRIDPS_RANK")
    out["HYBRIDPS_RANK"] = str(rank)
    if role == "server":
        binary = find_binary(SERVER_BINARY, bin_dir=None, env=env, repo_root=None)
        return Launch([str(binary)], out, f"server {rank}")
    return Launch(list(command), out, f"worker {rank}")


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(launch: Launch, *, hold: bool) -> int:
    """Run the process, forwarding SIGTERM and SIGINT to it; return its exit code (after
    the hold, with ``hold``)."""
    stop = threading.Event()
    child: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        stop.set()
        if child and child[0].poll() is None:
            child[0].send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    try:
        child.append(subprocess.Popen(launch.argv, env=launch.env))
    except OSError as e:
        print(f"{PROG}: error: cannot start {launch.label}: {launch.argv[0]}: {e.strerror}",
              file=sys.stderr, flush=True)
        return 127
    if stop.is_set():  # a signal came before the child existed
        child[0].send_signal(signal.SIGTERM)
    code = _exit_code(child[0].wait())
    if hold and not stop.is_set():
        print(f"{PROG}: {launch.label} exited with code {code}; holding this pod until "
              "it is deleted, so that its StatefulSet does not start it again into a job "
              "that has ended (kubectl delete -k <overlay>)", file=sys.stderr, flush=True)
        while not stop.wait(3600):
            pass
    return code


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} {{{','.join(ROLES)}}} [options] [-- COMMAND...]",
        description="Run one process of a hybridps job in a Kubernetes pod: "
        "role, rank and the scheduler's address derived from what Kubernetes sets "
        "(docs/deployment.md, Kubernetes).")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--service", default=DEFAULT_SERVICE,
                        help="the job's headless Service: the pods' subdomain "
                        "(default %(default)s)")
    parser.add_argument("--scheduler-host", default=DEFAULT_SCHEDULER_HOST,
                        help="the scheduler pod's hostname (default %(default)s); the "
                        "scheduler's address is <scheduler-host>.<service>")
    parser.add_argument("--hold-after-exit", action="store_true",
                        help="after the process exits, wait until the pod is deleted "
                        "(a StatefulSet's pods) instead of exiting")
    # The worker's command is everything after the first "--", never parsed here.
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1:]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        launch = derive(args.role, args.command, os.environ, service=args.service,
                        scheduler_host=args.scheduler_host)
    except (EntrypointError, BinaryNotFoundError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"{PROG}: {launch.label}: scheduler {launch.env['HYBRIDPS_SCHEDULER_ADDR']}:"
          f"{launch.env['HYBRIDPS_SCHEDULER_PORT']}, interface "
          f"{launch.env['HYBRIDPS_INTERFACE']}", file=sys.stderr, flush=True)
    return run(launch, hold=args.hold_after_exit)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
