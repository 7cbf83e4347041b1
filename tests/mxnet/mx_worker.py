"""One worker of the MXNet plugin tests, started N times by scripts/hybridrun.

    mx_worker.py STORE SCENARIO [SCENARIO...]

Runs the scenarios in order with one hybridps store type and prints one line per
scenario: `RESULT {"scenario": ..., "rank": ..., ...}` (JSON). The checks themselves
are in test_mxnet_kvstore.py; this side only measures.
"""
import json
import os
import sys
import tempfile

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import hybridps.mxnet as hps

STORE = sys.argv[1]
SCENARIOS = sys.argv[2:]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "mxnet_kvstore", "examples"))


def report(scenario, **values):
    values.update(scenario=scenario, store=STORE)
    print("RESULT " + json.dumps(values), flush=True)


def digits_xy():
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.float32)


def small_net(seed=7):
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(10))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 64)))
    return net


def weights(net):
    return [p.data().asnumpy().copy() for p in net.collect_params().values()]


def run_steps(net, trainer, x, y, rows_of_step, steps, batch_for_step):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for s in range(steps):
        rows = rows_of_step(s)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x[rows])), mx.nd.array(y[rows]))
        loss.backward()
        trainer.step(batch_for_step)


def sync_sgd(kv, update_on_kvstore):
    """2 workers with batch b vs one process (here, no kvstore) with batch 2b."""
    x, y = digits_xy()
    b, steps, n, r = 8, 10, kv.num_workers, kv.rank
    opt = dict(learning_rate=0.1, momentum=0.9, wd=1e-4)
    ref = small_net()
    ref_tr = gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=None)
    run_steps(ref, ref_tr, x, y, lambda s: np.arange(s * n * b, (s + 1) * n * b), steps,
              n * b)
    net = small_net()
    tr = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv,
                       update_on_kvstore=update_on_kvstore)
    run_steps(net, tr, x, y,
              lambda s: np.arange(s * n * b + r * b, s * n * b + (r + 1) * b), steps, n * b)
    diffs = [float(np.abs(a - w).max()) for a, w in zip(weights(ref), weights(net))]
    moved = [float(np.abs(a - w).max()) for a, w in zip(weights(small_net()), weights(net))]
    report("sync_sgd", rank=r, max_abs_diff=max(diffs), min_moved=min(moved),
           update_on_kvstore=bool(tr._update_on_kvstore))


def digits(kv):
    import train_digits
    args = train_digits.parse_args(["--kvstore", STORE, "--epochs", "15"])
    result = train_digits.train_digits(args, kv, kv.rank, kv.num_workers)
    report("digits", **result)


def save_load(kv):
    """Train, save the trainer's states, train on: a fresh trainer that loads the states
    (and the saved weights) continues with identical weights."""
    x, y = digits_xy()
    n, r, b = kv.num_workers, kv.rank, 8
    opt = dict(learning_rate=0.05, momentum=0.9)
    rows = lambda s: np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)  # noqa: E731
    net = small_net()
    tr = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    run_steps(net, tr, x, y, rows, 5, n * b)
    tmp = tempfile.mkdtemp(prefix=f"hps-states-{r}-")
    params_file, states_file = os.path.join(tmp, "p"), os.path.join(tmp, "s")
    net.save_parameters(params_file)
    tr.save_states(states_file)
    run_steps(net, tr, x, y, lambda s: rows(s + 5), 5, n * b)
    first = weights(net)
    net2 = small_net(seed=99)
    net2.load_parameters(params_file)
    tr2 = gluon.Trainer(net2.collect_params(), "sgd", opt, kvstore=mx.kv.create(STORE))
    tr2.load_states(states_file)
    run_steps(net2, tr2, x, y, lambda s: rows(s + 5), 5, n * b)
    diffs = [float(np.abs(a - w).max()) for a, w in zip(first, weights(net2))]
    report("save_load", rank=r, max_abs_diff=max(diffs))


def overlap(kv):
    """Timeline: do push_pulls of the last layers start before the backward pass has
    produced the first layer's gradient (a 'mark' on it)?"""
    width, depth, batch, steps = 1024, 6, 256, 4
    net = gluon.nn.Sequential()
    for _ in range(depth):
        net.add(gluon.nn.Dense(width, activation="relu"))
    mx.random.seed(3)
    net.initialize(mx.init.Xavier())
    data = mx.nd.random.uniform(shape=(batch, width))
    net(data).wait_to_read()
    tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3}, kvstore=kv)
    first_grad = list(net.collect_params().values())[0]
    prefix = kv._prefix
    per_step = []
    for s in range(steps):
        mx.nd.waitall()
        hps.timeline_start()
        with autograd.record():
            loss = net(data).sum()
        loss.backward()
        hps.timeline_mark("backward_done", first_grad.grad())
        tr.step(batch)
        mx.nd.waitall()
        events = hps.timeline_take()
        hps.timeline_stop()
        mark = [e for e in events if e["kind"] == "mark"]
        pulls = [e for e in events if e["kind"] == "push_pull" and e["name"].startswith(prefix)]
        if not mark or not pulls:
            per_step.append(None)
            continue
        end_bw = mark[0]["start_ns"]
        early = [e for e in pulls if e["start_ns"] < end_bw]
        per_step.append({"pushes": len(pulls), "started_before_backward_end": len(early),
                         "ms_before": (end_bw - min(e["start_ns"] for e in pulls)) / 1e6})
    report("overlap", rank=kv.rank, steps=per_step[1:])  # the first step also initialises


def horovod_api():
    """horovod.mxnet's helpers: allreduce (mean), broadcast, broadcast_parameters and
    DistributedTrainer / DistributedOptimizer against one process with batch 2b (the
    gradients are averaged, so step() takes the per-worker batch)."""
    hps.init(STORE)
    r, n = hps.rank(), hps.size()
    mean = hps.allreduce(mx.nd.full((5,), r + 1.0), name="t").asnumpy()
    summed = hps.allreduce(mx.nd.full((5,), r + 1.0), average=False).asnumpy()
    root = hps.broadcast(mx.nd.full((3,), 10.0 * r), root_rank=n - 1).asnumpy()
    x, y = digits_xy()
    b, steps = 8, 6
    opt = dict(learning_rate=0.1, momentum=0.9)
    ref = small_net()
    run_steps(ref, gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=None), x, y,
              lambda s: np.arange(s * n * b, (s + 1) * n * b), steps, n * b)
    mine = lambda s: np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)  # noqa: E731
    diffs = {}
    for kind in ("trainer", "optimizer"):
        net = small_net(seed=7 + r)  # different on purpose: broadcast_parameters fixes it
        hps.broadcast_parameters(net.collect_params(), root_rank=0, prefix=kind)
        if kind == "trainer":
            tr = hps.DistributedTrainer(net.collect_params(), "sgd", opt, prefix=kind)
        else:
            dopt = hps.DistributedOptimizer(mx.optimizer.create("sgd", **opt))
            tr = gluon.Trainer(net.collect_params(), dopt, kvstore=None)
        run_steps(net, tr, x, y, mine, steps, b)
        diffs[kind] = max(float(np.abs(a - w).max())
                          for a, w in zip(weights(ref), weights(net)))
    report("horovod", rank=r, size=n, mean=mean.tolist(), sum=summed.tolist(),
           broadcast=root.tolist(), trainer_diff=diffs["trainer"],
           optimizer_diff=diffs["optimizer"])


def mismatch(kv):
    """Rank r offers a tensor of r+3 elements under one key: every worker gets an error."""
    a = mx.nd.ones((kv.rank + 3,))
    try:
        kv.pushpull("mismatch", a)
        a.wait_to_read()
        report("mismatch", rank=kv.rank, error=None)
    except mx.base.MXNetError as exc:
        report("mismatch", rank=kv.rank, error=str(exc).splitlines()[0][:600])


def main():
    kv = mx.kv.create(STORE)
    for scenario in SCENARIOS:
        if scenario == "sync_sgd":
            sync_sgd(kv, None)
        elif scenario == "sync_sgd_workers":
            sync_sgd(mx.kv.create(STORE), False)
        elif scenario == "digits":
            digits(mx.kv.create(STORE))
        elif scenario == "save_load":
            save_load(mx.kv.create(STORE))
        elif scenario == "overlap":
            overlap(mx.kv.create(STORE))
        elif scenario == "horovod":
            horovod_api()
        elif scenario == "mismatch":
            mismatch(kv)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
