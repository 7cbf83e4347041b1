"""A train_imagenet.py --benchmark 1 style job, run by mx_worker.py: MXNet's Module.fit
with kvstore=the store on synthetic images (random data and labels, as that script's
SyntheticDataIter), a small residual network of convolutions and batch norms, a few
batches of a small batch. The checks are in test_mxnet_kvstore.py."""
import hashlib
import time

import mxnet as mx
import numpy as np

from mx_common import report


def residual_net(num_classes=10, filters=8):
    """conv, bn, relu; one residual unit of two convs; global pooling; fc; softmax."""
    def conv_bn(x, name, relu=True):
        x = mx.sym.Convolution(x, num_filter=filters, kernel=(3, 3), pad=(1, 1),
                               no_bias=True, name=f"{name}_conv")
        x = mx.sym.BatchNorm(x, fix_gamma=False, name=f"{name}_bn")
        return mx.sym.Activation(x, act_type="relu") if relu else x

    body = conv_bn(mx.sym.Variable("data"), "stem")
    body = mx.sym.Activation(conv_bn(conv_bn(body, "unit1a"), "unit1b", relu=False) + body,
                             act_type="relu")
    pool = mx.sym.Pooling(body, global_pool=True, kernel=(1, 1), pool_type="avg")
    fc = mx.sym.FullyConnected(mx.sym.Flatten(pool), num_hidden=num_classes, name="fc1")
    return mx.sym.SoftmaxOutput(fc, name="softmax")


def imagenet_benchmark(kv):
    """Each worker fits its own synthetic batches (seeded by rank) for one epoch: the
    weights (not the batch norms' running statistics, which MXNet keeps per worker) end
    the same on every worker."""
    batch, batches, shape = 8, 6, (3, 16, 16)
    rng = np.random.RandomState(100 + kv.rank)
    data = rng.uniform(-1, 1, (batch * batches,) + shape).astype(np.float32)
    label = rng.randint(0, 10, batch * batches).astype(np.float32)
    it = mx.io.NDArrayIter(data, label, batch_size=batch, label_name="softmax_label")
    mod = mx.mod.Module(residual_net(), context=mx.cpu())
    mx.random.seed(3)  # the same initial weights everywhere (the store broadcasts them too)
    start = time.perf_counter()
    mod.fit(it, kvstore=kv, optimizer="sgd", num_epoch=1, initializer=mx.init.Xavier(),
            optimizer_params={"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4,
                              "rescale_grad": 1.0 / (batch * kv.num_workers)})
    mx.nd.waitall()
    elapsed = time.perf_counter() - start
    args, _ = mod.get_params()
    flat = np.concatenate([args[k].asnumpy().ravel() for k in sorted(args)])
    mod0 = mx.mod.Module(residual_net(), context=mx.cpu())
    mod0.bind(data_shapes=it.provide_data, label_shapes=it.provide_label)
    mx.random.seed(3)
    mod0.init_params(initializer=mx.init.Xavier())
    start_args, _ = mod0.get_params()
    moved = min(float(np.abs(args[k].asnumpy() - start_args[k].asnumpy()).max())
                for k in args)
    report("imagenet_benchmark", rank=kv.rank, update_on_kvstore=bool(mod._update_on_kvstore),
           weights_sha256=hashlib.sha256(flat.tobytes()).hexdigest(), min_moved=moved,
           finite=bool(np.isfinite(flat).all()),
           samples_per_s=batch * batches / elapsed, params=sorted(args))
