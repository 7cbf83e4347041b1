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


def small_net(seed=7, ctx=None):
    """The same initial weights for a given seed, on one or several contexts."""
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(10))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net(mx.nd.zeros((1, 64), ctx=ctx[0] if ctx else None))
    return net


def weights(net, ctx=None):
    return [p.data(ctx).asnumpy().copy() for p in net.collect_params().values()]


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


# Two devices of one worker process: MXNet's CPU contexts stand in for GPUs, which this
# MXNet (from PyPI, CPU only) does not have.
DEVICES = [mx.cpu(0), mx.cpu(1)]


class staged_as_gpu:
    """Within it, the plugin treats CPU arrays as it treats GPU arrays: copied into its
    pinned host arrays, summed and push_pulled there, copied back."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        from hybridps.mxnet import kvstore as plugin
        self.saved = plugin._HOST_DEVICE_TYPES
        if self.on:
            plugin._HOST_DEVICE_TYPES = ("cpu_pinned",)

    def __exit__(self, *exc):
        from hybridps.mxnet import kvstore as plugin
        plugin._HOST_DEVICE_TYPES = self.saved


def devices(kv, staged, merge="device"):
    """pushpull and broadcast with one array per device, out of place and in place, over
    three rounds (the staging arrays are reused); the expected sums are in the test.
    `merge`: where the plugin sums the devices' arrays when they are staged (the store's
    HYBRIDPS_MXNET_MERGE, set here on the object)."""
    r, n = kv.rank, kv.num_workers
    kv._merge_on_device = merge == "device"
    base = np.arange(15, dtype=np.float32).reshape(3, 5)
    got = {"rounds": [], "inplace": [], "one": [], "bcast": []}
    with staged_as_gpu(staged):
        for k in range(3):
            vals = [mx.nd.array(base * (r + 1) * (k + 1) + d, ctx=c)
                    for d, c in enumerate(DEVICES)]
            outs = [mx.nd.zeros(base.shape, ctx=c) for c in DEVICES]
            kv.pushpull("dev", vals, out=outs)
            got["rounds"].append([o.asnumpy().tolist() for o in outs])
        vals = [mx.nd.array(base * (r + 1) + d, ctx=c) for d, c in enumerate(DEVICES)]
        kv.pushpull("dev_inplace", vals)
        got["inplace"] = [v.asnumpy().tolist() for v in vals]
        one = mx.nd.array(base * (r + 1), ctx=DEVICES[1])
        outs = [mx.nd.zeros(base.shape, ctx=c) for c in DEVICES]
        kv.pushpull("dev_one", one, out=outs)
        got["one"] = [o.asnumpy().tolist() for o in outs]
        w = [mx.nd.full(base.shape, 10.0 * r + d, ctx=c) for d, c in enumerate(DEVICES)]
        kv.broadcast("dev_bcast", w[1], out=w, root_rank=n - 1)
        got["bcast"] = [a.asnumpy().tolist() for a in w]
        got["staging"] = sorted({str(a.context) for a in kv._staging.values()})
        # Where the devices' arrays were summed, per tensor; the host arrays of "dev".
        got["merged_on"] = {n.split("/", 1)[1]: str(c) for n, c in kv._merge_ctx.items()}
        got["dev_host_slots"] = sorted(str(slot) for name, slot in kv._staging
                                       if name.endswith("/dev"))
    scenario = "devices_staged" if staged else "devices"
    report(scenario if merge == "device" else f"{scenario}_{merge}", rank=r, n=n, **got)


def issue_order(kv):
    """Two push_pulls of one name through different arrays, the first one's input still
    being computed on worker 1 only (a few large products): MXNet's engine could run the
    second one first there, while worker 0 runs them in order. The sums show which pairs
    the workers' operations made."""
    r = kv.rank
    first = mx.nd.full((64,), 1.0 + r)
    if r == 1:
        m = mx.nd.random.uniform(shape=(1500, 1500))
        for _ in range(4):
            m = mx.nd.dot(m, m) * 1e-3
        first = first + mx.nd.sum(m) * 0  # ready only after the products
    second = mx.nd.full((64,), 10.0 * (1 + r))
    kv.pushpull("order", first)
    kv.pushpull("order", second)
    report("order", rank=r, first=float(first[0].asscalar()),
           second=float(second[0].asscalar()))


def devices_trainer(kv, staged):
    """gluon.Trainer over two devices per worker (each takes half of the worker's batch
    b) against one process on one device with batch 2b: the same weights on both
    devices, as sync_sgd checks for one device."""
    x, y = digits_xy()
    b, steps, n, r = 8, 6, kv.num_workers, kv.rank
    opt = dict(learning_rate=0.1, momentum=0.9, wd=1e-4)
    ref = small_net()
    run_steps(ref, gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=None), x, y,
              lambda s: np.arange(s * n * b, (s + 1) * n * b), steps, n * b)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with staged_as_gpu(staged):
        net = small_net(ctx=DEVICES)
        tr = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
        for s in range(steps):
            rows = np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)
            halves = np.array_split(rows, len(DEVICES))
            with autograd.record():
                losses = [loss_fn(net(mx.nd.array(x[h], ctx=c)), mx.nd.array(y[h], ctx=c))
                          for h, c in zip(halves, DEVICES)]
            for loss in losses:
                loss.backward()
            tr.step(n * b)
        diffs = [float(np.abs(a - w).max()) for c in DEVICES
                 for a, w in zip(weights(ref), weights(net, c))]
        moved = [float(np.abs(a - w).max())
                 for a, w in zip(weights(small_net()), weights(net, DEVICES[1]))]
        staging = sorted({str(a.context) for a in kv._staging.values()})
        merged_on = sorted({str(c) for c in kv._merge_ctx.values()})
    report("devices_trainer_staged" if staged else "devices_trainer", rank=r,
           max_abs_diff=max(diffs), min_moved=min(moved), staging=staging,
           merged_on=merged_on,
           update_on_kvstore=bool(tr._update_on_kvstore))


def digits(kv):
    import train_digits
    args = train_digits.parse_args(["--kvstore", STORE, "--epochs", "15"])
    result = train_digits.train_digits(args, kv, kv.rank, kv.num_workers)
    report("digits", **result)


def _save_load_setup(kv):
    x, y = digits_xy()
    n, r, b = kv.num_workers, kv.rank, 8
    rows = lambda s: np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)  # noqa: E731
    # rescale_grad given up front and step(1): gluon.Trainer refuses a step whose
    # rescale_grad differs from the one the store-side optimizer got, and load_states
    # sets the optimizer up before any step(batch_size) could set it.
    opt = dict(learning_rate=0.05, momentum=0.9, wd=1e-3, rescale_grad=1.0 / (n * b))
    state_dir = os.environ["MXW_STATE_DIR"]
    files = {k: os.path.join(state_dir, f"{k}-{r}") for k in ("params", "states", "expected")}
    return x, y, n, r, b, rows, opt, files


def save(kv):
    """Job 1: train 5 steps, save the weights and the trainer's states, train 5 more and
    record the weights. Uses the job's first store (tensor names 0/...), like a new job."""
    x, y, n, r, b, rows, opt, files = _save_load_setup(kv)
    net = small_net()
    tr = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    run_steps(net, tr, x, y, rows, 5, 1)
    net.save_parameters(files["params"])
    tr.save_states(files["states"])
    run_steps(net, tr, x, y, lambda s: rows(s + 5), 5, 1)
    np.save(files["expected"], np.concatenate([w.ravel() for w in weights(net)]))
    report("save", rank=r, update_on_kvstore=bool(tr._update_on_kvstore))


def load(kv):
    """Job 2: load the weights and the states, train the same 5 steps: the weights must
    be those job 1 recorded."""
    x, y, n, r, b, rows, opt, files = _save_load_setup(kv)
    net = small_net(seed=99)
    net.load_parameters(files["params"])
    tr = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    tr.load_states(files["states"])
    run_steps(net, tr, x, y, lambda s: rows(s + 5), 5, 1)
    got = np.concatenate([w.ravel() for w in weights(net)])
    expected = np.load(files["expected"] + ".npy")
    report("load", rank=r, max_abs_diff=float(np.abs(got - expected).max()),
           update_on_kvstore=bool(tr._update_on_kvstore))


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


def plain_sum_after_optimizer():
    """After a Trainer put the optimizer on the servers (dist_hybrid), a plain sum is
    refused with a message saying why; dist_allreduce has no such mode."""
    kv = mx.kv.create(STORE)
    try:
        a = mx.nd.ones((4,))
        kv.pushpull("plain", a)
        a.wait_to_read()
        report("plain_sum", rank=kv.rank, error=None, value=a.asnumpy().tolist())
    except (RuntimeError, mx.base.MXNetError) as exc:
        report("plain_sum", rank=kv.rank, error=str(exc)[:600])


def mismatch(kv):
    """Rank r offers a tensor of r+3 elements under one key: every worker gets an error."""
    a = mx.nd.ones((kv.rank + 3,))
    try:
        kv.pushpull("mismatch", a)
        a.wait_to_read()
        report("mismatch", rank=kv.rank, error=None)
    except mx.base.MXNetError as exc:
        report("mismatch", rank=kv.rank, error=str(exc).splitlines()[0][:600])


def broadcast_mismatch():
    """Horovod-style broadcasts whose ranks disagree on dtype (after a good broadcast of the
    name), on size or on the root, 20 times each: what each rank got, error or value."""
    hps.init(STORE)
    r = hps.rank()
    got = []
    for case in ("dtype", "size", "root"):
        for rep in range(20):
            name = f"bcast-{case}-{rep}"
            dtype, size, root = "int32", 4, 0
            if case == "dtype":
                hps.broadcast(mx.nd.full((4,), 7, dtype="int32"), 0, name=name).wait_to_read()
                dtype = "float32" if r == 1 else "int32"
            elif case == "size":
                size = 6 if r == 1 else 4
            else:
                root = r
            try:
                out = hps.broadcast(mx.nd.full((size,), 10 * r + 1, dtype=dtype), root,
                                    name=name)
                got.append({"case": case, "rep": rep, "value": out.asnumpy().tolist()})
            except mx.base.MXNetError as exc:
                got.append({"case": case, "rep": rep, "error": str(exc).splitlines()[0][:600]})
    report("broadcast_mismatch", rank=r, got=got)


def main():
    kv = mx.kv.create(STORE)  # the first store: save and load use it
    for scenario in SCENARIOS:
        if scenario == "sync_sgd":
            sync_sgd(mx.kv.create(STORE), None)
        elif scenario == "sync_sgd_workers":
            sync_sgd(mx.kv.create(STORE), False)
        elif scenario == "digits":
            digits(mx.kv.create(STORE))
        elif scenario == "save":
            save(kv)
        elif scenario == "load":
            load(kv)
        elif scenario == "overlap":
            overlap(mx.kv.create(STORE))
        elif scenario == "plain_sum":
            plain_sum_after_optimizer()
        elif scenario == "horovod":
            horovod_api()
        elif scenario in ("devices", "devices_staged"):
            devices(mx.kv.create(STORE), scenario == "devices_staged")
        elif scenario == "order":
            issue_order(mx.kv.create(STORE))
        elif scenario == "devices_staged_host":
            devices(mx.kv.create(STORE), True, "host")
        elif scenario in ("devices_trainer", "devices_trainer_staged"):
            devices_trainer(mx.kv.create(STORE), scenario == "devices_trainer_staged")
        elif scenario == "mismatch":
            mismatch(mx.kv.create(STORE))
        elif scenario == "broadcast_mismatch":
            broadcast_mismatch()
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
