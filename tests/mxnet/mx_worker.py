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

SCENARIOS = sys.argv[2:]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "mxnet_kvstore", "examples"))

from mx_horovod_n import (horovod_generic, horovod_process_sets,  # noqa: E402
                          horovod_process_sets_two)
from mx_imagenet import imagenet_benchmark  # noqa: E402
from mx_byteps import (byteps_api, byteps_module, byteps_trainer_broadcasts,  # noqa: E402
                       byteps_training)
from mx_common import (DEVICES, STORE, _err, digits_xy, report, run_steps,  # noqa: E402
                       small_net, step_on_devices, weights)


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
    report("sync_sgd" if update_on_kvstore is None else "sync_sgd_workers", rank=r,
           max_abs_diff=max(diffs), min_moved=min(moved),
           update_on_kvstore=bool(tr._update_on_kvstore))


def compressed_sgd(kv):
    """MXNet's 2bit gradient compression through gluon.Trainer(compression_params=...):
    what a node pushes is compressed (the sum of its local ranks' gradients, as BytePS
    compresses after the local reduction), so 2 workers with batch b end where MXNet's own
    'device' store ends compressing the same way with one CPU context per node, each
    given its workers' rows (the servers, like the device store, run the optimizer on the
    unpacked sum)."""
    x, y = digits_xy()
    b, steps, n, r = 8, 10, kv.num_workers, kv.rank
    per_node = kv.local_size  # workers of a node have consecutive ranks (hybridrun)
    opt = dict(learning_rate=0.1, momentum=0.9, wd=1e-4)
    compression = {"type": "2bit", "threshold": 0.05}
    ctxs = [mx.cpu(i) for i in range(n // per_node)]
    ref = small_net(ctx=ctxs)
    ref_tr = gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=mx.kv.create("device"),
                           compression_params=compression)
    for s in range(steps):
        rows = [np.arange(s * n * b + j * per_node * b, s * n * b + (j + 1) * per_node * b)
                for j in range(len(ctxs))]
        step_on_devices(ref, ref_tr, x, y, rows, ctxs, n * b)
    net = small_net()
    tr = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv,
                       compression_params=compression)
    run_steps(net, tr, x, y,
              lambda s: np.arange(s * n * b + r * b, s * n * b + (r + 1) * b), steps, n * b)
    ref_w = weights(ref, ctxs[0])
    diffs = [float(np.abs(a - w).max()) for a, w in zip(ref_w, weights(net))]
    moved = [float(np.abs(a - w).max()) for a, w in zip(weights(small_net()), weights(net))]
    report("compressed_sgd", rank=r, max_abs_diff=max(diffs), min_moved=min(moved),
           update_on_kvstore=bool(tr._update_on_kvstore), nodes=len(ctxs))


def compression_refused(kv):
    """dist_allreduce: set_gradient_compression('2bit') is refused naming why; 'none' is
    accepted."""
    report("compressed_sgd", rank=kv.rank,
           two_bit=_err(lambda: kv.set_gradient_compression({"type": "2bit"})),
           one_bit=_err(lambda: kv.set_gradient_compression({"type": "1bit"})),
           none=_err(lambda: kv.set_gradient_compression({"type": "none"})))


# Two devices of one worker process: MXNet's CPU contexts stand in for GPUs, which this
# MXNet (from PyPI, CPU only) does not have.
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
    with staged_as_gpu(staged):
        net = small_net(ctx=DEVICES)
        tr = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
        for s in range(steps):
            rows = np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)
            step_on_devices(net, tr, x, y, np.array_split(rows, len(DEVICES)), DEVICES, n * b)
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


def classic(kv):
    """The classic API (init, push, pull) without an optimizer on the store: pull returns
    rank 0's init value, then the sum over the workers of the last push. Every worker
    offers a different value; the expected values are in the test."""
    r, n = kv.rank, kv.num_workers
    got = {}
    # An int key: init (rank 0's value wins), pull before any push, push then pull.
    init_value = mx.nd.full((2, 3), 10.0 * (r + 1))
    kv.init(3, init_value)
    a = mx.nd.zeros((2, 3))
    kv.pull(3, out=a)
    got["int_init"] = a.asnumpy().tolist()
    got["init_value_untouched"] = init_value.asnumpy().tolist()
    kv.push(3, mx.nd.full((2, 3), r + 1.0))
    kv.pull(3, out=a)
    got["int_push"] = a.asnumpy().tolist()
    # A str key, one value per device (summed), pulled into one array per device; two
    # pushes then one pull: the last push's sum.
    kv.init("w", mx.nd.full((4,), 7.0 + r))
    outs = [mx.nd.zeros((4,), ctx=c) for c in DEVICES]
    kv.pull("w", out=outs)
    got["str_init"] = [o.asnumpy().tolist() for o in outs]
    kv.push("w", [mx.nd.full((4,), (r + 1.0) * (d + 1), ctx=c) for d, c in enumerate(DEVICES)])
    kv.pull("w", out=outs)
    got["str_devices"] = [o.asnumpy().tolist() for o in outs]
    kv.push("w", mx.nd.full((4,), 1.0))
    kv.push("w", mx.nd.full((4,), 100.0 * (r + 1)))
    kv.pull("w", out=outs[0])
    got["str_last_push"] = outs[0].asnumpy().tolist()
    # Lists of keys: init, pull, push (one key with a value per device), pull (one key
    # into a list of outputs).
    keys = ["a", "b"]
    kv.init(keys, [mx.nd.full((2,), 1.0 + r), mx.nd.full((3,), 2.0 + r)])
    la, lb = mx.nd.zeros((2,)), mx.nd.zeros((3,))
    kv.pull(keys, out=[la, lb])
    got["list_init"] = [la.asnumpy().tolist(), lb.asnumpy().tolist()]
    kv.push(keys, [[mx.nd.full((2,), r + 1.0, ctx=c) for c in DEVICES],
                   mx.nd.full((3,), 10.0 * (r + 1))])
    la2 = [mx.nd.zeros((2,), ctx=c) for c in DEVICES]
    kv.pull(keys, out=[la2, lb])
    got["list_push"] = [[o.asnumpy().tolist() for o in la2], lb.asnumpy().tolist()]
    # A push without init, then pull.
    kv.push(11, mx.nd.arange(5) * (r + 1))
    c = mx.nd.zeros((5,))
    kv.pull(11, out=c)
    got["push_no_init"] = c.asnumpy().tolist()
    # A one-element list as a broadcast value (MXNet's stores take it), into an array and
    # into a one-element list of outputs.
    o1, o2 = mx.nd.zeros((3,)), mx.nd.zeros((3,))
    kv.broadcast("bl", [mx.nd.full((3,), 5.0 + r)], out=o1)
    kv.broadcast("bl2", [mx.nd.full((3,), 6.0 + r)], out=[o2])
    got["broadcast_list"] = [o1.asnumpy().tolist(), o2.asnumpy().tolist()]
    # Lists of keys in pushpull and broadcast too (MXNet's stores take them).
    pa, pb = mx.nd.full((2,), r + 1.0), mx.nd.full((3,), 2.0 * (r + 1))
    kv.pushpull(["pa", "pb"], [pa, pb])
    ba, bb = mx.nd.zeros((2,)), mx.nd.zeros((3,))
    kv.broadcast(["ba", "bb"], [mx.nd.full((2,), 1.0 + r), mx.nd.full((3,), 3.0 + r)],
                 out=[ba, [bb]])
    got["lists_pushpull_broadcast"] = [pa.asnumpy().tolist(), pb.asnumpy().tolist(),
                                       ba.asnumpy().tolist(), bb.asnumpy().tolist()]
    # MXNet's test_custom_store: one array twice in the values and in the outputs.
    arr_list = [mx.nd.empty((1,))] * 2
    kv.pushpull("custom", [mx.nd.ones((1,))] * 2, out=arr_list)
    first = arr_list[0].asnumpy().tolist()
    kv.pushpull("custom", arr_list)
    got["repeated_arrays"] = [first, arr_list[0].asnumpy().tolist()]
    # Errors: local (pull, row_sparse_pull) or raised by every worker before any
    # communication (push), so the workers go on together.
    rsp = mx.nd.sparse.zeros("row_sparse", (4,))
    got["errors"] = {
        "pull_unknown": _err(lambda: kv.pull("never", out=mx.nd.zeros((4,)))),
        "row_sparse_pull": _err(lambda: kv.row_sparse_pull(
            "w", out=rsp, row_ids=mx.nd.array([0], dtype="int64"))),
        "push_sparse": _err(lambda: kv.push("w", mx.nd.ones((4,)).tostype("row_sparse"))),
        "init_sparse": _err(lambda: kv.init("s", mx.nd.ones((4,)).tostype("row_sparse"))),
        "pull_sparse_strict": _err(lambda: kv.pull("w", out=rsp, ignore_sparse=False)),
        "push_shape": _err(lambda: kv.push("w", mx.nd.ones((5,)))),
        "broadcast_two": _err(lambda: kv.broadcast(
            "b2", [mx.nd.ones((3,)), mx.nd.ones((3,))], out=mx.nd.zeros((3,)))),
        "capability": _err(lambda: type(kv).is_capable("compression")),
    }
    # ignore_sparse=True (the default): sparse outputs are skipped, as MXNet does.
    got["pull_sparse_ignored"] = _err(lambda: kv.pull("w", out=[outs[0], rsp]))
    # is_capable on the class (MXNet's test_kvstore_custom calls it so) and the instance.
    got["capable"] = {"class": type(kv).is_capable("optimizer"),
                      "class_upper": type(kv).is_capable("OPTIMIZER"),
                      "instance": kv.is_capable("optimizer"),
                      "core": bool(kv._store.optimizer_capable)}
    report("classic", rank=r, n=n, **got)


def classic_optimizer(kv):
    """push/pull with the optimizer on the store (dist_hybrid; dist_allreduce refuses
    set_optimizer): plain SGD with lr 0.5 on a key init'ed before set_optimizer and on one
    init'ed after; each push of gradients is one update."""
    r = kv.rank
    sgd = mx.optimizer.create("sgd", learning_rate=0.5, rescale_grad=1.0)
    if not type(kv).is_capable("optimizer"):
        report("classic_optimizer", rank=r, error=_err(lambda: kv.set_optimizer(sgd)))
        return
    kv.init("before", mx.nd.full((3,), 2.0 + r))
    kv.set_optimizer(sgd)
    kv.init("after", mx.nd.full((3,), 4.0 + r))
    got = {}
    for key in ("before", "after"):
        w, steps = mx.nd.zeros((3,)), []
        kv.pull(key, out=w)
        steps.append(w.asnumpy().tolist())
        kv.push(key, mx.nd.full((3,), r + 1.0))  # gradients summing to 3
        kv.pull(key, out=w)
        steps.append(w.asnumpy().tolist())
        kv.push(key, [mx.nd.full((3,), 1.0, ctx=c) for c in DEVICES])  # summing to 2n
        kv.push(key, mx.nd.zeros((3,)))  # one more update, with a zero gradient
        kv.pull(key, out=w)
        steps.append(w.asnumpy().tolist())
        got[key] = steps
    report("classic_optimizer", rank=r, n=kv.num_workers, error=None, **got)


def module_fit(kv, on_workers):
    """mx.mod.Module.fit with the store: a small MLP on the digits, 2 workers with batch b
    each against one process (no kvstore) with batch n*b, the same initial weights and
    rescale_grad 1/(n*b) (Module would take 1/b: it multiplies by num_workers only for
    store types with '_sync' in their names). on_workers: MXNET_UPDATE_ON_KVSTORE=0, the
    optimizer on the workers (init + pushpull of the gradients)."""
    import hashlib
    x, y = digits_xy()
    perm = np.random.RandomState(0).permutation(len(x))  # the file's tail is harder
    x, y = x[perm], y[perm]
    n, r, b, epochs, ntrain = kv.num_workers, kv.rank, 16, 3, 1440
    steps = ntrain // (n * b)
    mine = np.concatenate([np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)
                           for s in range(steps)])
    opt = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4, "rescale_grad": 1.0 / (n * b)}

    def fit(xs, ys, batch, kvstore):
        data = mx.sym.Variable("data")
        net = mx.sym.FullyConnected(data, num_hidden=32, name="fc1")
        net = mx.sym.Activation(net, act_type="relu", name="relu1")
        net = mx.sym.FullyConnected(net, num_hidden=10, name="fc2")
        net = mx.sym.SoftmaxOutput(net, name="softmax")
        mod = mx.mod.Module(net, context=mx.cpu())
        it = mx.io.NDArrayIter(xs, ys, batch_size=batch, shuffle=False,
                               label_name="softmax_label")
        mx.random.seed(7)
        mod.fit(it, kvstore=kvstore, optimizer="sgd", optimizer_params=dict(opt),
                initializer=mx.init.Xavier(), num_epoch=epochs, eval_metric="acc")
        return mod

    def accuracy(mod, batch):
        it = mx.io.NDArrayIter(x[ntrain:], y[ntrain:], batch_size=batch,
                               label_name="softmax_label")
        pred = mod.predict(it).asnumpy()
        return float((pred.argmax(axis=1) == y[ntrain:]).mean())

    def flat(mod):
        params = mod.get_params()[0]
        return np.concatenate([params[k].asnumpy().ravel() for k in sorted(params)])

    ref = fit(x[:ntrain], y[:ntrain], n * b, None)
    saved = os.environ.get("MXNET_UPDATE_ON_KVSTORE")
    os.environ["MXNET_UPDATE_ON_KVSTORE"] = "0" if on_workers else "1"
    try:
        mod = fit(x[mine], y[mine], b, kv)
    finally:
        if saved is None:
            del os.environ["MXNET_UPDATE_ON_KVSTORE"]
        else:
            os.environ["MXNET_UPDATE_ON_KVSTORE"] = saved
    w, w_ref = flat(mod), flat(ref)
    report("module_fit_workers" if on_workers else "module_fit", rank=r,
           test_accuracy=accuracy(mod, b), ref_accuracy=accuracy(ref, n * b),
           max_abs_diff=float(np.abs(w - w_ref).max()),
           weights_sha256=hashlib.sha256(w.astype(np.float32).tobytes()).hexdigest(),
           update_on_kvstore=bool(mod._update_on_kvstore))


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
    name), on size, on the root or on the shape of one size, and allreduces whose shapes
    differ, 20 times each: what each rank got, error or value."""
    hps.init(STORE)
    r = hps.rank()
    got = []
    for case in ("dtype", "size", "root", "shape", "allreduce-shape"):
        for rep in range(20):
            name = f"bcast-{case}-{rep}"
            dtype, shape, root = "int32", (4,), 0
            if case == "dtype":
                hps.broadcast(mx.nd.full((4,), 7, dtype="int32"), 0, name=name).wait_to_read()
                dtype = "float32" if r == 1 else "int32"
            elif case == "size":
                shape = (6,) if r == 1 else (4,)
            elif case == "root":
                root = r
            else:  # one size, two shapes
                shape = (3, 2) if r == 1 else (2, 3)
            try:
                value = mx.nd.full(shape, 10 * r + 1, dtype=dtype)
                if case == "allreduce-shape":
                    out = hps.allreduce(value, op=hps.Sum, name=name)
                else:
                    out = hps.broadcast(value, root, name=name)
                got.append({"case": case, "rep": rep, "value": out.asnumpy().tolist()})
            except mx.base.MXNetError as exc:
                got.append({"case": case, "rep": rep, "error": str(exc).splitlines()[0][:600]})
    report("broadcast_mismatch", rank=r, got=got)


def deferred_broadcast():
    """broadcast_parameters before the shapes are known (deferred initialisation, as in
    Horovod's MNIST example): the parameters take rank 0's values at the first forward."""
    hps.init(STORE)
    r = hps.rank()
    mx.random.seed(100 + r)  # each worker initialises its weights differently
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize(mx.init.Uniform())
    deferred = sorted(n for n, p in net.collect_params().items() if p._deferred_init)
    hps.broadcast_parameters(net.collect_params(), root_rank=0, prefix="deferred.")
    out = net(mx.nd.ones((2, 5)))
    weights = {n: p.data().asnumpy().ravel().tolist()
               for n, p in sorted(net.collect_params().items())}
    # A second initialisation of the same parameters broadcasts nothing more.
    net.initialize(mx.init.Uniform(), force_reinit=True)
    report("deferred", rank=r, deferred=deferred, weights=weights,
           out=out.asnumpy().ravel().tolist())


def horovod_more():
    """The rest of horovod.mxnet's API: topology and build answers, allreduce's ops and
    scaling, alltoall, reducescatter, the refused calls."""
    hps.init(STORE)
    r, n = hps.rank(), hps.size()
    t = lambda: mx.nd.full((4,), r + 1.0)  # noqa: E731
    got = dict(
        initialized=hps.is_initialized(), cross_rank=hps.cross_rank(),
        cross_size=hps.cross_size(), local_rank=hps.local_rank(),
        local_size=hps.local_size(),
        built={f: getattr(hps, f)() for f in (
            "mpi_built", "gloo_built", "nccl_built", "cuda_built", "rocm_built",
            "mpi_enabled", "gloo_enabled", "mpi_threads_supported")},
        op_sum=hps.allreduce(t(), op=hps.Sum, name="op_sum").asnumpy().tolist(),
        op_average=hps.allreduce(t(), op=hps.Average).asnumpy().tolist(),
        default=hps.allreduce(t()).asnumpy().tolist(),
        average_false=hps.allreduce(t(), average=False).asnumpy().tolist(),
        average_true=hps.allreduce(t(), average=True).asnumpy().tolist(),
        scaled_sum=hps.allreduce(t(), op=hps.Sum, prescale_factor=2.0,
                                 postscale_factor=10.0).asnumpy().tolist(),
        scaled_average=hps.allreduce(t(), prescale_factor=3.0,
                                     postscale_factor=0.5).asnumpy().tolist())
    a = t()
    out = hps.allreduce(a, op=hps.Sum, prescale_factor=2.0)
    got["out_of_place_input"] = a.asnumpy().tolist()
    got["out_of_place"] = out.asnumpy().tolist()
    b = t()
    same = hps.allreduce_(b, op=hps.Sum, prescale_factor=2.0, postscale_factor=0.25) is b
    got["in_place"] = b.asnumpy().tolist()
    got["in_place_same"] = same
    # Min, Max, Product: rank 0 gives m0, rank 1 gives m1.
    m = lambda: mx.nd.array([[1, -5], [3, 0.5]] if r == 0 else [[2, 4], [-1, 8]])  # noqa: E731
    got["ops"] = {name: hps.allreduce(m(), op=op).asnumpy().tolist()
                  for name, op in (("Min", hps.Min), ("Max", hps.Max),
                                   ("Product", hps.Product))}
    got["min_scaled"] = hps.allreduce(m(), op=hps.Min, prescale_factor=2.0,
                                      postscale_factor=10.0).asnumpy().tolist()
    c = mx.nd.array([3 * r, 7 - r], dtype="int32")
    got["max_int_in_place"] = [hps.allreduce_(c, op=hps.Max) is c, c.dtype.__name__,
                               c.asnumpy().tolist()]
    got["adasum"] = _err(lambda: hps.allreduce(t(), op=hps.Adasum))
    got["refused_"] = _err(lambda: hps.allreduce_(t(), op=hps.Adasum))
    got["both"] = _err(lambda: hps.allreduce(t(), average=True, op=hps.Sum))
    got["missing"] = {"join": _err(hps.join)}
    # alltoall: rank r's row i holds 10 r + i; rank 0 sends 1 row to itself and 2 to rank
    # 1, rank 1 sends 2 to rank 0 and 1 to itself.
    rows = mx.nd.array([[10 * r + i] * 2 for i in range(3)])
    out, received = hps.alltoall(rows, splits=[1, 2] if r == 0 else [2, 1], name="a2a")
    got["alltoall"] = [out.asnumpy().tolist(), received.asnumpy().tolist(),
                       received.dtype.__name__]
    got["alltoall_even"] = hps.alltoall(mx.nd.arange(4) + 10 * r).asnumpy().tolist()
    got["alltoall_bad"] = [_err(lambda: hps.alltoall(rows, splits=[1, 1])),
                           _err(lambda: hps.alltoall(rows))]
    # reducescatter: 5 rows, row i of rank r holds (r + 1) * (i + 1): rank 0 keeps rows
    # 0-2, rank 1 rows 3-4.
    five = mx.nd.array([[(r + 1) * (i + 1)] * 2 for i in range(5)])
    got["reducescatter"] = hps.reducescatter(five).asnumpy().tolist()
    got["reducescatter_sum"] = hps.reducescatter(five, op=hps.Sum,
                                                 name="rs").asnumpy().tolist()
    got["reducescatter_max"] = hps.reducescatter(five, op=hps.Max).asnumpy().tolist()
    a, b = t(), mx.nd.full((2, 3), 10.0 * (r + 1))
    got["grouped_"] = [x.asnumpy().tolist() for x in hps.grouped_allreduce_(
        [a, b], op=hps.Sum, postscale_factor=2.0)]
    got["grouped_same"] = [x is y for x, y in zip(hps.grouped_allreduce_([a, b]), [a, b])]
    got["grouped"] = [x.asnumpy().tolist() for x in hps.grouped_allreduce(
        [t(), mx.nd.full((3,), 5.0 * r)], name="g")]
    got["grouped_product"] = [x.asnumpy().tolist() for x in hps.grouped_allreduce(
        [t(), m()], op=hps.Product)]
    # allgather: rank r gives r + 2 rows of 3 (the value says rank and row).
    rows = mx.nd.array([[100 * r + i] * 3 for i in range(r + 2)])
    gathered = hps.allgather(rows, name="rows")
    got["allgather"] = gathered.asnumpy().tolist()
    got["allgather_int"] = hps.allgather(
        mx.nd.full((1,), 7 * (r + 1), dtype="int32")).asnumpy().tolist()
    got["allgather_1d"] = hps.allgather(
        mx.nd.arange(r + 1) + 10 * r).asnumpy().tolist()  # 1 and 2 elements
    got["allgather_again"] = hps.allgather(mx.nd.full((1, 3), r), name="rows").asnumpy(
    ).tolist()
    report("horovod_more", rank=r, size=n, **got)


def horovod_fp16():
    """DistributedTrainer and DistributedOptimizer with compression=Compression.fp16
    against one process with the whole batch (fp32), as in horovod_api."""
    hps.init(STORE)
    r, n = hps.rank(), hps.size()
    x, y = digits_xy()
    b, steps = 8, 6
    opt = dict(learning_rate=0.1, momentum=0.9)
    ref = small_net()
    run_steps(ref, gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=None), x, y,
              lambda s: np.arange(s * n * b, (s + 1) * n * b), steps, n * b)
    mine = lambda s: np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)  # noqa: E731
    diffs, moved = {}, {}
    for kind in ("trainer", "optimizer"):
        net = small_net()
        if kind == "trainer":
            tr = hps.DistributedTrainer(net.collect_params(), "sgd", opt,
                                        compression=hps.Compression.fp16,
                                        prefix="fp16" + kind)
        else:
            dopt = hps.DistributedOptimizer(mx.optimizer.create("sgd", **opt),
                                            compression=hps.Compression.fp16)
            tr = gluon.Trainer(net.collect_params(), dopt, kvstore=None)
        run_steps(net, tr, x, y, mine, steps, b)
        diffs[kind] = max(float(np.abs(a - w).max())
                          for a, w in zip(weights(ref), weights(net)))
        moved[kind] = min(float(np.abs(a - w).max())
                          for a, w in zip(weights(small_net()), weights(net)))
    c = hps.Compression.fp16
    packed, ctx = c.compress(mx.nd.full((3,), 1.0 / 3))
    ints, _ = c.compress(mx.nd.ones((2,), dtype="int32"))
    same = mx.nd.ones((2,))
    report("horovod_fp16", rank=r, diffs=diffs, moved=moved,
           wire_dtype=str(np.dtype(packed.dtype)), back=str(np.dtype(
               c.decompress(packed, ctx).dtype)), int_dtype=str(np.dtype(ints.dtype)),
           none_same=hps.Compression.none.compress(same)[0] is same)


def horovod_timeline():
    """start_timeline / stop_timeline around an allreduce and a broadcast (an allreduce
    before the start stays out): worker 0's file, and none from worker 1, as Horovod."""
    hps.init(STORE)
    r = hps.rank()
    path = os.path.join(tempfile.mkdtemp(), "timeline.json")
    hps.allreduce(mx.nd.ones((10,)), name="tl_before").wait_to_read()
    hps.start_timeline(path, mark_cycles=True)
    again = _err(lambda: hps.start_timeline(path))
    hps.allreduce(mx.nd.ones((1000,)), name="tl_sum").wait_to_read()
    hps.broadcast(mx.nd.ones((10,)), root_rank=0, name="tl_bcast").wait_to_read()
    hps.stop_timeline()
    hps.stop_timeline()  # nothing running: nothing
    trace = None
    if os.path.exists(path):
        with open(path) as f:
            trace = json.load(f)
    report("horovod_timeline", rank=r, trace=trace, again=again)


def horovod_objects():
    """broadcast_object and allgather_object, from any root, with objects of different
    sizes on each rank."""
    hps.init(STORE)
    r = hps.rank()
    mine = {"rank": r, "name": "worker" * (r + 1), "data": list(range(10 * r)), r: (r,)}
    report("horovod_objects", rank=r, mine=repr(mine),
           from1=repr(hps.broadcast_object(mine, root_rank=1)),
           from0=repr(hps.broadcast_object(mine, root_rank=0, name="obj")),
           again=repr(hps.broadcast_object([r] * (5 + r), root_rank=1, name="obj")),
           gathered=repr(hps.allgather_object(mine)),
           gathered_none=repr(hps.allgather_object(None if r else "x" * 1000, name="o")))


def horovod_shutdown():
    """shutdown() leaves the job: is_initialized turns False, init() again is refused."""
    hps.init(STORE)
    r = hps.rank()
    # A broadcast: on dist_hybrid the servers run an optimizer by now (no plain sums).
    x = hps.broadcast(mx.nd.full((2,), r + 1.0), root_rank=1, name="before_shutdown")
    hps.shutdown()
    report("horovod_shutdown", rank=r, before=x.asnumpy().tolist(),
           initialized=hps.is_initialized(), again=_err(lambda: hps.init(STORE)),
           rank_after=_err(hps.rank), second_shutdown=_err(hps.shutdown))


def main():
    kv = mx.kv.create(STORE)  # the first store: save and load use it
    new = lambda: mx.kv.create(STORE)  # noqa: E731 (a store of its own per scenario)
    scenarios = {
        "sync_sgd": lambda: sync_sgd(new(), None),
        "sync_sgd_workers": lambda: sync_sgd(new(), False),
        "digits": lambda: digits(new()),
        "save": lambda: save(kv),
        "load": lambda: load(kv),
        "overlap": lambda: overlap(new()),
        "plain_sum": plain_sum_after_optimizer,
        "horovod": horovod_api,
        "byteps": byteps_api,
        "imagenet_benchmark": lambda: imagenet_benchmark(new()),
        "horovod_generic": horovod_generic,
        "horovod_process_sets": horovod_process_sets,
        "byteps_training": byteps_training,
        "byteps_trainer_broadcasts": byteps_trainer_broadcasts,
        "byteps_module": byteps_module,
        "horovod_more": horovod_more,
        "horovod_fp16": horovod_fp16,
        "horovod_timeline": horovod_timeline,
        "horovod_objects": horovod_objects,
        "horovod_process_sets_two": horovod_process_sets_two,
        "horovod_shutdown": horovod_shutdown,
        "deferred": deferred_broadcast,
        "devices": lambda: devices(new(), False),
        "devices_staged": lambda: devices(new(), True),
        "devices_staged_host": lambda: devices(new(), True, "host"),
        "order": lambda: issue_order(new()),
        "devices_trainer": lambda: devices_trainer(new(), False),
        "devices_trainer_staged": lambda: devices_trainer(new(), True),
        "mismatch": lambda: mismatch(new()),
        "compressed_sgd": lambda: (compressed_sgd(new()) if STORE == "dist_hybrid"
                                   else compression_refused(new())),
        "broadcast_mismatch": broadcast_mismatch,
        "classic": lambda: classic(new()),
        "classic_optimizer": lambda: classic_optimizer(new()),
        "module_fit": lambda: module_fit(new(), False),
        "module_fit_workers": lambda: module_fit(new(), True),
    }
    for scenario in SCENARIOS:
        if scenario not in scenarios:
            raise SystemExit(f"unknown scenario {scenario}")
        scenarios[scenario]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
