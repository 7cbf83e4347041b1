"""Multi-process tests of what a job shows about itself: per-process output files, stall
warnings that name the missing worker or local rank, the servers' throughput summaries,
and the timeline (--timeline-filename). How jobs are started: harness.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from harness import (DirectJob, HYBRID_ONE_NODE, JobEnv, REPO, RUN_TIMEOUT, TEST_WORKER,
                     assert_nothing_left, error_lines, hybridrun, worker_lines,
                     assert_every_round_ok)


def test_every_process_writes_its_own_output_file(job: JobEnv, tmp_path: Path) -> None:
    """hybridrun --output-filename DIR: each process's lines, unprefixed, in a file of its
    own (the console keeps them too); HYBRIDPS_LOG_LEVEL=1 (warnings) quiets the workers'
    INFO lines as it does the scheduler's and the servers'."""
    out_dir = tmp_path / "logs"
    quiet = JobEnv(job.marker, {**job.env, "HYBRIDPS_LOG_LEVEL": "1"})
    run = hybridrun(quiet, 2, 1, [str(TEST_WORKER), "--rounds", "3"],
                    options=("--output-filename", str(out_dir)))
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    files = sorted(p.name for p in out_dir.iterdir())
    assert files == ["worker.0.log", "worker.1.log"], files  # quiet: only workers print
    for rank in range(2):
        lines = (out_dir / f"worker.{rank}.log").read_text().splitlines()
        assert lines == [*(f"round {k} ok" for k in range(3)),
                         f"worker {rank}: all 3 rounds ok"], lines
        assert worker_lines(out, rank) == lines, out
    run = hybridrun(job, 1, 1, [str(TEST_WORKER), "--rounds", "1"],
                    options=("--output-filename", str(out_dir)))
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "scheduler.log", "server.0.log", "worker.0.log", "worker.1.log"]
    worker = (out_dir / "worker.0.log").read_text()  # rewritten by the second job
    assert "joined the job as worker 0 of 1" in worker and "round 0 ok" in worker, worker
    assert "listening on" in (out_dir / "scheduler.log").read_text()
    assert_nothing_left(job.marker)


def test_a_stall_names_the_missing_worker(job: JobEnv, tmp_path: Path,
                                          direct: list[DirectJob]) -> None:
    """dist_hybrid across nodes, one worker alive but withholding its push_pulls: after
    HYBRIDPS_STALL_WARNING_MS the others log whom the servers' rounds wait for (rank, host
    and pid), and their deadline error names it too."""
    job.env.update(HYBRIDPS_STALL_WARNING_MS="500", HYBRIDPS_TIMEOUT_MS="6000")
    j = DirectJob(job, tmp_path, workers=3, servers=2,
                  worker_args=["--rounds", "5", "--hang-rank", "1", "--hang-round", "2",
                               "--expect-failure"])
    direct.append(j)
    assert j.wait("worker 0", RUN_TIMEOUT) == 3, j.text()
    hung = re.search(r"worker 1 \(host \S+, pid (\d+)\)", j.text())
    assert hung and int(hung.group(1)) == j.procs["worker 1"].pid, j.text()
    for rank in (0, 2):
        assert j.wait(f"worker {rank}", RUN_TIMEOUT) == 3, j.text()
        lines = j.lines(f"worker {rank}")
        warned = [line for line in lines if "server" in line and "says: round 2 of" in line]
        assert warned and "has waited" in warned[0] and "worker 1 (host" in warned[0], j.text()
        errors = error_lines(lines)
        assert errors and "did not complete" in errors[0] and "worker 1 (host" in errors[0], \
            j.text()


def test_a_stall_inside_a_node_names_the_missing_local_rank(job: JobEnv, tmp_path: Path,
                                                            direct: list[DirectJob]) -> None:
    """dist_hybrid, one node of 2 local ranks, one alive but withholding its push_pulls:
    after HYBRIDPS_STALL_WARNING_MS the other logs which local rank its node waits for,
    and its deadline error names it."""
    job.env.update(HYBRIDPS_STALL_WARNING_MS="500", HYBRIDPS_TIMEOUT_MS="6000")
    j = DirectJob(job, tmp_path, workers=2, servers=1, backend=HYBRID_ONE_NODE,
                  worker_args=["--rounds", "5", "--hang-rank", "1", "--hang-round", "2",
                               "--expect-failure"])
    direct.append(j)
    assert j.wait("worker 0", RUN_TIMEOUT) == 3, j.text()
    lines = j.lines("worker 0")
    warned = [line for line in lines if "on this node: local ranks 1 (worker 1)" in line]
    assert warned and "did not contribute yet" in warned[0], j.text()
    errors = error_lines(lines)
    assert errors and "local ranks 1 (worker 1)" in errors[0], j.text()


def test_servers_summarize_throughput_and_the_straggler(job: JobEnv, tmp_path: Path,
                                                        direct: list[DirectJob]) -> None:
    """HYBRIDPS_SUMMARY_EVERY_MS (hybridrun --summary-every): each server logs rounds/s,
    GB/s in and out, and whose push came last; here a worker made slower than the other
    is named as the last in most rounds."""
    job.env.update(HYBRIDPS_SUMMARY_EVERY_MS="500")
    j = DirectJob(job, tmp_path, workers=2, servers=1,
                  worker_args=["--rounds", "15", "--sleep-ms", "10", "--slow-rank", "1",
                               "--slow-ms", "150"])
    direct.append(j)
    assert_every_round_ok(j, workers=2, rounds=15)
    summaries = [line for line in j.lines("server 0") if "summary: " in line]
    assert len(summaries) >= 2, j.text()
    pid = j.procs["worker 1"].pid
    busy = [s for s in summaries if not re.search(r"summary: 0\.0 rounds/s", s)]
    assert busy, summaries
    for line in busy:
        m = re.search(r"summary: ([\d.]+) rounds/s, in ([\d.]+) GB/s, out ([\d.]+) GB/s; "
                      r"the last push of a round: worker (\d) \(host \S+, pid (\d+)\) (\d+)%",
                      line)
        assert m, line
        assert float(m.group(1)) > 0 and m.group(4) == "1" and int(m.group(5)) == pid, line
        assert int(m.group(6)) >= 80, line
    assert_nothing_left(job.marker)


def test_timeline_of_a_job(job: JobEnv, tmp_path: Path) -> None:
    """hybridrun --timeline-filename: one Chrome trace file with every worker's and server's
    spans, each operation of each worker, and for every partition the server's round inside
    the worker's push-to-reply span (push before the server's sum before the reply)."""
    rounds = 4
    out_file = tmp_path / "job.json"
    run = hybridrun(job, 2, 2, [str(TEST_WORKER), "--rounds", str(rounds)],
                    options=("--timeline-filename", str(out_file)))
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    assert f"timeline of 4 processes in {out_file}" in err, err
    assert not (tmp_path / "job.json.parts").exists()
    trace = json.loads(out_file.read_text())
    assert sorted(trace["otherData"]["processes"]) == [
        "server 0", "server 1", "worker 0", "worker 1"], trace["otherData"]
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    for rank in range(2):
        ops = [e for e in spans if names[e["pid"]] == f"worker {rank}"
               and e["name"].startswith("push_pull of 't.multi'")]
        assert len(ops) == rounds, ops
    # One host, one clock: each process's estimated offset is its alignment's error.
    offsets = trace["otherData"]["clock_offsets_us"]
    pushes: dict[tuple[str, int], list[dict]] = {}
    for e in spans:
        if e["cat"] == "push, server, reply":
            pushes.setdefault((e["name"], e["args"]["round"]), []).append(e)
    assert any(e["cat"] == "sum" for e in spans), {e["cat"] for e in spans}
    served = [e for e in spans if e["cat"] == "replies"]
    assert len(served) >= 5 * rounds, len(served)  # every tensor's partitions, every round
    for s in served:
        assert pushes.get((s["name"], s["args"]["round"])), s
        for w in pushes[(s["name"], s["args"]["round"])]:
            tol = 1000 + abs(offsets[names[w["pid"]]]) + abs(offsets[names[s["pid"]]])
            assert w["ts"] <= s["ts"] + tol, (w, s)                # pushed first
            # The reply leaves inside the server's span, so the worker's span ends after
            # that span starts (not necessarily after it ends: the server's thread may be
            # descheduled before it records the end while the worker already has it).
            assert w["ts"] + w["dur"] + tol >= s["ts"], (w, s)     # reply after
    # The two workers are local ranks of one node: each partition is summed in the node
    # first (the pusher's local reduction ends before its push starts), queued for its
    # server, and handed out after the reply (the local broadcast ends after it).
    for rank in range(2):
        mine = [e for e in spans if names[e["pid"]] == f"worker {rank}"]
        cats = {e["cat"] for e in mine}
        assert {"operation", "queued, waiting for credit", "push, server, reply",
                "local reduce", "local broadcast"} <= cats, cats
        def same(cat: str, push: dict) -> list[dict]:
            return [e for e in mine if e["cat"] == cat and e["name"] == push["name"]
                    and e["args"]["round"] == push["args"]["round"]]
        for push in (e for e in mine if e["cat"] == "push, server, reply"):
            reduced = same("local reduce", push)
            assert reduced, push
            assert reduced[0]["ts"] + reduced[0]["dur"] <= push["ts"] + 2000, (reduced, push)
            handed = same("local broadcast", push)
            assert handed and handed[0]["ts"] + handed[0]["dur"] + 2000 >= (
                push["ts"] + push["dur"]), (handed, push)
    # ... and a picture of it (scripts/plot-timeline, with the project's matplotlib).
    png = tmp_path / "job.png"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "plot-timeline"),
                           str(out_file), str(png)], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert_nothing_left(job.marker)


def test_timeline_of_an_allreduce_job(job: JobEnv, tmp_path: Path) -> None:
    """--timeline-filename with dist_allreduce: each worker's operations and its
    collectives (some fused, eager or two-shot); a collective starts within each operation
    of the large tensor (one clock: no tolerance)."""
    rounds = 3
    out_file = tmp_path / "ar.json"
    # Nothing eager: the small tensors of a round are fused, whatever the ranks' timing.
    fused = JobEnv(job.marker, {**job.env, "HYBRIDPS_EAGER_BYTES": "0"})
    run = hybridrun(fused, 2, 0, [str(TEST_WORKER), "--rounds", str(rounds)],
                    "dist_allreduce", options=("--timeline-filename", str(out_file)))
    code, out, err, _ = run.finish(RUN_TIMEOUT)
    assert code == 0, f"{out}\n{err}"
    assert f"timeline of 2 processes in {out_file}" in err, err
    trace = json.loads(out_file.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for pid in {e["pid"] for e in spans}:
        mine = [e for e in spans if e["pid"] == pid]
        ops = [e for e in mine if e["name"].startswith("push_pull of 't.large'")]
        collectives = [e for e in mine if e["cat"] == "collective"]
        assert len(ops) == rounds and len(collectives) >= rounds, mine
        for op in ops:
            assert any(op["ts"] <= c["ts"] <= op["ts"] + op["dur"] for c in collectives), \
                (op, collectives)
        # Before each collective: the negotiation that found every rank ready, and each
        # operation's wait for the other ranks; fused ones are copied in and out.
        cats = {e["cat"] for e in mine}
        assert {"negotiation", "wait for data", "fusion copy"} <= cats, cats
        waits = [e for e in mine if e["cat"] == "wait for data"
                 and e["name"] == "'t.large'"]
        assert len(waits) >= rounds, waits
    assert_nothing_left(job.marker)
