"""Tests of scripts/hybridrun, the local job launcher.

The scheduler and server are replaced by small shell stand-ins (passed with
--bin-dir) that only exercise the launcher: they record their pid and
environment, write the scheduler port, and wait until every worker has written
a done-file (or until signalled). Behaviour is chosen through STANDIN_* variables,
which reach the stand-ins through the inherited environment.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HYBRIDRUN = REPO / "scripts" / "hybridrun"
RUN_TIMEOUT = 20  # seconds; every hybridrun invocation is bounded by this
PORT = "34567"

DUMP_ENV = ("env | grep -E '^(HYBRIDPS_|PYTHONUNBUFFERED=|STANDIN_INHERITED=)' "
            "| sort > \"$d/env.$tag\"")

SCHEDULER = f"""#!/bin/sh
d="$STANDIN_DIR"; tag=scheduler
echo $$ > "$d/pid.$tag"
{DUMP_ENV}
echo "scheduler starting"
echo "scheduler stderr line" >&2
case "${{STANDIN_SCHEDULER_MODE:-ok}}" in
  fail) echo "scheduler failing"; exit 7 ;;
  noport) ;;
  *) printf '%s\\n' "$STANDIN_PORT" > "$HYBRIDPS_PORT_FILE.tmp"
     mv "$HYBRIDPS_PORT_FILE.tmp" "$HYBRIDPS_PORT_FILE" ;;
esac
while [ "$(ls "$d" | grep -c '^done\\.')" -lt "$HYBRIDPS_NUM_WORKERS" ]; do
  sleep 0.05
done
echo "scheduler done"
"""

SERVER = f"""#!/bin/sh
d="$STANDIN_DIR"; tag=server.$$
echo $$ > "$d/pid.$tag"
{DUMP_ENV}
echo "server up pid $$"
case "${{STANDIN_SERVER_MODE:-ok}}" in
  exit0) echo "server leaving early"; exit 0 ;;
  hang) trap '' TERM; while :; do sleep 0.05; done ;;
esac
while [ "$(ls "$d" | grep -c '^done\\.')" -lt "$HYBRIDPS_NUM_WORKERS" ]; do
  sleep 0.05
done
"""

WORKER = f"""d="$STANDIN_DIR"; r="$HYBRIDPS_RANK"; tag=worker.$r
echo $$ > "$d/pid.$tag"
{DUMP_ENV}
sleep 1000 &
echo $! > "$d/pid.grandchild.$r"
echo "hello from rank $r"
echo "stderr from rank $r" >&2
case "${{STANDIN_WORKER_MODE:-ok}}" in
  fail) if [ "$r" = "$STANDIN_FAIL_RANK" ]; then
          sleep 0.3; echo "rank $r failing"; exit 3
        fi
        sleep 1000 ;;
  sleep) sleep 1000 ;;
esac
printf '\\377\\376 bad bytes\\n'
printf 'partial line without newline'
touch "$d/done.$r"
"""


@dataclass
class Standins:
    dir: Path
    bin_dir: Path
    worker: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, *args: str, env: dict[str, str] | None = None,
              worker: list[str] | None = None,
              bin_dir: Path | None = None) -> subprocess.Popen[str]:
        bin_args = [] if bin_dir is None and "HYBRIDPS_BIN_DIR" in self.env else [
            "--bin-dir", str(bin_dir or self.bin_dir)]
        cmd = [sys.executable, str(HYBRIDRUN), *bin_args, *args, "--",
               *(worker or ["sh", str(self.worker)])]
        proc = subprocess.Popen(cmd, env={**self.env, **(env or {})}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def run(self, *args: str, **kwargs: object) -> tuple[int, str, str]:
        proc = self.start(*args, **kwargs)  # type: ignore[arg-type]
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
        return proc.returncode, out, err

    def pids(self) -> dict[str, int]:
        found = {}
        for path in self.dir.glob("pid.*"):
            text = path.read_text().strip()
            if text:
                found[path.name[len("pid."):]] = int(text)
        return found

    def envs(self) -> dict[str, dict[str, str]]:
        result = {}
        for path in self.dir.glob("env.*"):
            lines = path.read_text().splitlines()
            result[path.name[len("env."):]] = dict(line.split("=", 1) for line in lines)
        return result

    def wait_for_pids(self, count: int, timeout: float = 10.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids()
            if len(pids) >= count:
                return pids
            time.sleep(0.05)
        raise AssertionError(f"only {self.pids()} started")

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=RUN_TIMEOUT)
        for pid in self.pids().values():
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def assert_all_dead(standins: Standins, timeout: float = 3.0) -> None:
    pids = standins.pids()
    assert pids, "the stand-ins recorded no pids"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.05)
    survivors = {name: pid for name, pid in pids.items() if alive(pid)}
    assert not survivors, f"processes survived hybridrun: {survivors}"


@pytest.fixture
def standins(tmp_path: Path) -> Iterator[Standins]:
    run_dir = tmp_path / "run"
    bin_dir = tmp_path / "bin"
    run_dir.mkdir()
    bin_dir.mkdir()
    for name, text in (("hybridps-scheduler", SCHEDULER), ("hybridps-server", SERVER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    worker = tmp_path / "worker.sh"
    worker.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDPS_", "STANDIN_"))}
    env.update(STANDIN_DIR=str(run_dir), STANDIN_PORT=PORT, STANDIN_INHERITED="yes")
    s = Standins(run_dir, bin_dir, worker, env)
    try:
        yield s
    finally:
        s.cleanup()


def test_script_is_executable() -> None:
    assert os.access(HYBRIDRUN, os.X_OK)
    assert HYBRIDRUN.read_text().startswith("#!/usr/bin/env python3\n")


def test_success_prefixes_and_environment(standins: Standins) -> None:
    code, out, err = standins.run("-np", "3", "--servers", "2",
                                  env={"HYBRIDPS_RANK": "99"})
    assert code == 0, err
    assert "warning" not in err
    lines = out.splitlines()
    for rank in range(3):
        assert f"[worker {rank}] hello from rank {rank}" in lines
        assert f"[worker {rank}] stderr from rank {rank}" in lines
        assert f"[worker {rank}] partial line without newline" in lines
        assert f"[worker {rank}] \ufffd\ufffd bad bytes" in lines
    assert "[scheduler] scheduler starting" in lines
    assert "[scheduler] scheduler stderr line" in lines
    assert "[scheduler] scheduler done" in lines
    server_lines = [line for line in lines if line.startswith("[server ")]
    assert {line.split("]")[0] for line in server_lines} == {"[server 0", "[server 1"}
    assert all(re.fullmatch(r"\[\w+( \d+)?\] .*", line) for line in lines), lines

    envs = standins.envs()
    sched = envs.pop("scheduler")
    assert sched["HYBRIDPS_ROLE"] == "scheduler"
    assert sched["HYBRIDPS_SCHEDULER_ADDR"] == "127.0.0.1"
    assert sched["HYBRIDPS_SCHEDULER_PORT"] == "0"
    assert sched["HYBRIDPS_PORT_FILE"]
    assert "HYBRIDPS_RANK" not in sched  # stale inherited value is dropped
    token = sched["HYBRIDPS_JOB_TOKEN"]
    assert re.fullmatch(r"[0-9a-f]{32}", token)
    servers = [e for name, e in envs.items() if name.startswith("server.")]
    workers = {name: e for name, e in envs.items() if name.startswith("worker.")}
    assert len(servers) == 2 and len(workers) == 3
    for e in [sched, *servers, *workers.values()]:
        assert e["HYBRIDPS_NUM_WORKERS"] == "3"
        assert e["HYBRIDPS_NUM_SERVERS"] == "2"
        assert e["HYBRIDPS_JOB_TOKEN"] == token
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["STANDIN_INHERITED"] == "yes"
    for e in [*servers, *workers.values()]:
        assert e["HYBRIDPS_SCHEDULER_ADDR"] == "127.0.0.1"
        assert e["HYBRIDPS_SCHEDULER_PORT"] == PORT
        assert e["HYBRIDPS_BACKEND"] == "dist_hybrid"
        assert "HYBRIDPS_PORT_FILE" not in e
    for e in servers:
        assert e["HYBRIDPS_ROLE"] == "server"
    # Each server asks for the rank of its launch index, so "[server 1]" is server rank 1.
    assert sorted(e["HYBRIDPS_RANK"] for e in servers) == ["0", "1"]
    assert sorted(e["HYBRIDPS_RANK"] for e in workers.values()) == ["0", "1", "2"]
    for name, e in workers.items():
        assert name == f"worker.{e['HYBRIDPS_RANK']}"
        assert e["HYBRIDPS_ROLE"] == "worker"
        # One host: the workers are the local ranks of one node.
        assert e["HYBRIDPS_LOCAL_RANK"] == e["HYBRIDPS_RANK"]
        assert e["HYBRIDPS_LOCAL_SIZE"] == "3"
    assert_all_dead(standins)  # the workers' background sleeps included
    assert not Path(sched["HYBRIDPS_PORT_FILE"]).parent.exists()


def test_an_exported_job_token_is_the_jobs(standins: Standins) -> None:
    # So that processes started by hand with the same export can join the job.
    code, _, err = standins.run("-np", "2", "--servers", "1",
                                env={"HYBRIDPS_JOB_TOKEN": "chosen-by-the-user"})
    assert code == 0, err
    envs = standins.envs()
    assert len(envs) == 4
    assert {e["HYBRIDPS_JOB_TOKEN"] for e in envs.values()} == {"chosen-by-the-user"}


def test_a_job_token_file_is_the_jobs(standins: Standins, tmp_path: Path) -> None:
    # The processes get the file's token as HYBRIDPS_JOB_TOKEN, and not the file's name
    # (both set would make them refuse to start); a file others can read is refused.
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    token_file.chmod(0o600)
    code, _, err = standins.run("-np", "2", "--servers", "1",
                                env={"HYBRIDPS_JOB_TOKEN_FILE": str(token_file)})
    assert code == 0, err
    envs = standins.envs()
    assert {e["HYBRIDPS_JOB_TOKEN"] for e in envs.values()} == {"from-the-file"}
    assert not any("HYBRIDPS_JOB_TOKEN_FILE" in e for e in envs.values())
    token_file.chmod(0o644)
    code, _, err = standins.run("-np", "2", "--servers", "1",
                                env={"HYBRIDPS_JOB_TOKEN_FILE": str(token_file)})
    assert code != 0
    assert "others can read it (mode 0644): chmod 600 it" in err, err


def test_worker_failure_stops_job(standins: Standins) -> None:
    code, out, err = standins.run("-np", "3", "--servers", "2",
                                  env={"STANDIN_WORKER_MODE": "fail",
                                       "STANDIN_FAIL_RANK": "1"})
    assert code == 3, err
    assert "hybridrun: worker 1 exited with code 3; stopping the job" in err
    assert "[worker 1] rank 1 failing" in out
    assert len(standins.pids()) == 1 + 2 + 3 + 3
    assert_all_dead(standins)


def test_server_killed_by_signal(standins: Standins) -> None:
    proc = standins.start("-np", "2", "--servers", "2",
                          env={"STANDIN_WORKER_MODE": "sleep"})
    pids = standins.wait_for_pids(1 + 2 + 2 + 2)
    server_pid = next(pid for name, pid in pids.items() if name.startswith("server."))
    os.kill(server_pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert re.search(r"hybridrun: server [01] killed by signal 9 \(SIGKILL\); "
                     r"stopping the job", err), err
    assert_all_dead(standins)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_hybridrun_kills_everything(standins: Standins, sig: int) -> None:
    proc = standins.start("-np", "2", "--servers", "1",
                          env={"STANDIN_WORKER_MODE": "sleep"})
    standins.wait_for_pids(1 + 1 + 2 + 2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 128 + sig, err
    assert f"received {signal.Signals(sig).name}" in err
    assert_all_dead(standins)


def test_missing_scheduler_binary(standins: Standins, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = standins.run("-np", "1", "--servers", "1", bin_dir=empty)
    assert code == 2
    assert "cannot find hybridps-scheduler" in err
    assert str(empty / "hybridps-scheduler") in err
    assert not standins.pids()


def test_missing_server_binary(standins: Standins) -> None:
    (standins.bin_dir / "hybridps-server").unlink()
    code, out, err = standins.run("-np", "1", "--servers", "1")
    assert code == 2
    assert "cannot find hybridps-server" in err
    assert not standins.pids()


def test_scheduler_never_writes_port(standins: Standins) -> None:
    started = time.monotonic()
    code, out, err = standins.run("-np", "1", "--servers", "1", "--start-timeout", "1",
                                  env={"STANDIN_SCHEDULER_MODE": "noport"})
    assert code == 1, err
    assert "scheduler did not write its port" in err and "--start-timeout" in err
    assert time.monotonic() - started < 10
    assert set(standins.pids()) == {"scheduler"}
    assert_all_dead(standins)


def test_scheduler_fails_before_port(standins: Standins) -> None:
    code, out, err = standins.run("-np", "1", "--servers", "1",
                                  env={"STANDIN_SCHEDULER_MODE": "fail"})
    assert code == 7, err
    assert "[scheduler] scheduler failing" in out
    assert "scheduler exited with code 7 before writing its port" in err


def test_allreduce_starts_no_server(standins: Standins) -> None:
    (standins.bin_dir / "hybridps-server").unlink()  # not needed
    code, out, err = standins.run("-np", "2", "--backend", "dist_allreduce")
    assert code == 0, err
    envs = standins.envs()
    assert sorted(envs) == ["scheduler", "worker.0", "worker.1"]
    assert "[server" not in out
    for e in envs.values():
        assert e["HYBRIDPS_NUM_SERVERS"] == "0"
        assert e["HYBRIDPS_BACKEND"] == "dist_allreduce"
    assert_all_dead(standins)


def test_server_exiting_early_is_a_failure(standins: Standins) -> None:
    code, out, err = standins.run("-np", "1", "--servers", "1",
                                  env={"STANDIN_SERVER_MODE": "exit0",
                                       "STANDIN_WORKER_MODE": "sleep"})
    assert code == 1, err
    assert ("server 0 exited with code 0 while workers were still running; "
            "stopping the job") in err
    assert_all_dead(standins)


def test_hung_server_is_killed_after_shutdown_timeout(standins: Standins) -> None:
    code, out, err = standins.run("-np", "1", "--servers", "1",
                                  "--shutdown-timeout", "0.5",
                                  env={"STANDIN_SERVER_MODE": "hang"})
    assert code == 0, err
    # Under load the scheduler may not have exited by then either; it is then listed too.
    assert re.search(r"warning: (?:[\w ]+, )*server 0 still running 0\.5 s after the workers "
                     r"finished", err), err
    assert "server 0 did not stop on SIGTERM; sent SIGKILL" in err
    assert_all_dead(standins)


def test_worker_command_not_found(standins: Standins, tmp_path: Path) -> None:
    code, out, err = standins.run("-np", "2", "--servers", "1",
                                  worker=[str(tmp_path / "no-such-program")])
    assert code == 127, err
    assert "cannot start worker 0" in err
    assert_all_dead(standins)


def test_dry_run(standins: Standins) -> None:
    code, out, err = standins.run("-np", "2", "--servers", "2", "--dry-run")
    assert code == 0, err
    for label in ("scheduler", "server 0", "server 1", "worker 0", "worker 1"):
        assert f"[{label}] on localhost: " in out
    assert f"[scheduler] on localhost: {standins.bin_dir / 'hybridps-scheduler'}" in out
    assert "    HYBRIDPS_ROLE=worker" in out
    assert "    HYBRIDPS_RANK=1" in out
    assert "    HYBRIDPS_LOCAL_RANK=1" in out and "    HYBRIDPS_LOCAL_SIZE=2" in out
    assert "    HYBRIDPS_NUM_SERVERS=2" in out
    assert not standins.pids()


def test_bin_dir_from_environment_build_layout(standins: Standins, tmp_path: Path) -> None:
    build = tmp_path / "build"
    for sub, name in (("scheduler", "hybridps-scheduler"), ("server", "hybridps-server")):
        (build / sub).mkdir(parents=True)
        (standins.bin_dir / name).rename(build / sub / name)
    standins.env["HYBRIDPS_BIN_DIR"] = str(build)
    code, out, err = standins.run("-np", "1", "--dry-run")
    assert code == 0, err
    assert str(build / "scheduler" / "hybridps-scheduler") in out
    assert str(build / "server" / "hybridps-server") in out
    assert "[server 0]" in out and "[server 1]" not in out  # --servers defaults to -np


def test_usage_error_without_command(standins: Standins) -> None:
    proc = subprocess.run([sys.executable, str(HYBRIDRUN), "-np", "1", "--"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=standins.env)
    assert proc.returncode == 2
    assert "no command given" in proc.stderr
