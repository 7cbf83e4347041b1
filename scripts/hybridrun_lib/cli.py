"""Command line of hybridrun."""
from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .binaries import SCHEDULER_BINARY, SERVER_BINARY, BinaryNotFoundError, find_binary
from .job import Job, JobOptions
from .plan import BACKENDS, DEFAULT_BACKEND, JobPlan, build_plan, describe
from .process import OutputSink

USAGE = ("hybridrun -np N [--servers M] [--backend {dist_hybrid,dist_allreduce}]\n"
         "                 [--start-timeout S] [--shutdown-timeout S] [--bin-dir DIR]\n"
         "                 [--dry-run] [--verbose] -- COMMAND [ARGS...]")

DESCRIPTION = """\
Launch a hybridps job on this machine: one scheduler, M servers and N workers
(N copies of COMMAND). Output lines of every process are printed on stdout with
a prefix such as [scheduler], [server 0] or [worker 1]."""

EPILOG = """\
binaries:
  hybridps-scheduler and hybridps-server are taken from --bin-dir, else from
  $HYBRIDPS_BIN_DIR (DIR/NAME or DIR/{scheduler,server}/NAME), else from
  <repo>/build/{scheduler,server}/, else from PATH.

environment of the workers:
  HYBRIDPS_ROLE=worker HYBRIDPS_RANK=0..N-1 HYBRIDPS_LOCAL_RANK=0..N-1
  HYBRIDPS_LOCAL_SIZE=N HYBRIDPS_SCHEDULER_ADDR HYBRIDPS_SCHEDULER_PORT
  HYBRIDPS_NUM_WORKERS HYBRIDPS_NUM_SERVERS HYBRIDPS_BACKEND HYBRIDPS_JOB_TOKEN
  PYTHONUNBUFFERED=1, plus the inherited environment. stdin is /dev/null.

exit status:
  0 when every worker exited 0; the code of the first process that failed
  (128+N for signal N); 1 for a scheduler start failure or a scheduler/server
  exiting while workers run; 2 for usage errors and missing binaries;
  130/143/129 when hybridrun gets SIGINT/SIGTERM/SIGHUP."""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridrun", usage=USAGE, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-np", "--num-workers", dest="np", type=int, required=True,
                        metavar="N", help="number of worker processes")
    parser.add_argument("--servers", type=int, default=None, metavar="M",
                        help="number of server processes (default: N); "
                             "none with dist_allreduce")
    parser.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                        help=f"value of HYBRIDPS_BACKEND (default: {DEFAULT_BACKEND})")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the scheduler's port (default: 60)")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                        help="seconds the scheduler and servers get to exit after "
                             "the workers finished (default: 30)")
    parser.add_argument("--bin-dir", metavar="DIR",
                        help="folder with hybridps-scheduler and hybridps-server")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the processes and their variables; start nothing")
    parser.add_argument("--verbose", action="store_true",
                        help="print each process as it starts and exits")
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = make_parser()
    argv = list(argv)
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
    if args.np < 1:
        parser.error("-np must be at least 1")
    if args.backend == "dist_allreduce":
        if args.servers:
            print("hybridrun: note: --servers is ignored with dist_allreduce",
                  file=sys.stderr)
        args.servers = 0
    elif args.servers is None:
        args.servers = args.np
    elif args.servers < 1:
        parser.error(f"--backend {args.backend} needs --servers of at least 1")
    if args.start_timeout <= 0 or args.shutdown_timeout < 0:
        parser.error("--start-timeout must be positive, --shutdown-timeout not negative")
    return args


def make_plan(args: argparse.Namespace, repo_root: Path, port_file: str) -> JobPlan:
    """Build the job plan; raises BinaryNotFoundError."""
    scheduler_bin = find_binary(SCHEDULER_BINARY, bin_dir=args.bin_dir, env=os.environ,
                                repo_root=repo_root)
    server_bin = None
    if args.servers:
        server_bin = find_binary(SERVER_BINARY, bin_dir=args.bin_dir, env=os.environ,
                                 repo_root=repo_root)
    return build_plan(num_workers=args.np, num_servers=args.servers,
                      backend=args.backend, scheduler_bin=scheduler_bin,
                      server_bin=server_bin, command=args.command,
                      job_token=secrets.token_hex(16), port_file=port_file)


def main(argv: Sequence[str] | None = None, repo_root: Path | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if repo_root is None:
        repo_root = Path(__file__).resolve().parent.parent.parent
    sink = OutputSink()
    if args.dry_run:
        try:
            plan = make_plan(args, repo_root, "<temporary folder>/scheduler.port")
        except BinaryNotFoundError as exc:
            sink.message(str(exc))
            return 2
        count = len(plan.processes())
        print(f"hybridrun: dry run; would start {count} processes on localhost "
              "(each also inherits the environment of hybridrun):")
        for spec in plan.processes():
            print(describe(spec))
        return 0
    with tempfile.TemporaryDirectory(prefix="hybridrun-") as tmp:
        try:
            plan = make_plan(args, repo_root, str(Path(tmp) / "scheduler.port"))
        except BinaryNotFoundError as exc:
            sink.message(str(exc))
            return 2
        options = JobOptions(start_timeout=args.start_timeout,
                             shutdown_timeout=args.shutdown_timeout,
                             verbose=args.verbose)
        return Job(plan, options, sink).run()
