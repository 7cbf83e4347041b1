#!/usr/bin/env python3
"""Plots today's figures for docs/performance.md from the recorded figures in
bench/results/current/*.csv (each names the run it was copied from) into docs/img/.

    .venv/bin/python bench/plot_results.py          # writes docs/img/perf-*.png

The emulated cluster's plot is cluster_bench.py's own (bench/cluster_results/*/cluster.png).
A new measurement: add its run to bench/results/<topic>/, update the CSV, rerun this.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "results" / "current"
OUT = ROOT / "docs" / "img"


def rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def size_label(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def sizes_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(s) for s in sizes], rotation=45, ha="right")
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def core_push_pull(path: Path):
    r = rows("core_push_pull.csv")
    x = [int(v["bytes"]) for v in r]
    y = [float(v["goodput_gbps"]) for v in r]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.axhspan(2.8, 3.2, color="tab:green", alpha=0.15, label="loopback TCP, iperf3 (2.8–3.2)")
    ax.plot(x, y, "o-", label="hybridps push_pull (1 worker + 1 server)")
    ax.plot([4 << 20], [2.32], "s", color="tab:red", label="ZeroMQ echo, same run (4 MiB)")
    sizes_axis(ax, x)
    ax.set_ylabel("goodput (GB/s)")
    ax.set_title("Core push_pull on the 2-vCPU VM, medians of 5")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def against_reference(path: Path, name: str, reference: tuple, target: tuple | None,
                      series: list, ylim: float, ylabel: str, title: str, legend: str,
                      height: float = 3.8):
    """Columns of `name` against the bytes, beside the reference's level (y, colour, label)
    and a target's (y, label); series: (column, marker, label)."""
    r = rows(name)
    x = [int(v["bytes"]) for v in r]
    fig, ax = plt.subplots(figsize=(6.4, height))
    ax.axhline(reference[0], color=reference[1], lw=1.5, label=reference[2])
    if target:
        ax.axhline(target[0], color="tab:red", ls="--", lw=1, label=target[1])
    for column, marker, label in series:
        ax.plot(x, [float(v[column]) for v in r], marker, label=label)
    sizes_axis(ax, x)
    ax.set_ylim(0, ylim)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc=legend)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def allreduce_one_host(path: Path):
    against_reference(path, "allreduce_one_host.csv",
                      (1.0, "tab:red", "plain Gloo, same processes (= 1)"), None,
                      [("ratio_2w", "o-", "dist_allreduce, 2 workers"),
                       ("ratio_4w", "s-", "dist_allreduce, 4 workers")],
                      1.2, "time / plain Gloo's time",
                      "dist_allreduce on one host against plain Gloo (lower is faster)",
                      "upper left")


def allreduce_mpi(path: Path):
    against_reference(path, "allreduce_mpi.csv",
                      (1.0, "tab:red", "Open MPI over shared memory, same machine (= 1)"),
                      (1.2, "target: at most 1.2"),
                      [("ratio_2", "o-", "dist_allreduce, 2 ranks"),
                       ("ratio_4", "s-", "dist_allreduce, 4 ranks (2 cores)")],
                      1.4, "time / MPI_Allreduce's time",
                      "dist_allreduce on one host against Open MPI (lower is faster)",
                      "lower left")


def gpu_staging(path: Path):
    against_reference(path, "gpu_staging.csv",
                      (100, "tab:green", "CPU push_pull, same run (= 100 %)"),
                      (80, "target 80 %"),
                      [("percent_of_ref", "o-", "GPU push_pull (dist_hybrid)")],
                      110, "% of the CPU push_pull's bandwidth",
                      "GPU tensors through host staging, one H200 host", "lower right",
                      height=3.6)


def mxnet_training(path: Path):
    r = rows("mxnet_training.csv")
    runs = list(dict.fromkeys(v["run"] for v in r))
    fig, axes = plt.subplots(1, len(runs), figsize=(9.6, 3.4))
    for ax, run in zip(axes, runs):
        sel = [v for v in r if v["run"] == run]
        ax.barh([v["store"] for v in sel], [float(v["samples_per_s"]) for v in sel],
                color=["tab:blue", "tab:orange", "tab:green", "tab:gray"][:len(sel)])
        ax.set_title(run, fontsize=9)
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlabel("samples/s (higher is faster)")
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle("MXNet training, 2 workers, 2-vCPU VM (compare within a panel)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, fn in (("perf-core-push-pull.png", core_push_pull),
                     ("perf-allreduce-one-host.png", allreduce_one_host),
                     ("perf-allreduce-mpi.png", allreduce_mpi),
                     ("perf-gpu-staging.png", gpu_staging),
                     ("perf-mxnet-training.png", mxnet_training)):
        fn(OUT / name)
        print(f"wrote docs/img/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
