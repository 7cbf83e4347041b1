"""byteps.mxnet's API on a hybridps store: a BytePS MXNet script ports by changing its
import (`import hybridps.mxnet.byteps as bps`) and being started by scripts/hybridrun.

It shares the Horovod API's machinery (horovod.py): one store per process, dist_hybrid
unless HYBRIDPS_BACKEND (which `hybridrun --backend` sets) says dist_allreduce.

BytePS's semantics, kept here:
- byteps_push_pull(tensor, ...) works in place, returns None, and averages over the
  workers unless is_average=False (then it sums). As in BytePS, the name must have been
  declared with byteps_declare_tensor first; names must agree across workers.
- DistributedTrainer(params, optimizer, optimizer_params=None, root_rank=0,
  compression_params=None) is a gluon.Trainer whose step(batch_size) takes the
  PER-WORKER batch: each gradient is multiplied by 1 / (batch_size * size()) and then
  summed over the workers (so the optimizer gets the mean over the global batch, and its
  rescale_grad is 1). It broadcasts root_rank's parameters at its first step, as BytePS
  does, and also when it is created (so that the first step's gradients are already
  computed on root_rank's weights everywhere; BytePS computes them on each worker's own).
- DistributedOptimizer(optimizer) averages each gradient before the update; use with
  gluon.Trainer(..., kvstore=None) or Module.fit(kvstore=None, optimizer=...), whose
  rescale_grad is 1 / per-worker batch.
- broadcast_parameters(params, root_rank=0) sets a dict's arrays (Module.get_params()) to
  root_rank's values. It also takes a gluon ParameterDict, which BytePS refuses.

Refused with a clear error naming the call: suspend/resume (elastic training), BytePS's
compressors (compression_params other than {'fp16': True}, byteps_declare_tensor's
compression arguments), BYTEPS_ENABLE_ASYNC, push_pull's version other than 0.
"""
import itertools
import os
import warnings
from typing import Any, Iterable, Mapping, Optional, Union

import mxnet as mx
from mxnet import gluon

from . import horovod as _hvd

__all__ = ["init", "shutdown", "suspend", "resume", "rank", "size", "local_rank",
           "local_size", "byteps_declare_tensor", "byteps_push_pull",
           "broadcast_parameters", "DistributedOptimizer", "DistributedTrainer",
           "Compression"]

_declared = set()  # the names byteps_declare_tensor declared in this process
_broadcasts = itertools.count()  # broadcast_parameters calls, for their tensor names
_trainers = itertools.count()  # DistributedTrainers made, for their tensor names
_optimizers = itertools.count()  # DistributedOptimizers made, likewise


def _refuse(call: str, why: str, what: Optional[str] = None):
    """NotImplementedError naming the call (and `what` of it is not supported)."""
    head = f"{what} is not supported" if what else "is not available"
    sep = ": " if what else " "
    raise NotImplementedError(f"hybridps.mxnet.byteps.{call}{sep}{head}: {why}")


def init(lazy: bool = True) -> None:
    """Joins the job (once per process; again is a no-op). The store is dist_hybrid, or
    $HYBRIDPS_BACKEND (hybridrun --backend sets it). `lazy` (BytePS's deferred connection)
    changes nothing: hybridps connects when the store is made."""
    _hvd.init()


def shutdown() -> None:
    """Waits for this process's pending operations and leaves the job (init() cannot be
    called again afterwards)."""
    _hvd.shutdown()


def suspend() -> None:
    """Refused: hybridps has no elastic training."""
    _refuse("suspend", "hybridps jobs are not elastic (no suspend/resume); a job keeps "
            "its workers and servers from start to end")


def resume(num_workers: int, num_servers: int, global_rank: int,
           context: Any = None) -> None:
    """Refused: hybridps has no elastic training."""
    _refuse("resume", "hybridps jobs are not elastic (no suspend/resume); start a new job "
            "with the new number of workers or servers")


def rank() -> int:
    """This worker's rank, 0 .. size() - 1."""
    return _hvd.rank()


def size() -> int:
    """The number of workers."""
    return _hvd.size()


def local_rank() -> int:
    """This worker's rank within its node."""
    return _hvd.local_rank()


def local_size() -> int:
    """The number of workers on this worker's node."""
    return _hvd.local_size()


def byteps_declare_tensor(name: str, **kwargs: Any) -> None:
    """Declares the tensor `name` for byteps_push_pull (declaring it again is a no-op).
    BytePS's keyword arguments configure its gradient compressors, which hybridps does not
    have: any is refused."""
    if kwargs:
        _refuse("byteps_declare_tensor", "hybridps has none of BytePS's compressors "
                "(onebit, topk, randomk, dithering, error feedback); declare the tensor "
                "by name only", what=f"compression arguments {sorted(kwargs)} of {name!r}")
    if not isinstance(name, str):
        raise TypeError(f"byteps_declare_tensor: name must be a str, not "
                        f"{type(name).__name__}")
    _hvd._store()
    _declared.add(name)


def byteps_push_pull(tensor: mx.nd.NDArray, version: int = 0, priority: int = 0,
                     name: Optional[str] = None, is_average: bool = True) -> None:
    """In place: tensor = the mean over the workers of their `tensor` (is_average=True,
    the default), or the sum (is_average=False). Asynchronous, as every MXNet operation:
    reading `tensor` waits for it. `name` must have been declared with
    byteps_declare_tensor and be the same on every worker; `priority`: higher goes
    first."""
    if name is None:
        raise ValueError("byteps_push_pull needs name= (a name declared with "
                         "byteps_declare_tensor on every worker; in BytePS too an unnamed "
                         "push_pull fails, its generated name being undeclared)")
    if name not in _declared:
        raise ValueError(f"byteps_push_pull: tensor {name!r} was not declared; call "
                         f"byteps_declare_tensor({name!r}) first (as BytePS requires)")
    if version != 0:
        _refuse("byteps_push_pull", "BytePS's versions serve its asynchronous mode; "
                "hybridps push_pulls are synchronous and pair up in call order (use "
                "version=0)", what=f"version={version}")
    if not isinstance(tensor, mx.nd.NDArray):
        raise TypeError(f"byteps_push_pull: tensor must be an NDArray, not "
                        f"{type(tensor).__name__}")
    _hvd._store().pushpull(f"byteps.{name}", tensor, priority=priority)
    if is_average and size() > 1:
        tensor /= size()


def broadcast_parameters(params: Mapping[str, Any], root_rank: int = 0) -> None:
    """Sets every array of `params` to root_rank's value, in place, and waits for it.
    `params`: a dict of name -> NDArray (Module.get_params()'s dicts, as BytePS takes), or
    a gluon ParameterDict (BytePS refuses one, leaving it to DistributedTrainer; here it
    is broadcast, also a parameter whose initialisation is deferred: right after MXNet
    initialises it). Every worker must pass the same names."""
    if isinstance(params, gluon.ParameterDict) or isinstance(params, dict):
        _hvd.broadcast_parameters(params, root_rank=root_rank,
                                  prefix=f"byteps.{next(_broadcasts)}.")
        return
    raise ValueError(f"broadcast_parameters: invalid params of type "
                     f"{type(params).__name__} (a dict of NDArrays, or a ParameterDict)")


def _check_async(call: str):
    if os.environ.get("BYTEPS_ENABLE_ASYNC", "0").strip() not in ("", "0"):
        _refuse(call, "hybridps trains synchronously only (unset it, or set it to 0)",
                what="asynchronous training (BYTEPS_ENABLE_ASYNC is set)")


class DistributedOptimizer(_hvd.DistributedOptimizer):
    """Wraps an optimizer: each update first averages its gradient over the workers
    (push_pull with is_average=True). Use with gluon.Trainer(params, opt, kvstore=None)
    and step(per-worker batch), or Module.fit(kvstore=None, optimizer=opt)."""

    def __init__(self, optimizer: mx.optimizer.Optimizer):
        _check_async("DistributedOptimizer")
        super().__init__(optimizer)
        object.__setattr__(self, "_name_base",
                           f"byteps.optimizer{next(_optimizers)}.gradient")


class _NoneCompressor(_hvd.NoneCompressor):
    """BytePS's Compression.none: the tensor as it is."""

    @staticmethod
    def compress(tensor, *args, **kwargs):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx, *args, **kwargs):
        return tensor


class _FP16Compressor(_hvd.FP16Compressor):
    """BytePS's Compression.fp16: floating-point tensors go as float16, back after."""

    @staticmethod
    def compress(tensor, *args, **kwargs):
        return _hvd.FP16Compressor.compress(tensor)

    @staticmethod
    def decompress(tensor, ctx, *args, **kwargs):
        return _hvd.FP16Compressor.decompress(tensor, ctx)


def _no_adapter(name):
    def refused(*args, **kwargs):
        _refuse(f"Compression.{name}", "it adapts BytePS's server-side compressors "
                "(momentum and weight decay moved into the compressor), which hybridps "
                "does not have")
    refused.__name__ = name
    return refused


class Compression:
    """BytePS's compression choices: none and fp16 (for DistributedTrainer's
    compression_params={'fp16': True}); wdmom and nag are refused."""
    none = _NoneCompressor
    fp16 = _FP16Compressor
    wdmom = staticmethod(_no_adapter("wdmom"))
    nag = staticmethod(_no_adapter("nag"))


def _compression(compression_params: Optional[Mapping[str, Any]]):
    """The Horovod API's compressor for BytePS's compression_params: {'fp16': True} is
    offered, BytePS's compressors are not."""
    if not compression_params:
        return _hvd.Compression.none
    others = sorted(k for k, v in compression_params.items() if k != "fp16" and v)
    if others:
        _refuse("DistributedTrainer", "hybridps has none of BytePS's compressors "
                "(onebit, topk, randomk, dithering, error feedback, compressor "
                "momentum); {'fp16': True} is offered", what=f"compression_params {others}")
    return _hvd.Compression.fp16 if compression_params.get("fp16") else \
        _hvd.Compression.none


class DistributedTrainer(gluon.Trainer):
    """gluon.Trainer whose gradients go through hybridps, as BytePS's: step(batch_size)
    takes the per-worker batch; each gradient is multiplied by 1 / (batch_size * size())
    and summed over the devices and the workers (the optimizer's rescale_grad is then 1).
    root_rank's parameters are broadcast when the trainer is made and again at its first
    step (as BytePS does). compression_params: None, or {'fp16': True}."""

    def __init__(self, params: Union[Mapping[str, gluon.Parameter],
                                     Iterable[gluon.Parameter]],
                 optimizer: Union[str, mx.optimizer.Optimizer],
                 optimizer_params: Optional[Mapping[str, Any]] = None,
                 root_rank: int = 0,
                 compression_params: Optional[Mapping[str, Any]] = None):
        if isinstance(optimizer, _hvd.DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take a DistributedOptimizer: it "
                          "averages the gradients itself; the optimizer was unwrapped")
        compression = _compression(compression_params)
        if not isinstance(params, (dict, gluon.ParameterDict)):
            params = list(params)
        super().__init__(params, optimizer, optimizer_params=optimizer_params,
                         kvstore=None)
        self.root_rank = root_rank
        self._bps_size = size()
        self._bps_base = f"byteps.trainer{next(_trainers)}"
        self._bps_compression = compression
        self._bps_inits = 0
        self._broadcast_params(self._params, hook_deferred=True)

    def _broadcast_params(self, params, hook_deferred):
        """Broadcasts root_rank's values of `params`; returns those whose initialisation
        is still deferred (with hook_deferred, they are broadcast right after it)."""
        deferred = []
        base = f"{self._bps_base}.init{self._bps_inits}"
        self._bps_inits += 1
        for param in params:
            key = f"{base}.{self._param2idx[param.name]}"
            if param._deferred_init:
                deferred.append(param)
                if hook_deferred:
                    _hvd._broadcast_after_init(param, key, self.root_rank)
                continue
            arrays = param.list_data()
            _hvd._store().broadcast(key, arrays[0], arrays, root_rank=self.root_rank)
        return deferred

    def _init_params(self):
        # gluon.Trainer calls this at the first step (and until no parameter is deferred).
        self._params_to_init = self._broadcast_params(self._params_to_init,
                                                      hook_deferred=False)

    def step(self, batch_size: Union[int, float], ignore_stale_grad: bool = False) -> None:
        """One update from the gradients of a per-worker batch of `batch_size`."""
        # The gradients are divided by batch_size * size() before the sum, so the
        # optimizer's rescale_grad (self._scale / batch_size) must be 1.
        self._scale = batch_size
        super().step(batch_size, ignore_stale_grad)

    def _allreduce_grads(self):
        scale = 1.0 / self._scale / self._bps_size
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grads = param.list_grad()
            if scale != 1.0:
                for g in grads:
                    g *= scale
            _hvd._reduce_compressed(f"{self._bps_base}.gradient.{i}", grads,
                                    self._bps_compression, -i)

