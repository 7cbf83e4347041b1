"""What the MXNet plugin test scenarios share (mx_worker.py, mx_byteps.py): the store
type under test, the result lines, the digits data and a small network."""
import json
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STORE = sys.argv[1]
# Two CPU contexts stand in for two devices of one worker.
DEVICES = [mx.cpu(0), mx.cpu(1)]


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


def step_on_devices(net, trainer, x, y, rows_per_ctx, ctxs, batch):
    """One training step with each context given its rows of (x, y)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        losses = [loss_fn(net(mx.nd.array(x[i], ctx=c)), mx.nd.array(y[i], ctx=c))
                  for i, c in zip(rows_per_ctx, ctxs)]
    for loss in losses:
        loss.backward()
    trainer.step(batch)


def _err(call):
    """The exception `call` raised, as "Type: message", or None."""
    try:
        out = call()
        if isinstance(out, mx.nd.NDArray):
            out.wait_to_read()
    except Exception as exc:  # noqa: BLE001 - reported and checked by the test
        return f"{type(exc).__name__}: {exc}"[:600]
    return None
