#!/usr/bin/env python3
"""Parameter server against allreduce on an emulated cluster, beside the theory.

Run as root (it makes network namespaces with scripts/emulated-cluster):

    sudo .venv/bin/python bench/cluster_bench.py --bandwidth 1gbit \\
        --models resnet50,vgg16 --workers 2,4 --iters 3

For each model (bench/models.h) and n worker hosts, one job per configuration, each
timing hybridps-model-bench (the whole gradient list push_pulled per iteration, results
checked) under scripts/hybridrun over namespaces whose links are shaped to B per
direction:

    allreduce      dist_allreduce (Gloo ring)        bound 2(n-1)/n * S/B
    colocated      dist_hybrid, a server per worker  bound 2(n-1)/n * S/B
    dedicated k    k server hosts (k = n/2, n)       bound max(S/B, n*S/(k*B))
    mixed k        colocated + k extra server hosts  bound 2n(n-1)*S / ((n^2+kn-2k)*B)

(DESIGN.md, performance model.) B in the bounds is the link's goodput measured in the
same run with iperf3 between two hosts (the tc rate is shown beside it). n = 1 runs the
scaling table's baseline. Writes <out>/cluster.csv, <out>/cluster.md (the tables) and
<out>/cluster.png (measured against bound), and prints the tables.

mixed placement: the workers place keys with common/partition.h's ServerPlacement, so
the k extra servers get the byte share 2k(n-1)/(n(n+k)-2k). Mixed rows also show the
bound of an even spread over all n+k servers, (2n+k-2)/(n+k) * S/B, for comparison.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HYBRIDRUN = REPO / "scripts" / "hybridrun"
EMULATED = REPO / "scripts" / "emulated-cluster"
RESULT_RE = re.compile(r"RESULT (.*)$", re.M)
WARMUP = 1  # untimed iterations of every job before the timed ones


@dataclass
class Config:
    name: str         # allreduce, colocated, dedicated k=2, mixed k=1, colocated 2bit
    backend: str
    dedicated: int    # server hosts (dedicated); 0 otherwise
    extra: int        # extra server hosts (mixed); 0 otherwise
    compression: str = "none"  # 2bit: pushes packed to 1/16, replies full; fp16: all half

    def bound_s(self, n: int, size: float, bw: float) -> float:
        """Lower bound of the iteration time (s) for S bytes and B bytes/s."""
        if self.dedicated:  # the replies bound it, compressed or not
            return max(size / bw, n * size / (self.dedicated * bw))
        if self.compression == "2bit":  # colocated: a host sends pushes and replies
            return (n - 1) / n * (1 + 1 / 16) * size / bw
        if self.extra:
            k = self.extra
            return 2 * n * (n - 1) * size / ((n * n + k * n - 2 * k) * bw)
        return 2 * (n - 1) / n * size / bw

    def even_bound_s(self, n: int, size: float, bw: float) -> float | None:
        """Mixed with the bytes spread evenly over the n+k servers (no optimum split)."""
        if not self.extra:
            return None
        k = self.extra
        return max((2 * n + k - 2) / (n + k), n / (n + k)) * size / bw


def configs_for(n: int, compression: str = "none") -> list[Config]:
    """The configurations for n worker hosts. compression: a comma list of none (the
    plain configurations), 2bit (colocated and dedicated with MXNet's 2bit pushes) and
    fp16 (allreduce, colocated and dedicated exchanging float16 gradients, as Horovod's
    and BytePS's fp16 compression sends them)."""
    kinds = [k.strip() for k in compression.split(",") if k.strip()]
    dedicated = [] if n == 1 else sorted({max(1, n // 2), n})
    out = []
    if "none" in kinds:
        out += [Config("allreduce", "dist_allreduce", 0, 0),
                Config("colocated", "dist_hybrid", 0, 0)]
        out += [Config(f"dedicated k={k}", "dist_hybrid", k, 0) for k in dedicated]
        if n > 1:
            out += [Config(f"mixed k={k}", "dist_hybrid", 0, k) for k in (1, 2)]
    if "fp16" in kinds:
        out.append(Config("allreduce fp16", "dist_allreduce", 0, 0, "fp16"))
        out.append(Config("colocated fp16", "dist_hybrid", 0, 0, "fp16"))
        out += [Config(f"dedicated k={k} fp16", "dist_hybrid", k, 0, "fp16")
                for k in dedicated]
    if "2bit" in kinds:
        out.append(Config("colocated 2bit", "dist_hybrid", 0, 0, "2bit"))
        out += [Config(f"dedicated k={k} 2bit", "dist_hybrid", k, 0, "2bit")
                for k in dedicated]
    return out


class Cluster:
    def __init__(self, hosts: int, bandwidth: str, prefix: str,
                 sysctls: list[str] | None = None, queue_ms: int = 200) -> None:
        self.hosts = [f"{prefix}-h{i}" for i in range(hosts)]
        self.prefix, self.bandwidth, self.queue_ms = prefix, bandwidth, queue_ms
        self.sysctls = sysctls or []
        self.iface = f"{prefix}-net"

    def __enter__(self) -> Cluster:
        subprocess.run([str(EMULATED), "up", "--hosts", str(len(self.hosts)),
                        "--bandwidth", self.bandwidth, "--prefix", self.prefix,
                        "--queue-ms", str(self.queue_ms),
                        "--subnet", "10.213.9"]
                       + [a for s in self.sysctls for a in ("--sysctl", s)],
                       check=True, timeout=120)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([str(EMULATED), "down", "--prefix", self.prefix], timeout=120)

    def forget_tcp_metrics(self) -> None:
        """Every host forgets what its TCP learned about its peers (ssthresh, RTT).

        Linux keeps such metrics per destination and starts new connections from them, so
        without this a job could inherit the congestion of the jobs before it. (In the one
        paired run of 2026-11-25 it made no difference beyond the spread of single runs;
        it keeps jobs independent of their order in the table.)
        """
        for host in self.hosts:
            subprocess.run(["ip", "netns", "exec", host, "ip", "tcp_metrics", "flush", "all"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)

    def tcp_counters(self) -> dict[str, int]:
        """Every host's TCP retransmitted segments and retransmission timeouts, summed.

        A job's difference of two readings tells whether losses at the shaped links (a
        timeout stalls a connection for at least 200 ms) account for time over the bound.
        """
        total = {name: 0 for name in TCP_COUNTERS}
        for host in self.hosts:
            # -s: no history file (nstat keeps one per user, shared with the host's).
            done = subprocess.run(["ip", "netns", "exec", host, "nstat", "-asz",
                                   *TCP_COUNTERS], capture_output=True, text=True,
                                  timeout=30, check=True)
            add_nstat(total, done.stdout)
        return total

    def link_bytes(self) -> dict[str, tuple[int, int]]:
        """Every host's bytes sent and received on its link so far (tx, rx)."""
        out = {}
        for host in self.hosts:
            done = subprocess.run(["ip", "netns", "exec", host, "cat",
                                   f"/sys/class/net/{self.iface}/statistics/tx_bytes",
                                   f"/sys/class/net/{self.iface}/statistics/rx_bytes"],
                                  capture_output=True, text=True, timeout=30, check=True)
            tx, rx = (int(x) for x in done.stdout.split())
            out[host] = (tx, rx)
        return out

    def iperf_bytes_per_s(self, seconds: int = 4) -> float:
        """Goodput of one TCP stream from host 1 to host 0 (bytes/s)."""
        server = subprocess.Popen(["ip", "netns", "exec", self.hosts[0], "iperf3", "-s",
                                   "-1"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            done = subprocess.run(["ip", "netns", "exec", self.hosts[1], "iperf3", "-J",
                                   "-c", "10.213.9.2", "-t", str(seconds)],
                                  capture_output=True, text=True, timeout=seconds + 30)
            data = json.loads(done.stdout)
            return data["end"]["sum_received"]["bits_per_second"] / 8
        finally:
            server.kill()
            server.wait()


# nstat's names of the counters tcp_counters reads, and their columns in the results.
TCP_COUNTERS = ("TcpRetransSegs", "TcpExtTCPTimeouts")
TCP_COLUMNS = {"TcpRetransSegs": "retrans_segs", "TcpExtTCPTimeouts": "rtos"}


def add_nstat(total: dict[str, int], output: str) -> None:
    """Adds the counters of `nstat -a` output (NAME VALUE RATE lines) that `total` has."""
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in total and parts[1].isdigit():
            total[parts[0]] += int(parts[1])


def cpu_jiffies(stat: str) -> tuple[int, int, int]:
    """This machine's CPU time so far from /proc/stat's text, in ticks: (busy, steal,
    total), busy being everything but idle, iowait and steal (time the hypervisor gave
    to others)."""
    for line in stat.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq
            ticks += [0] * (8 - len(ticks))       # steal; guest time is within user
            idle, iowait, steal = ticks[3], ticks[4], ticks[7]
            total = sum(ticks)
            return total - idle - iowait - steal, steal, total
    raise ValueError("no 'cpu' line in /proc/stat")


def cpu_shares(before: tuple[int, int, int],
               after: tuple[int, int, int]) -> dict[str, float | str]:
    """The busy and stolen shares of every CPU's time between two cpu_jiffies readings:
    the namespaces' hosts all run on this machine's CPUs, so a busy share near 1 means the
    emulation, not the links, may have set the time."""
    total = after[2] - before[2]
    if total <= 0:
        return {"cpu_busy": "", "cpu_steal": ""}
    return {"cpu_busy": round((after[0] - before[0]) / total, 3),
            "cpu_steal": round((after[1] - before[1]) / total, 3)}


def busiest_link(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                 exchanges: int) -> tuple[str, float]:
    """The link that carried the most bytes in one direction between two link_bytes
    readings, as "host tx|rx", and its bytes per exchange (the job's warmup and timed
    iterations). Everything else the job sent counts too (setup messages, dist_allreduce's
    probes and negotiation), so it is an upper estimate of what the exchanges moved."""
    best, most = "-", -1.0
    for host, (tx, rx) in after.items():
        for way, moved in (("tx", tx - before[host][0]), ("rx", rx - before[host][1])):
            if moved > most:
                best, most = f"{host} {way}", float(moved)
    return best, most / max(1, exchanges)


def run_job(cluster: Cluster, cfg: Config, n: int, model: str, iters: int, build: Path,
            timeout: float, env: dict[str, str]) -> dict[str, str]:
    workers = cluster.hosts[:n]
    args = [sys.executable, str(HYBRIDRUN), "--bin-dir", str(build), "--network-interface",
            cluster.iface, "--remote-shell", "ip netns exec {host} sh -c {command}",
            "-H", ",".join(workers), "--backend", cfg.backend]
    servers = cluster.hosts[n:n + (cfg.dedicated or cfg.extra)]
    if cfg.dedicated:
        args += ["--server-hosts", ",".join(servers)]
    elif cfg.extra:
        args += ["--colocated", "--server-hosts", ",".join(servers)]
    args += ["--", str(build / "bench" / "hybridps-model-bench"), "--model", model,
             "--iters", str(iters), "--warmup", str(WARMUP), "--label", cfg.name,
             *{"2bit": ["--compression", "2bit"],
               "fp16": ["--dtype", "float16"]}.get(cfg.compression, [])]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"{cfg.name} n={n} {model} failed ({done.returncode}):\n{tail}")
    match = RESULT_RE.search(done.stdout)
    if not match:
        raise RuntimeError(f"{cfg.name} n={n} {model}: no RESULT line")
    line = match.group(1)
    fields = dict(re.findall(r"(\w+)=(\S+)", line.split(" label=")[0]))
    fields["label"] = line.split(" label=", 1)[1] if " label=" in line else "-"
    fields["wall_s"] = f"{time.monotonic() - started:.1f}"
    return fields


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidth", default="1gbit", help="tc rate of every link")
    parser.add_argument("--models", default="resnet50,vgg16")
    parser.add_argument("--workers", default="1,2,4", help="values of n")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--compression", default="none",
                        help="comma list: none (the plain configurations), 2bit (MXNet's "
                             "2bit pushes, dist_hybrid), fp16 (float16 gradients); e.g. "
                             "none,2bit,fp16 runs them all in the same run")
    parser.add_argument("--configs", default="",
                        help="only these configurations (comma list of names)")
    parser.add_argument("--build", default=str(REPO / "build"))
    parser.add_argument("--out", default=str(REPO / "bench" / "cluster_results"))
    parser.add_argument("--prefix", default="hpb")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--keep-tcp-metrics", action="store_true",
                        help="do not flush the hosts' TCP metrics before each job")
    parser.add_argument("--queue-ms", type=int, default=200,
                        help="how long a packet may wait in a shaped link's queue (tc "
                             "tbf latency; scripts/emulated-cluster --queue-ms)")
    parser.add_argument("--sysctl", action="append", default=[], metavar="KEY=VALUE",
                        help="set in every emulated host (repeatable), e.g. "
                             "net.ipv4.tcp_congestion_control=cubic")
    parser.add_argument("--report-only", action="store_true",
                        help="redo <out>/cluster.md and cluster.png from <out>/cluster.csv "
                             "(e.g. after merging runs); run nothing")
    args = parser.parse_args()
    if not 1 <= args.queue_ms <= 10000:
        parser.error(f"--queue-ms wants 1..10000 (milliseconds), not {args.queue_ms}")
    unknown = {k.strip() for k in args.compression.split(",")} - {"none", "2bit", "fp16"}
    if unknown:
        parser.error(f"--compression {args.compression}: {sorted(unknown)} are not none, "
                     "2bit or fp16")
    if args.report_only:
        with open(Path(args.out) / "cluster.csv", newline="") as f:
            rows = [{k: (float(v) if k.endswith("_ms") and v else int(v) if k == "n" else v)
                     for k, v in r.items()} for r in csv.DictReader(f)]
        report(rows, Path(args.out), args, float(rows[0]["load1"]))
        return 0
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    models = args.models.split(",")
    ns = sorted(int(x) for x in args.workers.split(","))
    only = {c.strip() for c in args.configs.split(",") if c.strip()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # No stray HYBRIDPS_* settings reach the jobs, except the transport knobs the
    # experiments vary.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HYBRIDPS_")
           or k in ("HYBRIDPS_CREDIT_BYTES", "HYBRIDPS_WIRE_CHUNK_BYTES",
                    "HYBRIDPS_BURST_GATHER_US", "HYBRIDPS_SERVER_WINDOW_BYTES",
                    "HYBRIDPS_MAX_SERVER_LANES", "HYBRIDPS_PARTITION_BYTES",
                    "HYBRIDPS_CALLER_ROUNDS", "HYBRIDPS_DIRECT_TWO_SHOT",
                    "HYBRIDPS_DIRECT_ALLREDUCE_BYTES")}
    # Generous liveness: on a loaded 2-core machine a saturated worker's heartbeats can
    # be late by seconds (a 5 s timeout ended a VGG-16 run with n = 4).
    env.update(HYBRIDPS_TIMEOUT_MS="600000", HYBRIDPS_START_TIMEOUT_MS="60000",
               HYBRIDPS_HEARTBEAT_TIMEOUT_MS="30000")
    # SIGTERM/SIGHUP end the run through the same path as an error: the cluster goes.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))

    load_before = os.getloadavg()
    rows: list[dict] = []
    failed: list[str] = []
    with Cluster(2 * max(ns), args.bandwidth, args.prefix, args.sysctl,
                 args.queue_ms) as cluster:
        bw = statistics.median(cluster.iperf_bytes_per_s() for _ in range(3))
        print(f"# link goodput (iperf3, one stream, median of 3): {bw * 8 / 1e9:.3f} Gbit/s "
              f"(tc rate {args.bandwidth}); load average before: {load_before[0]:.2f}",
              flush=True)
        for model in models:
            for n in ns:
                for cfg in configs_for(n, args.compression):
                    if only and cfg.name not in only:
                        continue
                    if not args.keep_tcp_metrics:
                        cluster.forget_tcp_metrics()
                    try:
                        tcp_before = cluster.tcp_counters()
                        links_before = cluster.link_bytes()
                        cpu_before = cpu_jiffies(Path("/proc/stat").read_text())
                        fields = run_job(cluster, cfg, n, model, args.iters,
                                         Path(args.build), args.timeout, env)
                        cpu = cpu_shares(cpu_before,
                                         cpu_jiffies(Path("/proc/stat").read_text()))
                        tcp = {TCP_COLUMNS[k]: v - tcp_before[k]
                               for k, v in cluster.tcp_counters().items()}
                        links_after = cluster.link_bytes()
                    except (RuntimeError, ValueError, subprocess.SubprocessError) as exc:
                        print(f"# FAILED: {exc}", flush=True)
                        failed.append(f"{model} n={n} {cfg.name}")
                        continue
                    size = float(fields["bytes"])
                    bound = cfg.bound_s(n, size, bw) * 1e3
                    measured = float(fields["median_ms"])
                    even = cfg.even_bound_s(n, size, bw)
                    row = {"model": model, "n": n, "config": cfg.name,
                           "servers": fields["servers"], "bytes": int(size),
                           "median_ms": measured, "min_ms": float(fields["min_ms"]),
                           "max_ms": float(fields["max_ms"]), "bound_ms": round(bound, 1),
                           "vs_bound": round(measured / bound, 3) if bound > 0 else "",
                           "even_bound_ms": round(even * 1e3, 1) if even else "",
                           "load1": round(os.getloadavg()[0], 2),
                           "link_gbps": round(bw * 8 / 1e9, 3), "queue_ms": args.queue_ms,
                           **tcp, **cpu}
                    # How far the bytes alone put the busiest link over the bound: the
                    # rest of measured / bound is time a link sat idle.
                    link, per_exchange = busiest_link(links_before, links_after,
                                                      args.iters + WARMUP)
                    row["busiest_link"] = link
                    row["busiest_vs_bound"] = (round(per_exchange / bw * 1e3 / bound, 3)
                                               if bound > 0 else "")
                    rows.append(row)
                    write_csv(out / "cluster.csv", rows)
                    print(f"{model:9s} n={n} {cfg.name:14s} {measured:9.1f} ms  bound "
                          f"{bound:9.1f} ms  x{row['vs_bound'] or '-'}  "
                          f"(min {row['min_ms']:.1f}, max {row['max_ms']:.1f}; load "
                          f"{row['load1']}; TCP: {tcp['retrans_segs']} segments "
                          f"retransmitted, {tcp['rtos']} timeouts; CPUs busy "
                          f"{cpu['cpu_busy']}, stolen {cpu['cpu_steal']}; busiest link "
                          f"{link}: x{row['busiest_vs_bound'] or '-'} in bytes)", flush=True)
    report(rows, out, args, load_before[0])
    if failed:
        print(f"# failed configurations: {', '.join(failed)}")
    return 1 if failed else 0


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def report(rows: list[dict], out: Path, args: argparse.Namespace, load: float) -> None:
    if not rows:
        return
    text = tables(rows, float(rows[0]["link_gbps"]) * 1e9 / 8, args, load)
    (out / "cluster.md").write_text(text)
    print(text)
    plot(rows, out / "cluster.png", args.bandwidth)


def congestion_control(args: argparse.Namespace) -> str:
    """What the emulated hosts ran: a --sysctl setting, else this machine's."""
    for s in args.sysctl:
        key, _, value = s.partition("=")
        if key.strip() == "net.ipv4.tcp_congestion_control":
            return value.strip()
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return "unknown"


def tables(rows: list[dict], bw: float, args: argparse.Namespace, load: float) -> str:
    queues = sorted({str(r.get("queue_ms") or 200) for r in rows})  # older runs: 200
    lines = [f"Links: tc rate {args.bandwidth} per direction (queues of "
             f"{' or '.join(queues)} ms), iperf3 goodput "
             f"{bw * 8 / 1e9:.3f} Gbit/s (B in the bounds); iterations: {args.iters} timed "
             f"after 1 warmup, median; load average at start {load:.2f}; hosts' TCP "
             f"congestion control: {congestion_control(args)}.", "",
             "| model | n | configuration | servers | measured (ms) | bound (ms) | "
             "measured / bound | bound with even placement (ms) | TCP segments "
             "retransmitted, timeouts (all hosts, the whole job) | CPUs busy, stolen "
             "(this machine, the whole job) | busiest link: its bytes at B / bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tcp = (f"{r['retrans_segs']}, {r['rtos']}" if r.get("rtos", "") != "" else "-")
        cpu = (f"{r['cpu_busy']}, {r['cpu_steal']}" if r.get("cpu_busy", "") != ""
               else "-")
        busiest = (f"{r['busiest_link']}: {r['busiest_vs_bound']}"
                   if r.get("busiest_vs_bound", "") != "" else "-")
        lines.append(f"| {r['model']} | {r['n']} | {r['config']} | {r['servers']} | "
                     f"{r['median_ms']:.1f} | {r['bound_ms']:.1f} | {r['vs_bound']} | "
                     f"{r['even_bound_ms'] or '-'} | {tcp} | {cpu} | {busiest} |")
    lines += ["", "Scaling (the exchange alone, no compute in the loop: efficiency = "
              "t(n=1) / t(n), where n = 1 is a local exchange; bandwidth efficiency = "
              "bound / measured):", "", "| model | configuration | n | time (ms) | "
              "efficiency | bandwidth efficiency |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["config"] not in ("allreduce", "colocated"):
            continue
        base = [b for b in rows if b["model"] == r["model"] and b["config"] == r["config"]
                and b["n"] == 1]
        eff = f"{base[0]['median_ms'] / r['median_ms']:.2f}" if base else "-"
        bw_eff = (f"{float(r['bound_ms']) / r['median_ms']:.2f}"
                  if float(r["bound_ms"] or 0) > 0 else "-")
        lines.append(f"| {r['model']} | {r['config']} | {r['n']} | {r['median_ms']:.1f} | "
                     f"{eff} | {bw_eff} |")
    same = {(r["model"], r["n"], r["config"]): r["median_ms"] for r in rows}
    for model in sorted({r["model"] for r in rows}):
        ar, ded = same.get((model, 4, "allreduce")), same.get((model, 4, "dedicated k=4"))
        if ar and ded:
            lines.append(f"\n{model}, n = 4: dedicated k = 4 is {ar / ded:.2f}x faster than "
                         "dist_allreduce measured in the same run (theory 1.5x).")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, bandwidth: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed (scripts/install-deps.sh adds it): no plot",
              file=sys.stderr)
        return
    groups = [(m, n) for m in dict.fromkeys(r["model"] for r in rows)
              for n in sorted({r["n"] for r in rows if r["model"] == m}) if n > 1]
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), squeeze=False)
    for ax, (model, n) in zip(axes[0], groups):
        sel = [r for r in rows if r["model"] == model and r["n"] == n]
        x = range(len(sel))
        ax.bar(x, [r["median_ms"] / 1e3 for r in sel], color="tab:blue", label="measured")
        ax.scatter(x, [r["bound_ms"] / 1e3 for r in sel], color="tab:red", marker="_",
                   s=400, linewidths=3, label="bound", zorder=3)
        even = [(i, r["even_bound_ms"] / 1e3) for i, r in enumerate(sel) if r["even_bound_ms"]]
        if even:
            ax.scatter([i for i, _ in even], [v for _, v in even], color="tab:gray",
                       marker="_", s=400, linewidths=3, zorder=3,
                       label="bound, even placement")
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["config"] for r in sel], rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{model}, n = {n}")
        ax.set_ylabel("s per iteration")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"emulated cluster, {bandwidth} links: measured vs bound")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
