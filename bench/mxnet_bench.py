#!/usr/bin/env python3
"""MXNet training throughput, communication-bound: train_digits.py --synthetic (a stack of
Dense layers of ~25 M parameters on random data) with 2 workers on this machine, through
dist_hybrid (2 servers), dist_allreduce, and MXNet's own dist_sync parameter server
(2 servers, started here the way MXNet's tools/launch.py does, with its DMLC_*
variables); `--stores ...,local2` adds the compute-only ceiling (2 processes training
at once without communicating). The stores take turns in every repetition so that load drifts hit them alike.

    .venv/bin/python bench/mxnet_bench.py [--repeats 3] [--steps 10] [--model-params 25e6]

A hybridps store may carry settings for its workers, to compare them taking turns:
`--stores dist_allreduce,dist_allreduce:HYBRIDPS_FUSION_MAX_TENSOR_BYTES=67108864`.

Prints one line per run and a Markdown table of medians (samples/s over all workers,
median step time of rank 0).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR", ROOT / "build"))
TRAIN = ROOT / "mxnet_kvstore" / "examples" / "train_digits.py"
PY = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env():
    e = dict(os.environ)
    e["PYTHONPATH"] = f"{ROOT / 'mxnet_kvstore'}:{BUILD / 'mxnet_kvstore'}"
    e.setdefault("OMP_NUM_THREADS", "1")
    for k in [k for k in e if k.startswith(("DMLC_", "HYBRIDPS_"))]:
        del e[k]
    return e


def parse(stdout):
    """Rank 0's RESULT object (output lines of two processes may interleave)."""
    decoder = json.JSONDecoder()
    for chunk in stdout.split("RESULT ")[1:]:
        try:
            r, _ = decoder.raw_decode(chunk)
        except ValueError:
            continue
        if r.get("rank") == 0:
            return r
    return None


def run_hybridps(spec, train_args, timeout):
    """`spec`: a store name, then optionally ":NAME=VALUE" settings for its workers."""
    store, *settings = spec.split(":")
    env = base_env()
    for kv in settings:
        name, sep, value = kv.partition("=")
        if not sep or not name.startswith("HYBRIDPS_"):
            raise SystemExit(f"mxnet_bench: '{kv}' in --stores is not HYBRIDPS_NAME=VALUE")
        env[name] = value
    backend = ["--backend", "dist_allreduce"] if store == "dist_allreduce" else [
        "--servers", "2"]
    cmd = [PY, str(ROOT / "scripts" / "hybridrun"), "-np", "2", *backend, "--bin-dir",
           str(BUILD), "--", PY, str(TRAIN), "--kvstore", store, *train_args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def run_dist_sync(train_args, timeout):
    """MXNet's ps-lite: 1 scheduler, 2 servers (python importing mxnet with DMLC_ROLE set
    becomes that role), 2 workers."""
    env = base_env()
    env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               DMLC_NUM_SERVER="2", DMLC_NUM_WORKER="2", DMLC_NODE_HOST="127.0.0.1")
    procs = []
    try:
        for role in ("scheduler", "server", "server"):
            procs.append(subprocess.Popen([PY, "-c", "import mxnet"],
                                          env=dict(env, DMLC_ROLE=role),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        workers = [subprocess.Popen([PY, str(TRAIN), "--kvstore", "dist_sync", *train_args],
                                    env=dict(env, DMLC_ROLE="worker"),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True) for _ in range(2)]
        procs += workers
        deadline = time.monotonic() + timeout
        out, code = "", 0
        for w in workers:
            o, _ = w.communicate(timeout=max(1, deadline - time.monotonic()))
            out += o
            code = code or w.returncode
        for p in procs[:3]:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        return code, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_local_pair(train_args, timeout):
    """The compute-only ceiling: 2 processes training at once with no communication
    (--kvstore local), as 2 workers share this machine's cores. samples/s counts both."""
    procs = [subprocess.Popen([PY, str(TRAIN), "--kvstore", "local", *train_args],
                              env=base_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    out, code = "", 0
    try:
        for p in procs:
            o, _ = p.communicate(timeout=timeout)
            out += o
            code = code or p.returncode
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    r = parse(out)
    if r is not None:
        r["samples_per_s"] *= 2
        r["update_on_kvstore"] = False
        out = "RESULT " + json.dumps(r)
    return code, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--model-params", type=float, default=25e6)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--stores", default="dist_hybrid,dist_allreduce,dist_sync")
    ap.add_argument("--timeout", type=float, default=400)
    args = ap.parse_args()
    train_args = ["--synthetic", "--json", "--steps", str(args.steps), "--warmup-steps",
                  str(args.warmup_steps), "--model-params", str(args.model_params),
                  "--batch-size", str(args.batch_size)]
    stores = args.stores.split(",")
    runs = {s: [] for s in stores}
    for rep in range(args.repeats):
        for store in stores:
            t = time.monotonic()
            if store == "dist_sync":
                code, out = run_dist_sync(train_args, args.timeout)
            elif store == "local2":
                code, out = run_local_pair(train_args, args.timeout)
            else:
                code, out = run_hybridps(store, train_args, args.timeout)
            r = parse(out)
            if code != 0 or r is None:
                print(f"{store} run {rep + 1}: FAILED (exit {code})\n{out[-3000:]}")
                continue
            runs[store].append(r)
            print(f"{store} run {rep + 1}: {r['samples_per_s']:.1f} samples/s, step "
                  f"{r['median_step_s'] * 1e3:.0f} ms, {r['model_params']} parameters, "
                  f"update_on_kvstore={r['update_on_kvstore']} "
                  f"({time.monotonic() - t:.0f} s wall)", flush=True)
    print("\n| store | samples/s (median) | runs | step ms (median) | optimizer on |")
    print("|---|---|---|---|---|")
    for store in stores:
        rs = runs[store]
        if not rs:
            print(f"| {store} | failed | | | |")
            continue
        sps = [r["samples_per_s"] for r in rs]
        print(f"| {store} | **{statistics.median(sps):.1f}** | "
              f"{', '.join(f'{v:.1f}' for v in sps)} | "
              f"{statistics.median(r['median_step_s'] for r in rs) * 1e3:.0f} | "
              f"{'servers' if rs[0]['update_on_kvstore'] else 'workers'} |")
    return 0 if all(runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
