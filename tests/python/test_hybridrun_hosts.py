"""Tests of hybridrun across hosts.

- Parsing and placement (-H, --hostfile, --server-hosts, --colocated, -x) through
  --dry-run, and their errors: no real processes.
- The remote path without root: "hosts" started through a template that runs a local
  shell (sh -c {command}), with the real scheduler, servers and hybridps-test-worker.
- The real thing as root: network namespaces made by scripts/emulated-cluster, the
  template `ip netns exec {host} sh -c {command}`, both backends, a killed rank, and
  Ctrl-C; afterwards no process may be left in any namespace. The namespaces are
  removed even when a test fails.

Binaries come from $HYBRIDPS_BUILD_DIR (CTest sets it), else <repo>/build.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import alive, pids_with  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HYBRIDRUN = REPO / "scripts" / "hybridrun"
EMULATED_CLUSTER = REPO / "scripts" / "emulated-cluster"
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR") or REPO / "build")
TEST_WORKER = BUILD / "tests" / "multiproc" / "hybridps-test-worker"
SCHEDULER = BUILD / "scheduler" / "hybridps-scheduler"
RUN_TIMEOUT = 60.0     # s: the most one job may take
FAILURE_BOUND = 20.0   # s: from a killed rank to hybridrun's exit
LOCAL_SHELL = "sh -c {command} {host}"  # a "remote" host that is this machine

JOB_ENV = {
    "HYBRIDPS_HEARTBEAT_INTERVAL_MS": "100",
    "HYBRIDPS_HEARTBEAT_TIMEOUT_MS": "2000",
    "HYBRIDPS_PARTITION_BYTES": "4096",
    "HYBRIDPS_TIMEOUT_MS": "30000",
    "HYBRIDPS_START_TIMEOUT_MS": "30000",
}

needs_build = pytest.mark.skipif(not (TEST_WORKER.exists() and SCHEDULER.exists()),
                                 reason=f"binaries not built in {BUILD}")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDPS_")}
    env.update(extra)
    return env


def hybridrun(*args: str, env: dict[str, str] | None = None,
              timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HYBRIDRUN), *args], capture_output=True,
                          text=True, timeout=timeout, env=env or clean_env(),
                          stdin=subprocess.DEVNULL)


def dry_run(*args: str) -> dict[str, dict[str, str]]:
    """Run --dry-run; return {label: {host, VAR: value...}} of every process."""
    done = hybridrun("--bin-dir", str(BUILD), "--remote-shell", LOCAL_SHELL,
                     "--network-interface", "lo", "--dry-run", *args, "--", "true")
    assert done.returncode == 0, done.stderr
    procs: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in done.stdout.splitlines():
        m = re.match(r"\[(.+?)\] on (\S+): ", line)
        if m:
            current = procs.setdefault(m.group(1), {"host": m.group(2)})
        elif line.startswith("    ") and "=" in line:
            key, value = line.strip().split("=", 1)
            current[key] = value
    return procs


# ---- parsing and placement ------------------------------------------------------------

@needs_build
def test_slots_fill_hosts_in_order_and_colocated_servers() -> None:
    procs = dry_run("-np", "3", "-H", "a:2,b:2")
    workers = {k: v for k, v in procs.items() if k.startswith("worker")}
    assert sorted(workers) == ["worker 0@a", "worker 1@a", "worker 2@b"]
    assert [(workers[f"worker {r}@{h}"]["HYBRIDPS_LOCAL_RANK"],
             workers[f"worker {r}@{h}"]["HYBRIDPS_LOCAL_SIZE"])
            for r, h in ((0, "a"), (1, "a"), (2, "b"))] == [("0", "2"), ("1", "2"),
                                                            ("0", "1")]
    assert sorted(k for k in procs if k.startswith("server")) == ["server 0@a",
                                                                  "server 1@b"]
    for spec in procs.values():
        assert spec["HYBRIDPS_NUM_WORKERS"] == "3"
        assert spec["HYBRIDPS_NUM_SERVERS"] == "2"
        assert spec["HYBRIDPS_DEPLOYMENT"] == "colocated"
        assert spec["HYBRIDPS_SCHEDULER_ADDR"] == "127.0.0.1"  # the address of lo
        assert spec["HYBRIDPS_INTERFACE"] == "lo"
    assert procs["scheduler"]["host"] == "localhost"


@needs_build
def test_dedicated_and_mixed_server_placement(tmp_path: Path) -> None:
    procs = dry_run("-H", "a,b", "--server-hosts", "s1,s2:2")
    servers = sorted(k for k in procs if k.startswith("server"))
    assert servers == ["server 0@s1", "server 1@s2", "server 2@s2"]
    assert procs["worker 0@a"]["HYBRIDPS_DEPLOYMENT"] == "dedicated"

    procs = dry_run("-H", "a,b", "--server-hosts", "s1,s2", "--servers", "3")
    assert sorted(k for k in procs if k.startswith("server")) == [
        "server 0@s1", "server 1@s2", "server 2@s1"]

    hostfile = tmp_path / "hosts"
    hostfile.write_text("# workers\na slots=2\n\nb   slots=1  # comment\n")
    procs = dry_run("--hostfile", str(hostfile), "--colocated", "--server-hosts", "s1")
    assert sorted(k for k in procs if k.startswith("server")) == [
        "server 0@a", "server 1@b", "server 2@s1"]
    assert sorted(k for k in procs if k.startswith("worker")) == [
        "worker 0@a", "worker 1@a", "worker 2@b"]
    for spec in procs.values():
        assert spec["HYBRIDPS_DEPLOYMENT"] == "mixed"
        assert spec["HYBRIDPS_EXTRA_SERVERS"] == "1"


@needs_build
def test_export_variables() -> None:
    env = clean_env(HYBRIDRUN_TEST_VALUE="from-here", HYBRIDPS_LOG_LEVEL="1")
    done = hybridrun("--bin-dir", str(BUILD), "--remote-shell", LOCAL_SHELL, "--dry-run",
                     "-H", "a", "-x", "HYBRIDRUN_TEST_VALUE", "-x", "OTHER=x y",
                     "--", "true", env=env)
    assert done.returncode == 0, done.stderr
    assert "    HYBRIDRUN_TEST_VALUE=from-here" in done.stdout
    assert "    OTHER='x y'" in done.stdout
    assert "    HYBRIDPS_LOG_LEVEL=1" in done.stdout  # forwarded to remote hosts


BAD_SPECS = [
    (["-H", "a:0"], "slots must be a positive integer, not '0'"),
    (["-H", "a:x"], "slots must be a positive integer, not 'x'"),
    (["-H", "a:1:2"], "expected HOST or HOST:SLOTS"),
    (["-H", "a,,b"], "empty entry"),
    (["-H", "a,a:2"], "host 'a' is listed twice"),
    (["-H", "bad/host"], "'bad/host' is not a valid host name"),
    (["-H", "a:2,b:2", "-np", "5"], "-np 5 is more than the 4 slots of the hosts "
                                    "(a:2, b:2)"),
    (["-H", "a,b", "--server-hosts", "b"], "--server-hosts b also run workers"),
    (["-H", "a", "--server-hosts", "s", "--colocated", "--servers", "2"],
     "drop --servers"),
    (["-H", "a", "--remote-shell", "ssh {host}"], "needs {command} as a word"),
    (["-H", "a", "--network-interface", "nosuchif0"],
     "--network-interface nosuchif0: no such interface here"),
]


@needs_build
@pytest.mark.parametrize("args,message", BAD_SPECS, ids=[" ".join(a) for a, _ in BAD_SPECS])
def test_bad_host_specs(args: list[str], message: str) -> None:
    done = hybridrun("--bin-dir", str(BUILD), "--remote-shell", LOCAL_SHELL, *args,
                     "--", "true")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("text,message", [
    ("a slots=2\nb slot=2\n", ":2: unexpected 'slot=2'"),
    ("a slots=two\n", ":1: slots must be a positive integer, not 'two'"),
    ("# nothing\n\n", "no hosts in the file"),
    ("a\nb slots=1\na slots=3\n", "host 'a' is listed twice"),
])
def test_bad_hostfiles(tmp_path: Path, text: str, message: str) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    done = hybridrun("--hostfile", str(hostfile), "--", "true")
    assert done.returncode == 2
    assert message in done.stderr, done.stderr


def test_usage_errors(tmp_path: Path) -> None:
    done = hybridrun("--hostfile", str(tmp_path / "missing"), "--", "true")
    assert done.returncode == 2 and "No such file or directory" in done.stderr
    done = hybridrun("-H", "a", "--hostfile", "x", "--", "true")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr
    done = hybridrun("-np", "2", "--colocated", "--", "true")
    assert done.returncode == 2 and "need -H or --hostfile" in done.stderr
    done = hybridrun("-H", "a", "-x", "SURELY_NOT_SET_ANYWHERE", "--", "true")
    assert done.returncode == 2 and "SURELY_NOT_SET_ANYWHERE is not set here" in done.stderr


@needs_build
def test_unreachable_host() -> None:
    # Answers like ssh for hosts named bad*: exit 255 and a message.
    fake_ssh = ('sh -c \'case "$0" in bad*) echo "ssh: Could not resolve hostname $0" >&2;'
                ' exit 255;; esac; exec sh -c "$1"\' {host} {command}')
    started = time.monotonic()
    done = hybridrun("--bin-dir", str(BUILD), "--remote-shell", fake_ssh,
                     "--network-interface", "lo", "-H", "good,bad1", "--",
                     str(TEST_WORKER))
    assert done.returncode == 1, done.stderr
    assert "host bad1 is unreachable" in done.stderr
    assert "exited with code 255: ssh: Could not resolve hostname bad1" in done.stderr
    assert "good" not in done.stderr
    assert "[scheduler]" not in done.stdout  # nothing was started
    assert time.monotonic() - started < 15


@needs_build
def test_check_build() -> None:
    done = hybridrun("--bin-dir", str(BUILD), "--check-build")
    assert done.returncode == 0, done.stderr
    info = subprocess.run([str(SCHEDULER), "--build-info"], capture_output=True,
                          text=True, timeout=10, check=True).stdout
    found = dict(line.split(": ") for line in info.splitlines())
    assert set(found) == {"CUDA", "NCCL", "Gloo"} and set(found.values()) <= {"yes", "no"}
    for engine, value in found.items():
        assert f"[{'X' if value == 'yes' else ' '}] {engine}" in done.stdout
    assert "[X] dist_hybrid" in done.stdout


# ---- the remote path on this machine (no root) ----------------------------------------

def marker_pids(marker: str) -> list[int]:
    return pids_with("HYBRIDRUN_TEST_MARKER", marker)


def wait_until_gone(pids_of: object, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    left = pids_of()  # type: ignore[operator]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = pids_of()  # type: ignore[operator]
    return left


@needs_build
@pytest.mark.parametrize("backend", ["dist_hybrid", "dist_allreduce"])
def test_job_through_remote_shell_on_this_machine(backend: str) -> None:
    marker = f"local-{backend}-{os.getpid()}"
    done = hybridrun("--bin-dir", str(BUILD), "--remote-shell", LOCAL_SHELL,
                     "--network-interface", "lo", "-H", "a:2,b", "--backend", backend,
                     "-x", f"HYBRIDRUN_TEST_MARKER={marker}", "--",
                     str(TEST_WORKER), "--rounds", "3", env=clean_env(**JOB_ENV))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank, host in ((0, "a"), (1, "a"), (2, "b")):
        assert f"[worker {rank}@{host}] round 2 ok" in done.stdout
    if backend == "dist_hybrid":
        assert re.search(r"^\[server 1@b\] ", done.stdout, re.M), done.stdout
    assert not wait_until_gone(lambda: marker_pids(marker))


@needs_build
def test_the_job_token_is_on_no_command_line(tmp_path: Path) -> None:
    """The remote shells' command lines (what `ps` shows every user, here and there) do not
    hold the job token: the remote wrapper reads it from its stdin, and the job runs."""
    log = tmp_path / "argv.log"
    shell = tmp_path / "logging-shell"
    shell.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {log}\nexec sh -c "$2"\n')
    shell.chmod(0o755)
    done = hybridrun("--bin-dir", str(BUILD), "--remote-shell", f"{shell} {{host}} {{command}}",
                     "--network-interface", "lo", "-H", "a,b", "--", str(TEST_WORKER),
                     "--rounds", "2", env=clean_env(**JOB_ENV, HYBRIDPS_JOB_TOKEN="s3cr3t-t0ken"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[worker 1@b] round 1 ok" in done.stdout, done.stdout
    argv = log.read_text()
    assert "HYBRIDPS_SCHEDULER_PORT=" in argv, argv  # the job's variables did go this way
    assert "s3cr3t-t0ken" not in argv, argv


# ---- network namespaces (root) --------------------------------------------------------

def have_netns() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    probe = f"hpsq{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made.returncode == 0


needs_netns = pytest.mark.skipif(not have_netns(), reason="needs root and ip netns")


class Cluster:
    def __init__(self, hosts: int) -> None:
        self.prefix = f"t{os.getpid() % 100000}"
        self.iface = f"{self.prefix}-net"
        self.hosts = [f"{self.prefix}-h{i}" for i in range(hosts)]
        self.args = ["--hosts", str(hosts), "--prefix", self.prefix, "--bandwidth",
                     "1gbit", "--subnet", f"10.214.{os.getpid() % 250}"]

    def up(self) -> None:
        subprocess.run([str(EMULATED_CLUSTER), "up", *self.args], check=True,
                       capture_output=True, timeout=60)

    def down(self) -> None:
        subprocess.run([str(EMULATED_CLUSTER), "down", "--prefix", self.prefix],
                       capture_output=True, timeout=60)

    def pids(self) -> dict[str, list[int]]:
        found = {}
        for host in self.hosts:
            out = subprocess.run(["ip", "netns", "pids", host], capture_output=True,
                                 text=True).stdout.split()
            live = [int(p) for p in out if alive(int(p))]
            if live:
                found[host] = live
        return found

    def hybridrun_args(self, *hosts: str) -> list[str]:
        return ["--bin-dir", str(BUILD), "--network-interface", self.iface,
                "--remote-shell", "ip netns exec {host} sh -c {command}",
                "-H", ",".join(hosts)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(4)
    try:
        c.up()
        yield c
    finally:
        c.down()
    assert not subprocess.run(["ip", "netns", "list"], capture_output=True,
                              text=True).stdout.count(f"{c.prefix}-h")


@needs_build
@needs_netns
@pytest.mark.parametrize("backend,extra", [
    ("dist_hybrid", ["--server-hosts", "SERVER"]),      # dedicated server host
    ("dist_hybrid", ["--colocated", "--server-hosts", "SERVER"]),  # mixed
    ("dist_allreduce", []),
], ids=["hybrid-dedicated", "hybrid-mixed", "allreduce"])
def test_job_across_namespaces(cluster: Cluster, backend: str, extra: list[str]) -> None:
    extra = [cluster.hosts[3] if a == "SERVER" else a for a in extra]
    done = hybridrun(*cluster.hybridrun_args(*cluster.hosts[:3]), "--backend", backend,
                     *extra, "--", str(TEST_WORKER), "--rounds", "3",
                     env=clean_env(**JOB_ENV))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(3):
        assert f"[worker {rank}@{cluster.hosts[rank]}] round 2 ok" in done.stdout
    if backend == "dist_hybrid":
        assert f"[server 0@{cluster.hosts[0 if '--colocated' in extra else 3]}]" \
            in done.stdout
    assert not wait_until_gone(cluster.pids)


@needs_build
@needs_netns
def test_killed_rank_stops_every_host(cluster: Cluster) -> None:
    # Host 0 runs two local ranks (a node reducing in shared memory) and rank 1 of them
    # dies: the node's segments are left behind unless hybridrun removes them.
    started = time.monotonic()
    done = hybridrun(*cluster.hybridrun_args(f"{cluster.hosts[0]}:2", *cluster.hosts[1:3]),
                     "--verbose", "--", str(TEST_WORKER),
                     "--rounds", "1000", "--sleep-ms", "10", "--die-rank", "1",
                     "--die-round", "3", "--expect-failure", env=clean_env(**JOB_ENV))
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    assert (f"worker 1@{cluster.hosts[0]} exited with code 137 (killed by SIGKILL?); "
            "stopping the job") in done.stderr, done.stderr
    assert elapsed < FAILURE_BOUND, elapsed
    assert not wait_until_gone(cluster.pids)
    # The namespaces share this machine's /dev/shm.
    said = {k: re.findall(rf"^    {k}=(\S+)$", done.stderr, re.M)[-1] for k in
            ("HYBRIDPS_SCHEDULER_ADDR", "HYBRIDPS_SCHEDULER_PORT", "HYBRIDPS_JOB_TOKEN")}
    where = (f"tcp://{said['HYBRIDPS_SCHEDULER_ADDR']}:{said['HYBRIDPS_SCHEDULER_PORT']}|"
             f"{said['HYBRIDPS_JOB_TOKEN']}")
    h = 1469598103934665603  # FNV-1a (common/hash.h), as the local reduction names its segments
    for byte in where.encode():
        h = ((h ^ byte) * 1099511628211) % (1 << 64)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"hybridps-{h:016x}-")]
    assert not left, left


@needs_build
@needs_netns
def test_ctrl_c_stops_every_host(cluster: Cluster) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(HYBRIDRUN), *cluster.hybridrun_args(*cluster.hosts[:2]),
         "--server-hosts", cluster.hosts[2], "--", str(TEST_WORKER), "--rounds", "100000",
         "--sleep-ms", "20"], env=clean_env(**JOB_ENV), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the job is really running
            if "round 2 ok" in line or time.monotonic() > deadline:
                break
        assert set(cluster.pids()) == set(cluster.hosts[:3])
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "received SIGINT; stopping the job" in err
    assert not wait_until_gone(cluster.pids)


@needs_netns
@pytest.mark.skipif(not shutil.which("iperf3"), reason="needs iperf3")
def test_emulated_cluster_shapes_both_directions_and_always_cleans_up() -> None:
    prefix = f"u{os.getpid() % 100000}"
    script = (  # host 1 -> host 0, then host 0 -> host 1 (-R); then fail on purpose
        f"ip netns exec {prefix}-h0 iperf3 -s -D -1 >/dev/null && sleep 0.5 && "
        f"ip netns exec {prefix}-h1 iperf3 -c 10.215.{os.getpid() % 250}.2 -t 2 -f m "
        f"| grep receiver; ip netns exec {prefix}-h0 iperf3 -s -D -1 >/dev/null && "
        f"sleep 0.5 && ip netns exec {prefix}-h1 iperf3 -R -c 10.215.{os.getpid() % 250}.2 "
        "-t 2 -f m | grep receiver; exit 7")
    done = subprocess.run(
        [str(EMULATED_CLUSTER), "run", "--hosts", "2", "--bandwidth", "100mbit",
         "--prefix", prefix, "--subnet", f"10.215.{os.getpid() % 250}", "--",
         "sh", "-c", script], capture_output=True, text=True, timeout=60)
    try:
        assert done.returncode == 7, done.stderr  # the command's status comes back
        rates = [float(m) for m in re.findall(r"([\d.]+) Mbits/sec", done.stdout)]
        assert len(rates) == 2, done.stdout
        for rate in rates:
            # Shaped to 100 Mbit/s each way (unshaped, a veth pair carries Gbit/s). No
            # lower bound: on a loaded 2-core machine iperf3 itself gets starved (31 Mbit/s
            # seen); bench/cluster_bench.py reports the achieved rate beside its figures.
            assert 0 < rate <= 101, rates
        left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                              text=True).stdout
        assert f"{prefix}-h" not in left
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f"{prefix}-" not in links
    finally:
        subprocess.run([str(EMULATED_CLUSTER), "down", "--prefix", prefix],
                       capture_output=True, timeout=60)


@needs_netns
def test_emulated_cluster_sizes_the_shaped_queues() -> None:
    prefix = f"q{os.getpid() % 100000}"
    # Both directions of the host's link: its uplink in its namespace, its downlink on
    # the bridge port.
    script = (f"ip netns exec {prefix}-h0 tc qdisc show dev {prefix}-net; "
              f"tc qdisc show dev {prefix}-v0")
    subnet = f"10.218.{os.getpid() % 250}"
    done = subprocess.run(
        [str(EMULATED_CLUSTER), "run", "--hosts", "1", "--bandwidth", "100mbit",
         "--queue-ms", "20", "--prefix", prefix, "--subnet", subnet,
         "--", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    try:
        assert done.returncode == 0, done.stderr
        assert re.findall(r"tbf .* lat (\S+)", done.stdout) == ["20ms", "20ms"], done.stdout
        bad = subprocess.run([str(EMULATED_CLUSTER), "up", "--hosts", "1", "--prefix", prefix,
                              "--subnet", subnet, "--queue-ms", "0"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2
        assert "--queue-ms wants 1..10000 (milliseconds), not '0'" in bad.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                              text=True).stdout
        assert f"{prefix}-h" not in left
    finally:
        subprocess.run([str(EMULATED_CLUSTER), "down", "--prefix", prefix],
                       capture_output=True, timeout=60)


def test_cluster_bench_sums_tcp_counters_cpu_shares_and_link_bytes_and_reports_old_rows() -> None:
    spec = importlib.util.spec_from_file_location("cluster_bench",
                                                  REPO / "bench" / "cluster_bench.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["cluster_bench"] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    total = {name: 0 for name in bench.TCP_COUNTERS}
    for out in ("#kernel\nTcpRetransSegs  12  0.0\nTcpExtTCPTimeouts  1  0.0\n",
                "#kernel\nTcpRetransSegs  30  0.0\nTcpExtTCPTimeouts  0  0.0\n"
                "TcpOutSegs  999  0.0\n"):
        bench.add_nstat(total, out)
    assert total == {"TcpRetransSegs": 42, "TcpExtTCPTimeouts": 1}
    # A row of an older run (no TCP or queue columns) next to a new one.
    old = {"model": "resnet50", "n": 4, "config": "allreduce", "servers": "0",
           "median_ms": 5200.0, "bound_ms": 5100.0, "vs_bound": 1.02, "even_bound_ms": ""}
    new = dict(old, config="dedicated k=4", retrans_segs=42, rtos=1, queue_ms=20)
    # The machine's CPU shares over a job, from two /proc/stat readings (user nice system
    # idle iowait irq softirq steal guest guest_nice).
    before = bench.cpu_jiffies("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4\n")
    after = bench.cpu_jiffies("intr 5\ncpu  400 0 150 1000 10 0 0 90 0 0\n")
    assert before == (150, 40, 1000) and after == (550, 90, 1650)
    assert bench.cpu_shares(before, after) == {"cpu_busy": 0.615, "cpu_steal": 0.077}
    assert bench.cpu_shares(after, after) == {"cpu_busy": "", "cpu_steal": ""}
    new.update(bench.cpu_shares(before, after))
    args = argparse.Namespace(bandwidth="250mbit", iters=2, sysctl=[])
    table = bench.tables([old, new], 30e6, args, 0.5)
    assert "(queues of 20 or 200 ms)" in table, table
    assert "| 5100.0 | 1.02 | - | - | - | - |" in table, table
    assert "| 5100.0 | 1.02 | - | 42, 1 | 0.615, 0.077 | - |" in table, table
    # The busiest link in one direction, per exchange (3: a warmup and 2 timed).
    link, per_exchange = bench.busiest_link({"h0": (10, 20), "h1": (0, 0)},
                                            {"h0": (310, 620), "h1": (900, 30)}, 3)
    assert (link, per_exchange) == ("h1 tx", 300.0)
    new.update(busiest_link=link, busiest_vs_bound=1.043)
    assert "| 42, 1 | 0.615, 0.077 | h1 tx: 1.043 |" in bench.tables([new], 30e6, args, 0.5)


@needs_netns
def test_emulated_cluster_sets_sysctls_in_every_host() -> None:
    prefix = f"s{os.getpid() % 100000}"
    # The opposite of the kernel's default in every host, read back inside each.
    script = (f"for h in {prefix}-h0 {prefix}-h1; do "
              "ip netns exec $h sysctl -n net.ipv4.tcp_slow_start_after_idle; done")
    done = subprocess.run(
        [str(EMULATED_CLUSTER), "run", "--hosts", "2", "--bandwidth", "none",
         "--prefix", prefix, "--subnet", f"10.216.{os.getpid() % 250}",
         "--sysctl", "net.ipv4.tcp_slow_start_after_idle=0", "--", "sh", "-c", script],
        capture_output=True, text=True, timeout=60)
    try:
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["0", "0"], done.stdout
        bad = subprocess.run([str(EMULATED_CLUSTER), "up", "--prefix", prefix,
                              "--sysctl", "no-equals-sign"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2
        assert "--sysctl wants KEY=VALUE, not 'no-equals-sign'" in bad.stderr
        # A setting the kernel refuses fails `up` half-way (after the bridge and the first
        # host exist): what it made is removed.
        refused = subprocess.run(
            [str(EMULATED_CLUSTER), "up", "--hosts", "2", "--prefix", prefix,
             "--subnet", f"10.216.{os.getpid() % 250}",
             "--sysctl", "net.ipv4.tcp_congestion_control=nosuchcc"],
            capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert "sysctl net.ipv4.tcp_congestion_control=nosuchcc failed" in refused.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                              text=True).stdout
        assert f"{prefix}-h" not in left
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f"{prefix}-" not in links
    finally:
        subprocess.run([str(EMULATED_CLUSTER), "down", "--prefix", prefix],
                       capture_output=True, timeout=60)


@needs_build
@needs_netns
def test_eager_probe_keeps_tensors_off_the_negotiation_on_slow_links() -> None:
    # Three workers on hosts linked at 100 Mbit/s: eager sends each tensor to both peers
    # (2 copies) where the allreduce moves 4/3 of it, so from 128 KiB up eager takes
    # milliseconds longer per operation. The probe must see that and keep them off the
    # negotiation (HYBRIDPS_EAGER_PROBE, default on); the job's sums stay exact.
    prefix = f"e{os.getpid() % 100000}"
    job = (f'"{sys.executable}" "{HYBRIDRUN}" --bin-dir "{BUILD}" '
           '--network-interface "$EMU_IFACE" --remote-shell "$EMU_REMOTE_SHELL" '
           '-H "$EMU_HOSTS" --backend dist_allreduce -- '
           f'"{TEST_WORKER}" --rounds 2')
    done = subprocess.run(
        [str(EMULATED_CLUSTER), "run", "--hosts", "3", "--bandwidth", "100mbit",
         "--prefix", prefix, "--subnet", f"10.217.{os.getpid() % 250}", "--",
         "sh", "-c", job], capture_output=True, text=True, timeout=RUN_TIMEOUT * 2,
        env=clean_env(**JOB_ENV))
    try:
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        for rank in range(3):
            assert f"[worker {rank}@{prefix}-h{rank}] round 1 ok" in out, out
        said = re.search(r"\[worker 0@\S+\].*the eager probe \(.*?\): push_pulls up to "
                         r"(\d+) bytes go with the negotiation", out)
        assert said, out
        assert int(said.group(1)) <= 64 << 10, said.group(0)
    finally:
        subprocess.run([str(EMULATED_CLUSTER), "down", "--prefix", prefix],
                       capture_output=True, timeout=60)
