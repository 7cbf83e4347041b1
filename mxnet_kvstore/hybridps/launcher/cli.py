"""Command line of hybridrun."""
from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._version import __version__
from .binaries import (BIN_DIR_ENV, SCHEDULER_BINARY, SERVER_BINARY, BinaryNotFoundError,
                       find_binary)
from .hosts import LOCAL_NAMES, HostSpecError, parse_host_list, parse_hostfile, place
from .job import Job, JobOptions
from .plan import (BACKENDS, DEFAULT_BACKEND, LOCALHOST, MANAGED_VARS, Host, JobPlan,
                   MultiHost, build_plan, describe)
from .remote import (DEFAULT_REMOTE_SHELL, InterfaceError, TemplateError, check_hosts,
                     check_template, guess_scheduler_address, interface_ipv4)
from . import slurm, timeline
from .process import OutputSink

USAGE = ("hybridrun -np N [-H HOST:SLOTS,... | --hostfile FILE | --[no-]slurm] [--servers M]\n"
         "                 [--server-hosts HOST[:COUNT],...] [--colocated]\n"
         "                 [--backend {dist_hybrid,dist_allreduce}] [--network-interface IF]\n"
         "                 [-x VAR[=VALUE]]... [--remote-shell TEMPLATE] [--start-timeout S]\n"
         "                 [--shutdown-timeout S] [--bin-dir DIR] [--dry-run] [--verbose]\n"
         "                 [--timeline-filename FILE] [--summary-every SECONDS]\n"
         "                 [--output-filename DIR] [--bind-to {none,core}]\n"
         "                 -- COMMAND [ARGS...]\n"
         "       hybridrun --check-build [--bin-dir DIR]\n"
         "       hybridrun --version")

DESCRIPTION = """\
Launch a hybridps job: one scheduler (always on this machine), M servers and N
workers (N copies of COMMAND). Without -H/--hostfile everything runs here, the
workers the local ranks of one node. With them, workers fill the hosts' slots in
order (the workers of a host its node's local ranks) and the
servers run colocated (one per worker host), on dedicated --server-hosts, or both
(mixed: --colocated --server-hosts). Output lines of every process are printed on
stdout with a prefix such as [scheduler], [server 0] or, across hosts, [worker 1@h2]."""

EPILOG = """\
binaries:
  hybridps-scheduler and hybridps-server are taken from --bin-dir, else from
  $HYBRIDPS_BIN_DIR (DIR/NAME or DIR/{scheduler,server}/NAME), else from the
  installed package (hybridps/bin/) or the folder of this hybridrun (a `cmake
  --install` prefix's bin/), else, run from a source tree as
  scripts/hybridrun, from <repo>/build/{scheduler,server}/, else from PATH.

environment of the workers:
  HYBRIDPS_ROLE=worker HYBRIDPS_RANK=0..N-1 HYBRIDPS_LOCAL_RANK HYBRIDPS_LOCAL_SIZE
  (here 0..N-1 and N: the workers of one host form one node and reduce locally;
  across hosts the position among, and number of, the workers of the host, and
  HYBRIDPS_NODE_ID=the host) HYBRIDPS_SCHEDULER_ADDR HYBRIDPS_SCHEDULER_PORT HYBRIDPS_NUM_WORKERS
  HYBRIDPS_NUM_SERVERS HYBRIDPS_BACKEND HYBRIDPS_JOB_TOKEN (the exported one, or the
  one in the file HYBRIDPS_JOB_TOKEN_FILE names, else a new random one; remote
  processes read it from stdin; processes with another cannot join) PYTHONUNBUFFERED=1;
  across hosts also HYBRIDPS_DEPLOYMENT HYBRIDPS_EXTRA_SERVERS and, with
  --network-interface, HYBRIDPS_INTERFACE. Local processes inherit the environment
  of hybridrun; remote ones get only these, the -x variables and the HYBRIDPS_*
  variables set here. stdin is /dev/null.

remote hosts:
  A host other than localhost is reached through the --remote-shell template
  (default: ssh -o BatchMode=yes ... {host} {command}); {command} is one argument, a
  POSIX shell command line. For network namespaces as hosts use
  --remote-shell 'ip netns exec {host} sh -c {command}'. Every host is checked
  first (the template running 'true'); the binaries and COMMAND must exist under
  the same paths there; the processes run in the current folder when it exists.
  When hybridrun stops a remote process (a rank failed, Ctrl-C) or dies, the remote
  side kills that process's whole process group.

Slurm:
  Inside an allocation (salloc, sbatch: SLURM_JOB_ID and SLURM_JOB_NODELIST set)
  and without -H/--hostfile, the worker hosts are the job's nodes (scontrol show
  hostnames), their slots SLURM_TASKS_PER_NODE (else SLURM_JOB_CPUS_PER_NODE), and
  every process runs as an srun step (srun --nodes=1 --ntasks=1 --nodelist={host}
  --overlap ...) unless --remote-shell is given; --server-hosts nodes of the job
  run servers only. --no-slurm ignores the allocation.

exit status:
  0 when every worker exited 0; the code of the first process that failed
  (128+N for signal N); 1 for a scheduler start failure, a scheduler/server
  exiting while workers run, or an unreachable host; 2 for usage errors, bad
  host lists and missing binaries;
  130/143/129 when hybridrun gets SIGINT/SIGTERM/SIGHUP."""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridrun", usage=USAGE, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-np", "--num-workers", dest="np", type=int, default=None,
                        metavar="N", help="number of worker processes (default with "
                                          "hosts: all their slots)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="worker hosts and their slots (HOST alone: 1 slot)")
    hosts.add_argument("--hostfile", metavar="FILE",
                       help="worker hosts, one per line: 'HOST slots=N'")
    parser.add_argument("--servers", type=int, default=None, metavar="M",
                        help="number of server processes (default: N here; one per "
                             "worker host or server host across hosts); none with "
                             "dist_allreduce")
    parser.add_argument("--server-hosts", metavar="HOST[:COUNT],...",
                        help="dedicated server hosts (COUNT servers each, default 1)")
    parser.add_argument("--colocated", action="store_true",
                        help="a server on every worker host (the default across hosts); "
                             "with --server-hosts: mixed deployment")
    parser.add_argument("--network-interface", metavar="IF",
                        help="interface the job talks over: the scheduler listens on "
                             "its address here, every process gets HYBRIDPS_INTERFACE=IF")
    parser.add_argument("-x", dest="export", action="append", default=[],
                        metavar="VAR[=VALUE]",
                        help="set VAR for every process (its value here unless given)")
    parser.add_argument("--remote-shell", default=None, metavar="TEMPLATE",
                        help="how to run a command on a host (default: "
                             f"{DEFAULT_REMOTE_SHELL}; in a Slurm allocation: "
                             f"{slurm.SRUN_REMOTE_SHELL})")
    parser.add_argument("--slurm", action=argparse.BooleanOptionalAction, default=None,
                        help="take the hosts from the Slurm allocation and start the "
                             "processes as srun steps (default: when SLURM_JOB_ID is set "
                             "and neither -H nor --hostfile is given)")
    parser.add_argument("--version", action="version",
                        version=f"hybridrun (hybridps) {__version__}")
    parser.add_argument("--check-build", action="store_true",
                        help="print which engines the binaries were built with and exit")
    parser.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                        help=f"value of HYBRIDPS_BACKEND (default: {DEFAULT_BACKEND})")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the hosts to answer and for the "
                             "scheduler's port (default: 60)")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                        help="seconds the scheduler and servers get to exit after "
                             "the workers finished (default: 30)")
    parser.add_argument("--bin-dir", metavar="DIR",
                        help="folder with hybridps-scheduler and hybridps-server")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the processes and their variables; start nothing")
    parser.add_argument("--verbose", action="store_true",
                        help="print each process as it starts and exits")
    parser.add_argument("--summary-every", type=float, metavar="SECONDS",
                        help="dist_hybrid: each server prints one line this often: "
                             "rounds/s, GB/s in and out, and whose push came last "
                             "(HYBRIDPS_SUMMARY_EVERY_MS)")
    parser.add_argument("--output-filename", metavar="DIR",
                        help="also write each process's output to a file of its own in "
                             "DIR (made if missing): scheduler.log, server.N.log, "
                             "worker.N.log")
    parser.add_argument("--timeline-filename", metavar="FILE",
                        help="every worker and server records where its operations "
                             "spend their time (HYBRIDPS_TIMELINE); hybridrun "
                             "merges them into FILE, a Chrome trace (Perfetto, "
                             "chrome://tracing)")
    parser.add_argument("--bind-to", choices=("none", "core"), default=None,
                        help="core: each worker binds itself to its local rank's share "
                             "of its host's cores, like mpirun --bind-to core "
                             "(HYBRIDPS_BIND_TO); for latency-bound jobs of small "
                             "tensors, not for workers that need many CPUs. Default: none")
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = make_parser()
    argv = list(argv)
    if "--check-build" in argv[:argv.index("--") if "--" in argv else len(argv)]:
        args = parser.parse_args([a for a in argv if a != "--"])
        return args
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if args.command:
            parser.error(f"unexpected arguments before '--': {' '.join(args.command)}")
        args.command = argv[cut + 1:]
    else:
        args = parser.parse_args(argv)
    if not args.command:
        parser.error("no command given; put the worker command after '--'")
    error = slurm.resolve(args, os.environ)  # --slurm, and the --remote-shell default
    if error:
        parser.error(error)
    multi = bool(args.hosts or args.hostfile or args.slurm)
    if args.np is None and not multi:
        parser.error("-np is required without -H/--hostfile")
    if args.np is not None and args.np < 1:
        parser.error("-np must be at least 1")
    if not multi and (args.server_hosts or args.colocated):
        parser.error("--server-hosts and --colocated need -H or --hostfile")
    for item in args.export:
        name = item.split("=", 1)[0]
        if not name.isidentifier():
            parser.error(f"-x {item}: {name!r} is not a variable name")
        if "=" not in item and name not in os.environ:
            parser.error(f"-x {name}: {name} is not set here (use -x {name}=VALUE)")
    if args.backend == "dist_allreduce":
        if args.servers:
            print("hybridrun: note: --servers is ignored with dist_allreduce",
                  file=sys.stderr)
        args.servers = 0
    elif args.servers is None:
        args.servers = None if multi else args.np
    elif args.servers < 1:
        parser.error(f"--backend {args.backend} needs --servers of at least 1")
    if args.start_timeout <= 0 or args.shutdown_timeout < 0:
        parser.error("--start-timeout must be positive, --shutdown-timeout not negative")
    if args.summary_every is not None and args.summary_every <= 0:
        parser.error("--summary-every takes a positive number of seconds")
    return args


class SetupError(Exception):
    """Bad hosts, template or interface: exit code 2 with this message."""


def forwarded_environment(args: argparse.Namespace) -> dict[str, str]:
    """-x variables, and across hosts the HYBRIDPS_* knobs set here (the local
    processes inherit them anyway; remote ones would not)."""
    env = {}
    if args.hosts or args.hostfile or args.slurm:
        env = {k: v for k, v in os.environ.items()
               if k.startswith("HYBRIDPS_") and k not in MANAGED_VARS
               and k != BIN_DIR_ENV}
    for item in args.export:
        name, sep, value = item.partition("=")
        env[name] = value if sep else os.environ[name]
    if args.timeline_filename:
        env["HYBRIDPS_TIMELINE"] = timeline.parts_prefix(args.timeline_filename)
    if args.bind_to:
        env["HYBRIDPS_BIND_TO"] = args.bind_to
    if args.summary_every:
        env["HYBRIDPS_SUMMARY_EVERY_MS"] = str(max(1, round(args.summary_every * 1000)))
    return env


def multi_host(args: argparse.Namespace) -> tuple[MultiHost, Host] | None:
    """Placement and hosts of a multi-host job, and the scheduler's host; None in
    local mode. Raises SetupError."""
    if not (args.hosts or args.hostfile or args.slurm):
        return None
    try:
        check_template(args.remote_shell)
        server_hosts = (parse_host_list(args.server_hosts, "--server-hosts")
                        if args.server_hosts else None)
        if args.slurm:  # the job's nodes, less the --server-hosts ones
            hosts = slurm.worker_hosts(os.environ, server_hosts)
        else:
            hosts = (parse_host_list(args.hosts) if args.hosts
                     else parse_hostfile(Path(args.hostfile)))
        placement = place(hosts=hosts, num_workers=args.np, num_servers=args.servers,
                          server_hosts=server_hosts, colocated=args.colocated,
                          backend_has_servers=args.backend != "dist_allreduce")
    except (HostSpecError, TemplateError, slurm.SlurmError) as exc:
        raise SetupError(str(exc)) from exc
    names = [h.name for h in [*hosts, *(server_hosts or [])]]
    remote = [n for n in names if n not in LOCAL_NAMES]
    try:
        if args.network_interface:
            address = interface_ipv4(args.network_interface)
        elif remote:
            address = guess_scheduler_address(remote)
        else:
            address = "127.0.0.1"
    except InterfaceError as exc:
        raise SetupError(str(exc)) from exc
    by_name = {n: Host(n, address, None if n in LOCAL_NAMES else args.remote_shell)
               for n in names}
    return MultiHost(placement, by_name), Host("localhost", address)


def job_token(environ: Mapping[str, str]) -> str:
    """The job's token: the exported HYBRIDPS_JOB_TOKEN, or the first line of the file
    HYBRIDPS_JOB_TOKEN_FILE names (only its owner may read it), so that processes started
    by hand can join with it; else a new random one. Raises SetupError."""
    direct, path = environ.get("HYBRIDPS_JOB_TOKEN"), environ.get("HYBRIDPS_JOB_TOKEN_FILE")
    if direct and path:
        raise SetupError("both HYBRIDPS_JOB_TOKEN and HYBRIDPS_JOB_TOKEN_FILE are set: "
                         "set one of them")
    token = direct
    if path:
        try:
            st = os.stat(path)
            with open(path, encoding="utf-8", errors="replace") as f:
                token = f.readline().strip()
        except OSError as exc:
            raise SetupError(f"HYBRIDPS_JOB_TOKEN_FILE={path}: {exc.strerror}") from exc
        if st.st_mode & 0o077:
            raise SetupError(f"HYBRIDPS_JOB_TOKEN_FILE={path}: others can read it "
                             f"(mode {st.st_mode & 0o7777:04o}): chmod 600 it")
        if not token:
            raise SetupError(f"HYBRIDPS_JOB_TOKEN_FILE={path}: the file holds no token")
    if token and ("\n" in token or "\r" in token):
        raise SetupError("the job token holds a line break: use one line")
    return token or secrets.token_hex(16)


def make_plan(args: argparse.Namespace, repo_root: Path | None, port_file: str) -> JobPlan:
    """Build the job plan; raises BinaryNotFoundError and SetupError."""
    multi = multi_host(args)
    num_workers, num_servers = args.np, args.servers
    scheduler_host = LOCALHOST
    if multi:
        num_workers = len(multi[0].placement.worker_hosts)
        num_servers = len(multi[0].placement.server_hosts)
        scheduler_host = multi[1]
    scheduler_bin = find_binary(SCHEDULER_BINARY, bin_dir=args.bin_dir, env=os.environ,
                                repo_root=repo_root)
    server_bin = None
    if num_servers:
        server_bin = find_binary(SERVER_BINARY, bin_dir=args.bin_dir, env=os.environ,
                                 repo_root=repo_root)
    return build_plan(num_workers=num_workers, num_servers=num_servers,
                      backend=args.backend, scheduler_bin=scheduler_bin,
                      server_bin=server_bin, command=args.command,
                      job_token=job_token(os.environ), port_file=port_file,
                      scheduler_host=scheduler_host,
                      multi=multi[0] if multi else None,
                      interface=args.network_interface,
                      extra_env=forwarded_environment(args))


def check_build(args: argparse.Namespace, repo_root: Path | None) -> int:
    """Print the engines the binaries were built with (hybridps-scheduler --build-info)."""
    scheduler_bin = find_binary(SCHEDULER_BINARY, bin_dir=args.bin_dir, env=os.environ,
                                repo_root=repo_root)
    try:
        done = subprocess.run([str(scheduler_bin), "--build-info"], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"hybridrun: cannot run {scheduler_bin} --build-info: {exc}", file=sys.stderr)
        return 1
    info = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    if done.returncode != 0 or not info:
        print(f"hybridrun: {scheduler_bin} --build-info failed (code {done.returncode}): "
              f"{done.stderr.strip()}", file=sys.stderr)
        return 1

    def mark(key: str) -> str:
        return "X" if info.get(key) == "yes" else " "

    print(f"hybridps build ({scheduler_bin.parent.parent}):\n"
          "  Available stores:\n"
          "    [X] dist_hybrid (parameter server over ZeroMQ)\n"
          f"    [{mark('Gloo')}] dist_allreduce\n"
          "  Available engines:\n"
          f"    [{mark('CUDA')}] CUDA\n"
          f"    [{mark('NCCL')}] NCCL\n"
          f"    [{mark('Gloo')}] Gloo")
    return 0


def main(argv: Sequence[str] | None = None, repo_root: Path | None = None) -> int:
    """Run hybridrun; `repo_root` is the source tree when run as scripts/hybridrun."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    output_dir = None
    if args.output_filename:
        output_dir = Path(args.output_filename)
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"hybridrun: --output-filename {output_dir}: {exc}", file=sys.stderr)
            return 2
    sink = OutputSink(output_dir=output_dir)
    if args.check_build:
        try:
            return check_build(args, repo_root)
        except BinaryNotFoundError as exc:
            sink.message(str(exc))
            return 2
    if args.dry_run:
        try:
            plan = make_plan(args, repo_root, "<temporary folder>/scheduler.port")
        except (BinaryNotFoundError, SetupError) as exc:
            sink.message(str(exc))
            return 2
        count = len(plan.processes())
        where = sorted({spec.host.name for spec in plan.processes()})
        print(f"hybridrun: dry run; would start {count} processes on "
              f"{', '.join(where)} (local ones also inherit the environment of "
              "hybridrun):")
        for spec in plan.processes():
            print(describe(spec))
        return 0
    with tempfile.TemporaryDirectory(prefix="hybridrun-") as tmp:
        try:
            plan = make_plan(args, repo_root, str(Path(tmp) / "scheduler.port"))
        except (BinaryNotFoundError, SetupError) as exc:
            sink.message(str(exc))
            return 2
        remote = sorted({s.host.name for s in plan.processes() if not s.host.is_local})
        if remote:
            if args.verbose:
                sink.message(f"checking hosts {', '.join(remote)}")
            try:
                errors = check_hosts(args.remote_shell, remote, args.start_timeout)
            except KeyboardInterrupt:  # the probes run in their own sessions and time out
                sink.message("received SIGINT while checking the hosts; nothing started")
                return 130
            for error in errors:
                sink.message(error)
            if errors:
                return 1
        options = JobOptions(start_timeout=args.start_timeout,
                             shutdown_timeout=args.shutdown_timeout,
                             verbose=args.verbose)
        if args.timeline_filename:
            timeline.prepare(args.timeline_filename)
        try:
            code = Job(plan, options, sink).run()
        finally:
            sink.close()
        if args.timeline_filename:
            sink.message(timeline.merge(args.timeline_filename,
                                        [f"{s.role} {s.index}" for s in plan.processes()
                                         if s.role in ("worker", "server")]))
        return code


def entry(repo_root: Path | None = None) -> int:
    """The `hybridrun` command (the installed console script; scripts/hybridrun)."""
    code = main(sys.argv[1:], repo_root=repo_root)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # stdout closed by a reader such as head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code
