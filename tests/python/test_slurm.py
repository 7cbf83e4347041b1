"""hybridrun under Slurm, on a real Slurm cluster that this file starts on this machine.

The cluster: munged (a generated key, its socket, log and seed in a temporary folder),
slurmctld and three slurmd, nodes n1, n2 and n3, each slurmd on a port of its own
(several slurmd on one machine: NodeName=nK NodeAddr=127.0.0.1 Port=P), from a
generated slurm.conf in that folder (no cgroups: proctrack/linuxproc, task/none;
select/cons_tres), every daemon in the foreground as a child of this test, run as root.
Clients find the cluster through SLURM_CONF; nothing is written under /etc. A daemon
that does not start fails the tests with its log: nothing here skips.

The jobs: 2 workers (hybridps-test-worker, which checks every sum exactly each round)
and 2 servers, through the sbatch templates of examples/slurm/ (colocated: n1 and n2;
dedicated: workers on n1 and n2, both servers on n3) and through hybridrun inside
salloc; a worker that kills itself, a server killed by pid, and scancel, each of which
must end the job non-zero (naming the rank and its node) with no process left. The
teardown cancels every job and stops every daemon, also after a failure.

Run as root: HYBRIDPS_BUILD_DIR=build .venv/bin/python -m pytest -q tests/python/test_slurm.py
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "mxnet_kvstore"))
from hybridps.launcher import slurm  # noqa: E402
from procs import pids_with  # noqa: E402

HYBRIDRUN = REPO / "scripts" / "hybridrun"
EXAMPLES = REPO / "examples" / "slurm"
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR") or REPO / "build")
TEST_WORKER = BUILD / "tests" / "multiproc" / "hybridps-test-worker"
NODES = ("n1", "n2", "n3")
CPUS_PER_NODE = 4
DAEMON_START_S = 90.0  # s: for each daemon to answer, on a loaded machine
JOB_DEADLINE_S = 180.0  # s: the most one job may take, from submission to its end
CLIENT_TIMEOUT_S = 60.0  # s: one scontrol/squeue/scancel/sbatch call
STOP_GRACE_S = 15.0     # s: a daemon's time to exit on SIGTERM before SIGKILL
MARKER_VAR = "HYBRIDPS_TEST_MARKER"  # in every process of a test job (and hybridrun)
DAEMON_MARKER_VAR = "HPS_SLURM_TEST_CLUSTER"  # in the daemons and their slurmstepd
END_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
              "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}

# Fast failure detection; small partitions so that the tensors span both servers.
JOB_ENV = {
    "HYBRIDPS_HEARTBEAT_INTERVAL_MS": "100",
    "HYBRIDPS_HEARTBEAT_TIMEOUT_MS": "2000",
    "HYBRIDPS_PARTITION_BYTES": "4096",
    "HYBRIDPS_TIMEOUT_MS": "60000",
    "HYBRIDPS_START_TIMEOUT_MS": "60000",
}


# ---- pure parsing (no cluster) ---------------------------------------------------------

def test_slurm_counts_expand() -> None:
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("4") == [4]
    with pytest.raises(slurm.SlurmError, match="cannot read the per-node count"):
        slurm.expand_counts("2(x)")


def test_slurm_detection_and_what_wins() -> None:
    alloc = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}

    def resolved(environ: dict[str, str], **given: object) -> argparse.Namespace:
        args = argparse.Namespace(hosts=None, hostfile=None, slurm=None, remote_shell=None)
        vars(args).update(given)
        assert slurm.resolve(args, environ) is None
        return args

    args = resolved(alloc)  # automatic inside an allocation: srun steps
    assert args.slurm and args.remote_shell == slurm.SRUN_REMOTE_SHELL
    args = resolved({})  # outside: ssh, as before
    assert not args.slurm and args.remote_shell.startswith("ssh ")
    args = resolved(alloc, hosts="a,b")  # -H wins: its hosts over ssh
    assert not args.slurm and args.remote_shell.startswith("ssh ")
    args = resolved(alloc, remote_shell="rsh {host} {command}")  # Slurm's hosts, rsh
    assert args.slurm and args.remote_shell == "rsh {host} {command}"
    assert not resolved(alloc, slurm=False).slurm  # --no-slurm
    bad = argparse.Namespace(hosts=None, hostfile=None, slurm=True, remote_shell=None)
    assert "not inside a Slurm allocation" in (slurm.resolve(bad, {}) or "")
    bad.hosts = "a"
    assert "drop -H/--hostfile" in (slurm.resolve(bad, alloc) or "")


# ---- the cluster -----------------------------------------------------------------------

def _die_with_parent() -> None:
    """In a daemon's child before exec: SIGTERM it when this test process dies, so that
    not even a killed test (a CTest timeout) leaves daemons running."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_ports(count: int) -> list[int]:
    """Distinct ports free now (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _processes_with(needle: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``needle`` (NAME=VALUE)."""
    return pids_with(*needle.split("=", 1))


def _environ(pid: int) -> set[str]:
    """The NAME=VALUE items of a process's environment (empty once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return set()
    return {item.decode(errors="replace") for item in raw.split(b"\0") if item}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    logs: list[Path]

    def log_text(self) -> str:
        parts = []
        for path in self.logs:
            try:
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-6000:]}")
            except OSError:
                parts.append(f"--- {path.name}: absent")
        return "\n".join(parts)


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]          # a client's environment: SLURM_CONF, no HYBRIDPS_*
    daemons: list[Daemon] = field(default_factory=list)

    def client(self, *argv: str, timeout: float = CLIENT_TIMEOUT_S,
               env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                              timeout=timeout, env=env or self.env, cwd=cwd or self.root,
                              stdin=subprocess.DEVNULL)

    def logs(self) -> str:
        return "\n".join(f"=== {d.name}\n{d.log_text()}" for d in self.daemons)

    def wait_until(self, what: str, check: Callable[[], bool], deadline_s: float) -> None:
        """Poll ``check`` until it holds; fail with every daemon's log when a daemon
        exited or the deadline passed."""
        deadline = time.monotonic() + deadline_s
        while not check():
            dead = [d for d in self.daemons if d.proc.poll() is not None]
            if dead:
                pytest.fail(f"{', '.join(d.name for d in dead)} exited (code "
                            f"{dead[0].proc.returncode}) while waiting for {what}:\n"
                            f"{self.logs()}", pytrace=False)
            if time.monotonic() >= deadline:
                pytest.fail(f"no {what} within {deadline_s:g} s:\n{self.logs()}",
                            pytrace=False)
            time.sleep(0.2)

    def nodes_idle(self) -> bool:
        try:
            done = self.client("sinfo", "-h", "-N", "-o", "%N %T")
        except subprocess.TimeoutExpired:
            return False
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in NODES)

    def wait_idle(self) -> None:
        """Every node idle: a job submitted now gets the first nodes, n1 first (those
        of the job before may still be completing)."""
        self.wait_until("nodes n1..n3 idle (sinfo)", self.nodes_idle, DAEMON_START_S)

    def start(self, name: str, argv: list[str], logs: list[Path]) -> Daemon:
        out = self.root / "log" / f"{name}.out"
        env = {**self.env, DAEMON_MARKER_VAR: str(self.root)}
        with open(out, "wb") as sink:
            try:
                proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, cwd=self.root,
                                        preexec_fn=_die_with_parent)
            except OSError as exc:
                pytest.fail(f"cannot start {name} ({argv[0]}): {exc}; install slurm-wlm "
                            "and munge (scripts/install-deps.sh)", pytrace=False)
        daemon = Daemon(name, proc, [out, *logs])
        self.daemons.append(daemon)
        return daemon


def _write_config(root: Path, ports: list[int]) -> Path:
    host = socket.gethostname()
    lines = [
        f"ClusterName=hpstest{ports[0]}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/run/munge.socket",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        # No cgroups (none are delegated here): processes tracked through /proc.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        # Three nodes of CPUS_PER_NODE CPUs on this machine, whatever it has.
        "SlurmdParameters=config_overrides",
        "MailProg=/bin/true",
        "KillWait=5",
        "InactiveLimit=0",
        "MinJobAge=600",  # finished jobs stay visible to scontrol show job
        "MessageTimeout=30",
    ]
    for node, port in zip(NODES, ports[1:]):
        lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                     f"CPUs={CPUS_PER_NODE} State=UNKNOWN")
    lines.append("PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _start_cluster(cluster: Cluster) -> None:
    root = cluster.root
    for sub in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
        (root / sub).mkdir(parents=True)
    # munged checks permissions: its key only root's, its socket folder reachable by all.
    (root / "munge").chmod(0o700)
    (root / "run").mkdir(mode=0o755)
    root.chmod(0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    socket_path = root / "run" / "munge.socket"
    munged = cluster.start("munged", [
        "munged", "--foreground", f"--socket={socket_path}", f"--key-file={key}",
        f"--log-file={root}/log/munged.log", f"--pid-file={root}/run/munged.pid",
        f"--seed-file={root}/munge/munged.seed"], [])  # in the foreground it logs to stderr

    def munge_answers() -> bool:
        if not socket_path.exists():
            return False
        try:
            cred = subprocess.run(["munge", "-n", f"--socket={socket_path}"],
                                  capture_output=True, timeout=CLIENT_TIMEOUT_S)
            back = subprocess.run(["unmunge", f"--socket={socket_path}"], input=cred.stdout,
                                  capture_output=True, timeout=CLIENT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return cred.returncode == 0 and back.returncode == 0

    cluster.wait_until(f"answer from {munged.name}", munge_answers, DAEMON_START_S)

    ports = _free_ports(1 + len(NODES))
    conf = _write_config(root, ports)
    cluster.env["SLURM_CONF"] = str(conf)
    ctld = cluster.start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)],
                         [root / "log" / "slurmctld.log"])

    def controller_up() -> bool:
        try:
            done = cluster.client("scontrol", "ping")
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0 and " is UP" in done.stdout

    cluster.wait_until(f"answer from {ctld.name} (scontrol ping)", controller_up,
                       DAEMON_START_S)
    for node in NODES:
        cluster.start(f"slurmd {node}", ["slurmd", "-D", "-N", node, "-f", str(conf)],
                      [root / "log" / f"slurmd-{node}.log"])

    cluster.wait_idle()


def _stop_cluster(cluster: Cluster) -> list[str]:
    """Cancel every job, stop every daemon (SIGTERM, then SIGKILL), kill what they left
    (slurmstepd), remove the folder. Returns what went wrong, for the caller to report."""
    problems = []
    if "SLURM_CONF" in cluster.env and any(d.proc.poll() is None for d in cluster.daemons):
        try:
            jobs = cluster.client("squeue", "-h", "-o", "%i").stdout.split()
            if jobs:
                cluster.client("scancel", *jobs)
                deadline = time.monotonic() + 60
                while (cluster.client("squeue", "-h", "-o", "%i").stdout.split()
                       and time.monotonic() < deadline):
                    time.sleep(0.5)
        except subprocess.TimeoutExpired as exc:
            problems.append(f"cancelling the jobs: {exc}")
    for daemon in reversed(cluster.daemons):  # the slurmd, slurmctld, munged last
        if daemon.proc.poll() is None:
            daemon.proc.terminate()
            try:
                daemon.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                problems.append(f"{daemon.name} ignored SIGTERM for {STOP_GRACE_S:g} s")
                daemon.proc.kill()
                daemon.proc.wait()
    # slurmstepd of a step that was ending may take a moment more.
    deadline = time.monotonic() + 15
    while (_processes_with(f"{DAEMON_MARKER_VAR}={cluster.root}")
           and time.monotonic() < deadline):
        time.sleep(0.2)
    for pid in _processes_with(f"{DAEMON_MARKER_VAR}={cluster.root}"):
        problems.append(f"a process the daemons left (pid {pid}) was killed")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(cluster.root, ignore_errors=True)
    return problems


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.fail("the Slurm tests start slurmd, which must run as root", pytrace=False)
    for name in ("munged", "slurmctld", "slurmd", "sbatch", "salloc", "scontrol"):
        if shutil.which(name) is None:
            pytest.fail(f"{name} is not installed: install slurm-wlm and munge "
                        "(scripts/install-deps.sh)", pytrace=False)
    if not TEST_WORKER.exists():
        pytest.fail(f"{TEST_WORKER} is not built", pytrace=False)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HYBRIDPS_", "SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
    made = Cluster(Path(tempfile.mkdtemp(prefix="hybridps-slurm-")), env)
    problems: list[str] = []
    try:
        _start_cluster(made)
        yield made
    finally:
        problems = _stop_cluster(made)
    assert not problems, "; ".join(problems)


# ---- jobs ------------------------------------------------------------------------------

def job_env(cluster: Cluster, marker: str) -> dict[str, str]:
    """What a test job is submitted with: the knobs above, the binaries of BUILD, the
    marker that finds its processes, and HYBRIDRUN for the templates."""
    return {**cluster.env, **JOB_ENV, MARKER_VAR: marker, "HYBRIDPS_BIN_DIR": str(BUILD),
            "HYBRIDRUN": str(HYBRIDRUN)}


def new_marker(name: str) -> str:
    return f"slurm-{name}-{os.getpid()}-{time.monotonic_ns()}"


def assert_nothing_left(cluster: Cluster, marker: str, job: str) -> None:
    """No process of the job on any node, and no step of it left in Slurm."""
    deadline = time.monotonic() + 30
    while _processes_with(f"{MARKER_VAR}={marker}") and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _processes_with(f"{MARKER_VAR}={marker}")
    for pid in left:  # ours: the test's own job
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes of job {job} are still running: {left}"
    steps = cluster.client("squeue", "-h", "-s", "-j", job, "-o", "%i")
    assert not steps.stdout.strip(), f"steps of job {job} are left: {steps.stdout}"


def assert_all_rounds_ok(out: str, rounds: int = 5) -> None:
    """Both workers checked every sum of every round (the worker compares each element
    with the exact expected value), on their nodes."""
    for rank, node in ((0, "n1"), (1, "n2")):
        lines = [line.split("] ", 1)[1] for line in out.splitlines()
                 if line.startswith(f"[worker {rank}@{node}] ")]
        assert [l for l in lines if re.fullmatch(r"round \d+ ok", l)] == [
            f"round {k} ok" for k in range(rounds)], out
        assert f"worker {rank}: all {rounds} rounds ok" in lines, out


@dataclass
class BatchJob:
    id: str
    output: Path


def submit(cluster: Cluster, template: str, marker: str, hybridrun_args: list[str],
           folder: Path) -> BatchJob:
    """sbatch one of examples/slurm/ with hybridrun's arguments; its output to folder."""
    output = folder / "job-%j.out"
    cluster.wait_idle()
    done = cluster.client("sbatch", "--parsable", f"--output={output}",
                          str(EXAMPLES / template), "--network-interface", "lo",
                          *hybridrun_args, env=job_env(cluster, marker), cwd=folder)
    assert done.returncode == 0, f"sbatch failed: {done.stderr}\n{cluster.logs()}"
    job = done.stdout.strip().split(";")[0]
    return BatchJob(job, folder / f"job-{job}.out")


def job_fields(cluster: Cluster, job: str) -> dict[str, str]:
    done = cluster.client("scontrol", "-o", "show", "job", job)
    assert done.returncode == 0, done.stderr
    return dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)


def wait_for_end(cluster: Cluster, job: BatchJob) -> tuple[dict[str, str], str]:
    """Wait (JOB_DEADLINE_S at most) for the job to end; its fields and whole output."""
    deadline = time.monotonic() + JOB_DEADLINE_S
    while True:
        fields = job_fields(cluster, job.id)
        if fields.get("JobState") in END_STATES:
            break
        if time.monotonic() >= deadline:
            cluster.client("scancel", job.id)
            out = job.output.read_text(errors="replace") if job.output.exists() else ""
            pytest.fail(f"job {job.id} still {fields.get('JobState')} after "
                        f"{JOB_DEADLINE_S:g} s:\n{out}\n{cluster.logs()}", pytrace=False)
        time.sleep(0.25)
    # The output file is complete once the job ended (slurmstepd closed it).
    return fields, job.output.read_text(errors="replace")


def wait_for_line(job: BatchJob, pattern: str) -> None:
    """Wait until the running job's output has a line matching pattern."""
    deadline = time.monotonic() + JOB_DEADLINE_S
    regex = re.compile(pattern, re.MULTILINE)
    while True:
        out = job.output.read_text(errors="replace") if job.output.exists() else ""
        if regex.search(out):
            return
        assert time.monotonic() < deadline, f"no line matching {pattern!r} in:\n{out}"
        time.sleep(0.2)


def salloc(cluster: Cluster, marker: str, nodes: int, hybridrun_args: list[str],
           folder: Path) -> subprocess.CompletedProcess[str]:
    """hybridrun inside `salloc -N nodes --ntasks-per-node=1`; its whole output."""
    cluster.wait_idle()
    return cluster.client("salloc", f"--nodes={nodes}", "--ntasks-per-node=1",
                          sys.executable, str(HYBRIDRUN), *hybridrun_args,
                          env=job_env(cluster, marker), cwd=folder, timeout=JOB_DEADLINE_S)


def job_id_of(stderr: str) -> str:
    match = re.search(r"Granted job allocation (\d+)", stderr)
    assert match, stderr
    return match.group(1)


WORKER = [str(TEST_WORKER), "--rounds", "5"]
# A job that runs long enough for something to happen to it.
LONG_WORKER = [str(TEST_WORKER), "--rounds", "100000", "--sleep-ms", "50"]


# ---- tests -----------------------------------------------------------------------------

def test_sbatch_colocated_template(cluster: Cluster, tmp_path: Path) -> None:
    marker = new_marker("colocated")
    job = submit(cluster, "colocated.sbatch", marker, ["--", *WORKER], tmp_path)
    fields, out = wait_for_end(cluster, job)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert fields["NodeList"] == "n[1-2]"
    assert_all_rounds_ok(out)
    # One server on each node beside its worker.
    assert "[server 0@n1] " in out and "[server 1@n2] " in out, out
    assert_nothing_left(cluster, marker, job.id)


def test_sbatch_dedicated_template(cluster: Cluster, tmp_path: Path) -> None:
    marker = new_marker("dedicated")
    job = submit(cluster, "dedicated.sbatch", marker, ["--", *WORKER], tmp_path)
    fields, out = wait_for_end(cluster, job)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert fields["NodeList"] == "n[1-3]"
    assert_all_rounds_ok(out)
    # Both servers on the last node, which runs no worker.
    assert "[server 0@n3] " in out and "[server 1@n3] " in out, out
    assert not re.search(r"^\[worker \d+@n3\]", out, re.MULTILINE), out
    assert_nothing_left(cluster, marker, job.id)


def test_hybridrun_in_salloc(cluster: Cluster, tmp_path: Path) -> None:
    marker = new_marker("salloc")
    done = salloc(cluster, marker, 2, ["--network-interface", "lo", "--servers", "2",
                                       "--", *WORKER], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_all_rounds_ok(done.stdout)
    assert "[server 0@n1] " in done.stdout and "[server 1@n2] " in done.stdout
    assert_nothing_left(cluster, marker, job_id_of(done.stderr))


def test_salloc_dry_run_hosts_and_what_wins(cluster: Cluster, tmp_path: Path) -> None:
    marker = new_marker("dry")

    def dry_run(nodes: str, *args: str) -> subprocess.CompletedProcess[str]:
        cluster.wait_idle()
        return cluster.client("salloc", f"--nodes={nodes}", "--ntasks-per-node=2",
                              sys.executable, str(HYBRIDRUN), "--network-interface", "lo",
                              "--dry-run", *args, "--", "true",
                              env=job_env(cluster, marker), cwd=tmp_path)

    # The allocation's nodes and tasks; srun steps; --server-hosts nodes run no worker.
    done = dry_run("3", "--server-hosts", "n3:2")
    assert done.returncode == 0, done.stderr
    labels = re.findall(r"^\[(\S+ \d+@\S+)\] on ", done.stdout, re.MULTILINE)
    assert sorted(labels) == ["server 0@n3", "server 1@n3", "worker 0@n1", "worker 1@n1",
                              "worker 2@n2", "worker 3@n2"], done.stdout
    assert "(through srun --nodes=1 --ntasks=1 --nodelist={host} --overlap" in done.stdout
    # -H wins over the allocation: its hosts, over ssh.
    done = dry_run("1", "-H", "x1,x2")
    assert done.returncode == 0, done.stderr
    assert "[worker 1@x2] on x2" in done.stdout and "(through ssh " in done.stdout
    # --remote-shell wins over srun; the hosts still come from Slurm.
    done = dry_run("2", "-np", "3", "--remote-shell", "rsh {host} {command}")
    assert done.returncode == 0, done.stderr
    assert "[worker 2@n2] on n2" in done.stdout and "(through rsh {host}" in done.stdout
    # --no-slurm ignores the allocation: everything here.
    done = dry_run("2", "--no-slurm", "-np", "2")
    assert done.returncode == 0, done.stderr
    assert "[worker 1] on localhost" in done.stdout and "srun" not in done.stdout
    # A --server-hosts node outside the job is refused, naming it.
    done = dry_run("2", "--server-hosts", "n9")
    assert done.returncode == 2 and "--server-hosts n9: not a node of Slurm job" in \
        done.stderr, done.stderr


def test_dead_worker_ends_the_salloc_job(cluster: Cluster, tmp_path: Path) -> None:
    marker = new_marker("die")
    done = salloc(cluster, marker, 2, ["--network-interface", "lo", "--servers", "2", "--",
                                       *LONG_WORKER, "--die-rank", "1", "--die-round", "3"],
                  tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 137, out  # salloc exits with hybridrun's code
    assert "hybridrun: worker 1@n2 exited with code 137 (killed by SIGKILL?); stopping " \
        "the job" in done.stderr, out
    assert_nothing_left(cluster, marker, job_id_of(done.stderr))


def test_killed_server_fails_the_batch_job(cluster: Cluster, tmp_path: Path) -> None:
    marker = new_marker("kill")
    job = submit(cluster, "dedicated.sbatch", marker, ["--", *LONG_WORKER], tmp_path)
    wait_for_line(job, r"^\[worker 1@n2\] round 3 ok$")
    server = [pid for pid in _processes_with(f"{MARKER_VAR}={marker}")
              if {"HYBRIDPS_ROLE=server", "HYBRIDPS_RANK=1"} <= _environ(pid)]
    assert len(server) == 1, server
    os.kill(server[0], signal.SIGKILL)
    fields, out = wait_for_end(cluster, job)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "137:0"), out
    assert "hybridrun: server 1@n3 exited with code 137 (killed by SIGKILL?); stopping " \
        "the job" in out, out
    assert_nothing_left(cluster, marker, job.id)


def test_scancel_ends_every_step(cluster: Cluster, tmp_path: Path) -> None:
    marker = new_marker("scancel")
    job = submit(cluster, "colocated.sbatch", marker, ["--", *LONG_WORKER], tmp_path)
    wait_for_line(job, r"^\[worker 1@n2\] round 3 ok$")
    assert cluster.client("scancel", job.id).returncode == 0
    fields, out = wait_for_end(cluster, job)
    assert fields["JobState"] == "CANCELLED", out
    assert_nothing_left(cluster, marker, job.id)


def test_killed_hybridrun_leaves_no_step(cluster: Cluster, tmp_path: Path) -> None:
    """hybridrun SIGKILLed while the allocation lives on (salloc's shell goes on): the
    closed stdin of every srun step makes its wrapper end the process."""
    marker = new_marker("sigkill")
    pid_file, stop, err = tmp_path / "hybridrun.pid", tmp_path / "stop", tmp_path / "err"
    # After hybridrun, the shell (and so the allocation) lives on until `stop` exists,
    # 120 s at most.
    shell = (f"{shlex.quote(sys.executable)} {shlex.quote(str(HYBRIDRUN))} "
             "--network-interface lo --servers 2 -- "
             f"{shlex.join(LONG_WORKER)} > {tmp_path}/out 2>&1 & "
             f"echo $! > {pid_file}; wait; n=0; "
             f"while [ ! -e {stop} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done")
    cluster.wait_idle()
    with open(err, "wb") as err_file:
        salloc_proc = subprocess.Popen(
            ["salloc", "--nodes=2", "--ntasks-per-node=1", "sh", "-c", shell],
            env=job_env(cluster, marker), cwd=tmp_path, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err_file)
    try:
        wait_for_line(BatchJob("", tmp_path / "out"), r"^\[worker 1@n2\] round 3 ok$")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        # Every server and worker, and every srun, ends; salloc's shell waits on.
        deadline = time.monotonic() + 60
        while True:
            left = [pid for pid in _processes_with(f"{MARKER_VAR}={marker}")
                    if any(item.startswith("HYBRIDPS_ROLE=") for item in _environ(pid))
                    or _comm(pid) == "srun"]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        assert not left, f"still running 60 s after hybridrun's death: {left}"
        assert salloc_proc.poll() is None  # the allocation was alive all along
    finally:
        stop.touch()  # the shell ends, and salloc gives the allocation back
        try:
            salloc_proc.wait(timeout=CLIENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            salloc_proc.kill()
            salloc_proc.wait()
    assert salloc_proc.returncode == 0, err.read_text()
    assert_nothing_left(cluster, marker, job_id_of(err.read_text()))
