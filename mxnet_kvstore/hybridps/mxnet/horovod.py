"""horovod.mxnet's API on a hybridps store: a Horovod MXNet script ports by changing its
import (`import hybridps.mxnet as hvd`) and being started by scripts/hybridrun.

The store is dist_hybrid unless init(backend=...) or HYBRIDPS_BACKEND says otherwise.
As in Horovod, allreduce averages by default, DistributedOptimizer and
DistributedTrainer average the gradients over the workers (so trainer.step takes the
per-worker batch size), and names must agree across workers (unnamed operations are
numbered in call order, which must then be the same everywhere).
"""
import itertools
import os
import types

import mxnet as mx
from mxnet import gluon

from .kvstore import DistAllreduce, DistHybrid

_kv = None
_counters = {"allreduce": itertools.count(), "broadcast": itertools.count()}


def init(backend=None):
    """Joins the job (once per process). backend: 'dist_hybrid' (default, or
    $HYBRIDPS_BACKEND) or 'dist_allreduce'."""
    global _kv
    backend = backend or os.environ.get("HYBRIDPS_BACKEND") or "dist_hybrid"
    if _kv is not None:
        if _kv.type != backend:
            raise ValueError(f"hybridps.mxnet.init: already initialised with {_kv.type}, "
                             f"not {backend}")
        return
    classes = {"dist_hybrid": DistHybrid, "dist_allreduce": DistAllreduce}
    if backend not in classes:
        raise ValueError(f"hybridps.mxnet.init: unknown backend {backend!r} "
                         "(dist_hybrid or dist_allreduce)")
    _kv = classes[backend]()


def _store():
    if _kv is None:
        raise ValueError("hybridps.mxnet has not been initialised; call hvd.init() first")
    return _kv


def rank():
    return _store().rank


def size():
    return _store().num_workers


def local_rank():
    return _store().local_rank


def local_size():
    return _store().local_size


def _name(kind, name):
    return f"{kind}.{name}" if name is not None else f"{kind}.noname.{next(_counters[kind])}"


def allreduce_(tensor, average=True, name=None, priority=0):
    """In place: tensor = the sum (average=True: the mean) over the workers."""
    _store().pushpull(_name("allreduce", name), tensor, priority=priority)
    if average and size() > 1:
        tensor /= size()
    return tensor


def allreduce(tensor, average=True, name=None, priority=0):
    """A new NDArray with the sum (average=True: the mean) of `tensor` over the workers."""
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _store().pushpull(_name("allreduce", name), tensor, out=out, priority=priority)
    if average and size() > 1:
        out /= size()
    return out


def broadcast_(tensor, root_rank, name=None, priority=0):
    """In place: tensor = root_rank's tensor."""
    _store().broadcast(_name("broadcast", name), tensor, tensor, priority=priority,
                       root_rank=root_rank)
    return tensor


def broadcast(tensor, root_rank, name=None, priority=0):
    """A new NDArray holding root_rank's `tensor`."""
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _store().broadcast(_name("broadcast", name), tensor, out, priority=priority,
                       root_rank=root_rank)
    return out


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Sets every parameter to root_rank's value. `params`: a dict of name -> NDArray or
    gluon Parameter: net.collect_params() (a ParameterDict) or Module.get_params()'
    dicts. Every worker must hold the same names. A Parameter whose shape is not known yet
    (deferred initialisation) is broadcast right after MXNet initialises it, at the first
    forward pass, as Horovod does: every worker must then run that pass."""
    if not hasattr(params, "items"):
        raise TypeError("broadcast_parameters takes a dict or a ParameterDict, not "
                        f"{type(params).__name__}")
    prefix = prefix or ""
    for name, p in sorted(params.items()):
        key = f"parameter.{prefix}{name}"
        if isinstance(p, gluon.Parameter):
            if p._deferred_init:
                _broadcast_after_init(p, key, root_rank)
                continue
            arrays = p.list_data()
        elif isinstance(p, mx.nd.NDArray):
            arrays = [p]
        else:
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(p).__name__}, "
                            "not an NDArray or a Parameter")
        _store().broadcast(key, arrays[0], arrays, root_rank=root_rank)
    mx.nd.waitall()


def _broadcast_after_init(param, key, root_rank):
    """Makes `param`'s deferred initialisation broadcast root_rank's value under `key`
    once MXNet has made it (Parameter._init_impl runs then), and then drop this hook."""
    def init_then_broadcast(self, data, ctx_list):
        del self._init_impl  # back to the class's method, for any later initialisation
        self._init_impl(data, ctx_list)
        arrays = self.list_data()
        _store().broadcast(key, arrays[0], arrays, root_rank=root_rank)
    param._init_impl = types.MethodType(init_then_broadcast, param)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an optimizer: each update first averages the gradient over the workers.
    Use with gluon.Trainer(params, DistributedOptimizer(opt), kvstore=None)."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0):
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_predivide", float(gradient_predivide_factor))

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def __setattr__(self, item, value):  # e.g. the Trainer's rescale_grad, param_dict
        setattr(self._optimizer, item, value)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _allreduce(self, index, grad):
        if size() == 1:
            return
        indices = index if isinstance(index, (tuple, list)) else [index]
        grads = grad if isinstance(grad, (tuple, list)) else [grad]
        for i, g in zip(indices, grads):
            if self._predivide != 1.0:
                g /= self._predivide
            allreduce_(g, average=False, name=f"gradient.{i}", priority=-i)
            g *= self._predivide / size()

    def update(self, index, weight, grad, state):
        self._allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(gluon.Trainer):
    """gluon.Trainer whose gradients are averaged over the workers through hybridps before
    each update (the optimizer runs on the workers). step() takes the per-worker batch."""

    def __init__(self, params, optimizer, optimizer_params=None,
                 gradient_predivide_factor=1.0, prefix=None):
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("DistributedTrainer does its own averaging: pass the plain "
                             "optimizer, not a DistributedOptimizer")
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._hps_predivide = float(gradient_predivide_factor)
        self._scale *= self._hps_predivide / size()
        self._hps_prefix = prefix or ""

    def _allreduce_grads(self):
        if size() == 1:
            return
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grads = param.list_grad()
            if self._hps_predivide != 1.0:
                for g in grads:
                    g /= self._hps_predivide
            _store().pushpull(f"gradient.{self._hps_prefix}{i}", grads, priority=-i)
