#!/usr/bin/env python3
"""Data-parallel training with MXNet Gluon through a hybridps KVStore.

Real data: scikit-learn's bundled handwritten digits (1,797 8x8 images, no download),
split 80/20 into train and test; every worker trains on its shard of the training set
(every num_workers-th sample) and all workers evaluate the same weights on the whole test
set. Synthetic mode (--synthetic) trains a stack of Dense layers of about --model-params
parameters on random data to measure communication-bound throughput.

    scripts/hybridrun -np 2 --servers 2 -- .venv/bin/python \\
        mxnet_kvstore/examples/train_digits.py --kvstore dist_hybrid
    scripts/hybridrun -np 2 --backend dist_allreduce -- .venv/bin/python \\
        mxnet_kvstore/examples/train_digits.py --kvstore dist_allreduce
    .venv/bin/python mxnet_kvstore/examples/train_digits.py --kvstore local

The gradients are summed over the workers (never averaged), as with MXNet's dist_sync:
each step passes the global batch size (per-worker batch x workers) to trainer.step, so
N workers with batch b follow the same trajectory as one process with batch N*b.
Prints one line per epoch (loss, test accuracy, the job's samples/s over the epoch) and a
final `RESULT` line; exits 1 if --min-accuracy is missed.
"""
import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

# dist_sync: MXNet's own parameter server, for comparison (bench/mxnet_bench.py launches
# it with its DMLC_* variables).
STORES = ("dist_hybrid", "dist_allreduce", "local", "dist_sync")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", choices=STORES,
                   default=os.environ.get("HYBRIDPS_BACKEND", "dist_hybrid"),
                   help="KVStore (default: the job's backend, else dist_hybrid)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--min-accuracy", type=float, default=0.0,
                   help="exit 1 when the final test accuracy is lower")
    p.add_argument("--update-on-kvstore", choices=("auto", "0", "1"), default="auto",
                   help="run the optimizer on the servers (dist_hybrid); auto: when the "
                        "store can")
    p.add_argument("--compression", choices=("none", "2bit"), default="none",
                   help="gradient compression of the pushes to the servers (dist_hybrid): "
                        "MXNet's 2bit, with error feedback")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="2bit: the value a pushed element is sent as")
    p.add_argument("--synthetic", action="store_true",
                   help="random data and a large model: measure samples/s")
    p.add_argument("--model-params", type=float, default=25e6,
                   help="synthetic: parameters of the model (default 25e6)")
    p.add_argument("--layers", type=int, default=4, help="synthetic: Dense layers")
    p.add_argument("--steps", type=int, default=20, help="synthetic: measured steps")
    p.add_argument("--warmup-steps", type=int, default=3, help="synthetic: not measured")
    p.add_argument("--json", action="store_true", help="print the RESULT as JSON")
    return p.parse_args(argv)


def make_store(name):
    """(kvstore or None, rank, num_workers)."""
    if name == "local":
        return "local", 0, 1
    if name == "dist_sync":
        kv = mx.kv.create(name)
        return kv, kv.rank, kv.num_workers
    import hybridps.mxnet  # noqa: F401  registers dist_hybrid and dist_allreduce
    kv = mx.kv.create(name)
    return kv, kv.rank, kv.num_workers


def load_digits(seed):
    from sklearn.datasets import load_digits as sk_digits
    data = sk_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def mlp(sizes, seed):
    net = gluon.nn.HybridSequential()
    for i, units in enumerate(sizes):
        last = i == len(sizes) - 1
        net.add(gluon.nn.Dense(units, activation=None if last else "relu"))
    mx.random.seed(seed)  # the same initial weights on every worker (broadcast anyway)
    net.initialize(mx.init.Xavier())
    return net


def make_trainer(net, args, kv):
    params = {"learning_rate": args.lr, "wd": args.wd}
    if args.optimizer in ("sgd", "nag"):
        params["momentum"] = args.momentum
    update = None if args.update_on_kvstore == "auto" else args.update_on_kvstore == "1"
    compression = None
    if args.compression != "none":
        compression = {"type": args.compression, "threshold": args.threshold}
    return gluon.Trainer(net.collect_params(), args.optimizer, params, kvstore=kv,
                         update_on_kvstore=update, compression_params=compression)


def accuracy(net, x, y):
    out = net(mx.nd.array(x)).argmax(axis=1).asnumpy()
    return float((out == y).mean())


def train_digits(args, kv, rank, num_workers):
    (xtr, ytr), (xte, yte) = load_digits(args.seed)
    xs, ys = xtr[rank::num_workers], ytr[rank::num_workers]
    steps = len(xs) // args.batch_size  # the same on every worker (shards differ by <= 1)
    steps = min(steps, (len(xtr) // num_workers) // args.batch_size)
    net = mlp([args.hidden, 10], args.seed)
    net.hybridize()
    trainer = make_trainer(net, args, kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    global_batch = args.batch_size * num_workers
    rng = np.random.RandomState(args.seed + rank)
    samples, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        order = rng.permutation(len(xs))
        total, epoch_t0 = 0.0, time.perf_counter()
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            data, label = mx.nd.array(xs[idx]), mx.nd.array(ys[idx])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(global_batch)
            total += float(loss.sum().asscalar())
            samples += global_batch
        if rank == 0:  # loss and accuracy force the step's work: the rate is the job's
            loss_now = total / (steps * args.batch_size)
            rate = steps * global_batch / (time.perf_counter() - epoch_t0)
            print(f"epoch {epoch + 1:3d}  loss {loss_now:.4f}  "
                  f"test accuracy {accuracy(net, xte, yte):.4f}  {rate:,.0f} samples/s",
                  flush=True)
    mx.nd.waitall()
    elapsed = time.perf_counter() - t0
    return {"kvstore": args.kvstore, "workers": num_workers, "rank": rank,
            "test_accuracy": accuracy(net, xte, yte), "samples_per_s": samples / elapsed,
            "steps": steps * args.epochs, "update_on_kvstore": bool(trainer._update_on_kvstore),
            "weights_checksum": float(sum(p.data().sum().asscalar()
                                          for p in net.collect_params().values()))}


def synthetic_sizes(params, layers, in_dim=1024, classes=10):
    # layers-1 hidden layers of width h: in_dim*h + (layers-2)*h*h + h*classes ~= params
    if layers < 2:
        raise SystemExit("--layers must be at least 2")
    a, b, c = layers - 2, in_dim + classes, -params
    h = (-b + (b * b - 4 * a * c) ** 0.5) / (2 * a) if a else -c / b
    return [int(h)] * (layers - 1) + [classes]


def train_synthetic(args, kv, rank, num_workers):
    sizes = synthetic_sizes(args.model_params, args.layers)
    net = mlp(sizes, args.seed)
    trainer = make_trainer(net, args, kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(args.seed + rank)
    data = mx.nd.array(rng.rand(args.batch_size, 1024).astype(np.float32))
    label = mx.nd.array(rng.randint(0, 10, args.batch_size).astype(np.float32))
    global_batch = args.batch_size * num_workers
    step_times = []
    for step in range(args.warmup_steps + args.steps):
        t = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(global_batch)
        loss.wait_to_read()
        for p in net.collect_params().values():
            p.data().wait_to_read()
        if step >= args.warmup_steps:
            step_times.append(time.perf_counter() - t)
    nparams = sum(int(np.prod(p.shape)) for p in net.collect_params().values())
    med = float(np.median(step_times))
    return {"kvstore": args.kvstore, "workers": num_workers, "rank": rank,
            "model_params": nparams, "batch_per_worker": args.batch_size,
            "median_step_s": med, "samples_per_s": global_batch / med,
            "update_on_kvstore": bool(trainer._update_on_kvstore)}


def main(argv=None):
    args = parse_args(argv)
    kv, rank, num_workers = make_store(args.kvstore)
    result = (train_synthetic if args.synthetic else train_digits)(args, kv, rank, num_workers)
    if args.json:
        print("RESULT " + json.dumps(result), flush=True)
    elif rank == 0:
        keys = ("test_accuracy", "samples_per_s") if not args.synthetic else (
            "model_params", "median_step_s", "samples_per_s")
        print("RESULT " + "  ".join(f"{k} {result[k]:.4g}" if isinstance(result[k], float)
                                    else f"{k} {result[k]}" for k in keys)
              + f"  ({args.kvstore}, {num_workers} workers)", flush=True)
    if not args.synthetic and result["test_accuracy"] < args.min_accuracy:
        print(f"FAILED: test accuracy {result['test_accuracy']:.4f} < {args.min_accuracy}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
