"""The BytePS-style API's scenarios (import hybridps.mxnet.byteps as bps), run by
mx_worker.py; the checks are in test_mxnet_kvstore.py."""
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import hybridps.mxnet as hps
from mx_common import DEVICES, _err, digits_xy, report, run_steps, small_net, weights


def byteps_api():
    """byteps.mxnet's calls (import hybridps.mxnet.byteps as bps): init from hybridrun's
    HYBRIDPS_BACKEND, ranks and sizes, push_pull (in place, mean by default, sum with
    is_average=False), broadcast_parameters from rank 1, and the refused calls."""
    import warnings
    import hybridps.mxnet.byteps as bps
    bps.init()  # no backend given: the store comes from hybridrun's HYBRIDPS_BACKEND
    r, n = bps.rank(), bps.size()
    got = dict(store=hps.horovod._store().type, rank_=r, size=n,
               local_rank=bps.local_rank(), local_size=bps.local_size(),
               same_as_horovod=[bps.rank(), bps.size(), bps.local_rank(),
                                bps.local_size()] == [hps.rank(), hps.size(),
                                                      hps.local_rank(), hps.local_size()])
    for name in ("avg", "sum", "f64", "f16", "i32", "same", "twice"):
        bps.byteps_declare_tensor(name)
    bps.byteps_declare_tensor("avg")  # again: nothing more
    a = mx.nd.array([[1, 2, 3], [4, 5, 6]]) * (r + 1)
    got["returned"] = repr(bps.byteps_push_pull(a, name="avg", priority=3))
    got["avg"] = a.asnumpy().tolist()  # the same array, now the mean
    s = mx.nd.full((4,), r + 1.0)
    bps.byteps_push_pull(s, name="sum", is_average=False)
    got["sum"] = s.asnumpy().tolist()
    f64 = mx.nd.full((3,), r + 0.25, dtype="float64")
    bps.byteps_push_pull(f64, name="f64")
    f16 = mx.nd.full((5,), 1.5 * (r + 1), dtype="float16")
    bps.byteps_push_pull(f16, name="f16", is_average=False)
    i32 = mx.nd.full((2,), 7 * (r + 1), dtype="int32")
    bps.byteps_push_pull(i32, name="i32", is_average=False)
    got["dtypes"] = {k: [str(np.dtype(v.dtype)), v.asnumpy().tolist()]
                     for k, v in (("f64", f64), ("f16", f16), ("i32", i32))}
    # BytePS's own check: the same input everywhere, averaged, is the input.
    mx.random.seed(1234)
    same = mx.nd.random.uniform(-100, 100, shape=(17, 17, 17))
    before = same.copy()
    bps.byteps_push_pull(same, name="same")
    got["same_unchanged"] = bool((same == before).asnumpy().all())
    # Twice in place: the mean of the means (rank r gives 10 * (r + 1): 15, then 15).
    t = mx.nd.full((2,), 10.0 * (r + 1))
    bps.byteps_push_pull(t, name="twice")
    bps.byteps_push_pull(t, name="twice")
    got["twice"] = t.asnumpy().tolist()
    # broadcast_parameters from rank n - 1: a dict of NDArrays (Module.get_params()) and a
    # ParameterDict whose workers were seeded differently.
    arrays = {"w": mx.nd.full((2, 2), 10.0 * r + 1), "b": mx.nd.arange(3) + 100 * r}
    bps.broadcast_parameters(arrays, root_rank=n - 1)
    got["bcast_dict"] = {k: v.asnumpy().tolist() for k, v in sorted(arrays.items())}
    net = small_net(seed=7 + r)
    bps.broadcast_parameters(net.collect_params(), root_rank=n - 1)
    got["bcast_params"] = [w.ravel()[:4].tolist() for w in weights(net)]
    root_net = small_net(seed=7 + n - 1)  # what rank n - 1 started with
    got["root_params"] = [w.ravel()[:4].tolist() for w in weights(root_net)]
    # Refusals and wrong uses (each raised before any communication).
    sgd = lambda: mx.optimizer.create("sgd")  # noqa: E731
    saved = os.environ.get("BYTEPS_ENABLE_ASYNC")
    os.environ["BYTEPS_ENABLE_ASYNC"] = "1"
    async_err = _err(lambda: bps.DistributedOptimizer(sgd()))
    if saved is None:
        del os.environ["BYTEPS_ENABLE_ASYNC"]
    else:
        os.environ["BYTEPS_ENABLE_ASYNC"] = saved
    got["errors"] = {
        "undeclared": _err(lambda: bps.byteps_push_pull(mx.nd.ones((2,)), name="nope")),
        "unnamed": _err(lambda: bps.byteps_push_pull(mx.nd.ones((2,)))),
        "version": _err(lambda: bps.byteps_push_pull(mx.nd.ones((2,)), version=1,
                                                     name="avg")),
        "declare_kwargs": _err(lambda: bps.byteps_declare_tensor(
            "g", byteps_compressor_type="onebit")),
        "suspend": _err(bps.suspend),
        "resume": _err(lambda: bps.resume(2, 1, 0)),
        "compressor": _err(lambda: bps.DistributedTrainer(
            net.collect_params(), "sgd", {"momentum": 0.9},
            compression_params={"compressor": "onebit", "ef": "vanilla"})),
        "async": async_err,
        "nag": _err(lambda: bps.Compression.nag(bps.Compression.none, 0.9, 0)),
        "bcast_list": _err(lambda: bps.broadcast_parameters([mx.nd.ones((2,))])),
    }
    # bps.Compression, called as BytePS's trainer calls it (decompress(..., x=weight)).
    c = bps.Compression.fp16
    packed, ctx = c.compress(mx.nd.full((3,), 1.0 / 3))
    back = c.decompress(packed, ctx, x=mx.nd.ones((3,)))
    plain = mx.nd.ones((2,))
    got["compression"] = [str(np.dtype(packed.dtype)), str(np.dtype(back.dtype)),
                          bps.Compression.none.compress(plain)[0] is plain]
    # A DistributedOptimizer given to DistributedTrainer is unwrapped, with a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr = bps.DistributedTrainer(small_net().collect_params(),
                                    bps.DistributedOptimizer(sgd()))
    got["unwrapped"] = [type(tr._optimizer).__name__,
                        [str(w.message)[:200] for w in caught]]
    report("byteps", rank=r, **got)


def byteps_training():
    """bps.DistributedTrainer (also with compression_params={'fp16': True}) and
    gluon.Trainer(bps.DistributedOptimizer(...)) after bps.broadcast_parameters: workers
    seeded differently, root_rank 1, step(per-worker batch b), against one process with
    rank 1's initial weights and batch 2b."""
    import hashlib
    import hybridps.mxnet.byteps as bps
    bps.init()
    r, n = bps.rank(), bps.size()
    root = n - 1
    x, y = digits_xy()
    b, steps = 8, 6
    opt = dict(learning_rate=0.1, momentum=0.9, wd=1e-4)
    ref = small_net(seed=7 + root)
    run_steps(ref, gluon.Trainer(ref.collect_params(), "sgd", opt, kvstore=None), x, y,
              lambda s: np.arange(s * n * b, (s + 1) * n * b), steps, n * b)
    mine = lambda s: np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)  # noqa: E731
    got = {}
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for kind in ("trainer", "trainer_fp16", "trainer_devices", "optimizer"):
        # Different on purpose: the broadcast fixes it.
        net = small_net(seed=7 + r, ctx=DEVICES if kind == "trainer_devices" else None)
        if kind == "trainer_devices":
            # Two devices per worker, each half of its batch; given as a list of
            # Parameters (BytePS's trainer takes a ParameterDict only).
            tr = bps.DistributedTrainer(list(net.collect_params().values()), "sgd",
                                        dict(opt), root_rank=root)
            for s in range(steps):
                halves = np.array_split(mine(s), len(DEVICES))
                with autograd.record():
                    losses = [loss_fn(net(mx.nd.array(x[h], ctx=c)),
                                      mx.nd.array(y[h], ctx=c))
                              for h, c in zip(halves, DEVICES)]
                for loss in losses:
                    loss.backward()
                tr.step(b)
            w = weights(net, DEVICES[0])
            got["devices_equal"] = all(np.array_equal(a, c) for a, c in
                                       zip(w, weights(net, DEVICES[1])))
        elif kind == "optimizer":
            bps.broadcast_parameters(net.collect_params(), root_rank=root)
            tr = gluon.Trainer(net.collect_params(),
                               bps.DistributedOptimizer(mx.optimizer.create("sgd", **opt)),
                               kvstore=None)
        else:
            fp16 = {"fp16": True} if kind == "trainer_fp16" else None
            tr = bps.DistributedTrainer(net.collect_params(), "sgd", dict(opt),
                                        root_rank=root, compression_params=fp16)
        if kind != "trainer_devices":
            run_steps(net, tr, x, y, mine, steps, b)
            w = weights(net)
        got[kind] = dict(
            diff=max(float(np.abs(a - c).max()) for a, c in zip(weights(ref), w)),
            moved=min(float(np.abs(a - c).max())
                      for a, c in zip(weights(small_net(seed=7 + root)), w)),
            sha256=hashlib.sha256(np.concatenate([a.ravel() for a in w]).tobytes())
            .hexdigest(),
            rescale_grad=float(tr._optimizer.rescale_grad))
    report("byteps_training", rank=r, **got)


def byteps_module():
    """BytePS's Module flow (its example's fit_byteps.py): bind, init_params, then
    bps.broadcast_parameters of get_params()' dicts (from rank 1, the workers seeded
    differently), set_params, and fit(kvstore=None, optimizer=bps.DistributedOptimizer(opt))
    with opt's rescale_grad 1/b; against one process with batch 2b from rank 1's weights."""
    import hashlib
    import hybridps.mxnet.byteps as bps
    bps.init()
    r, n = bps.rank(), bps.size()
    root, b, ntrain = n - 1, 16, 320
    x, y = digits_xy()
    mine = np.concatenate([np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)
                           for s in range(ntrain // (n * b))])

    def module(batch, seed):
        data = mx.sym.Variable("data")
        net = mx.sym.FullyConnected(data, num_hidden=32, name="fc1")
        net = mx.sym.Activation(net, act_type="relu", name="relu1")
        net = mx.sym.FullyConnected(net, num_hidden=10, name="fc2")
        mod = mx.mod.Module(mx.sym.SoftmaxOutput(net, name="softmax"), context=mx.cpu())
        mod.bind(data_shapes=[("data", (batch, 64))],
                 label_shapes=[("softmax_label", (batch,))])
        mx.random.seed(seed)
        mod.init_params(mx.init.Xavier())
        return mod

    def sgd(batch):
        return mx.optimizer.create("sgd", learning_rate=0.1, momentum=0.9, wd=1e-4,
                                   rescale_grad=1.0 / batch)

    def flat(mod):
        params = mod.get_params()[0]
        return np.concatenate([params[k].asnumpy().ravel() for k in sorted(params)])

    def data(rows, batch):
        return mx.io.NDArrayIter(x[rows], y[rows], batch_size=batch, shuffle=False,
                                 label_name="softmax_label")

    ref = module(n * b, 7 + root)
    start = flat(ref)
    ref.fit(data(np.arange(ntrain), n * b), kvstore=None, optimizer=sgd(n * b),
            num_epoch=1)
    mod = module(b, 7 + r)
    arg_params, aux_params = mod.get_params()
    bps.broadcast_parameters(arg_params, root_rank=root)
    bps.broadcast_parameters(aux_params, root_rank=root)
    mod.set_params(arg_params=arg_params, aux_params=aux_params)
    mod.fit(data(mine, b), kvstore=None, optimizer=bps.DistributedOptimizer(sgd(b)),
            num_epoch=1)
    w = flat(mod)
    report("byteps_module", rank=r, max_abs_diff=float(np.abs(w - flat(ref)).max()),
           moved=float(np.abs(w - start).max()),
           weights_sha256=hashlib.sha256(w.astype(np.float32).tobytes()).hexdigest())


def byteps_trainer_broadcasts():
    """When bps.DistributedTrainer broadcasts root_rank's parameters: at its creation,
    again at the first step (a parameter changed in between takes the root's value
    again), and a deferred one right after its initialisation, before the first forward
    pass uses it."""
    import hybridps.mxnet.byteps as bps
    bps.init()
    r, n = bps.rank(), bps.size()
    root = n - 1
    net = gluon.nn.Dense(3, in_units=4, use_bias=False)
    net.initialize(mx.init.Constant(r + 1.0))
    tr = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                root_rank=root)
    created = net.weight.data().asnumpy().ravel().tolist()
    if r != root:
        net.weight.set_data(mx.nd.full((3, 4), 100.0))
    with autograd.record():
        loss = net(mx.nd.zeros((2, 4))).sum()  # a zero gradient: SGD leaves the weights
    loss.backward()
    tr.step(2)
    first_step = net.weight.data().asnumpy().ravel().tolist()
    deferred = gluon.nn.Dense(3, use_bias=False)
    deferred.initialize(mx.init.Constant(r + 1.0))
    bps.DistributedTrainer(deferred.collect_params(), "sgd", root_rank=root)
    out = deferred(mx.nd.ones((1, 4))).asnumpy().ravel().tolist()
    report("byteps_trainer_broadcasts", rank=r, root=root, created=created,
           first_step=first_step, deferred_out=out)
