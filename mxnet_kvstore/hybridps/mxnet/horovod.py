"""horovod.mxnet's API on a hybridps store: a Horovod MXNet script ports by changing its
import (`import hybridps.mxnet as hvd`) and being started by scripts/hybridrun.

The store is dist_hybrid unless init(backend=...) or HYBRIDPS_BACKEND says otherwise.
As in Horovod, allreduce averages by default, DistributedOptimizer and
DistributedTrainer average the gradients over the workers (so trainer.step takes the
per-worker batch size), and names must agree across workers (unnamed operations are
numbered in call order, which must then be the same everywhere).

Offered: init, shutdown, is_initialized, rank/size/local_*/cross_*, the build questions
(*_built, *_enabled), allreduce(_) with op=Average/Sum/Min/Max/Product and pre/postscale
factors, grouped_allreduce(_), allgather, alltoall, reducescatter, broadcast(_),
broadcast_parameters, broadcast_object, allgather_object, Compression.none/fp16,
DistributedTrainer, DistributedOptimizer, start_timeline/stop_timeline, and process
sets (ProcessSet, add_process_set, remove_process_set, init(process_sets=...), the
process_set= argument). Refused with NotImplementedError: op=Adasum, join (see
docs/horovod-api.md).
"""
import collections
import io
import itertools
import os
import pickle
import types

import mxnet as mx
import numpy as np
from mxnet import gluon

from .._core import core
from .kvstore import DistAllreduce, DistHybrid
from .process_sets import (ProcessSet, _group, _sets, add_process_set,  # noqa: F401
                           global_process_set, remove_process_set)

_kv = None
_shut_down = False
_timeline_path = None  # start_timeline's file, until stop_timeline
# Unnamed operations are numbered per (process set id, kind): a process set's operations
# do not advance the numbers of the workers outside it.
_counters = collections.defaultdict(itertools.count)

# Horovod's reduction ops (horovod.common.basics' values). The stores reduce by sum:
# Average and Sum are sums (Average divides afterwards); Min, Max and Product reduce
# gathered rows (see _GATHERED); Adasum is refused.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}


def init(backend=None, process_sets=None):
    """Joins the job (once per process). backend: 'dist_hybrid' (default, or
    $HYBRIDPS_BACKEND) or 'dist_allreduce'. process_sets: as Horovod's, a list of
    ProcessSet objects (or rank lists) added right away, in order, by add_process_set
    (the objects given become the added sets);
    "dynamic" (Horovod's switch for adding them later) changes nothing: sets may always be
    added later."""
    global _kv
    if _shut_down:
        raise RuntimeError("hybridps.mxnet.init: this process called shutdown(), which left "
                           "the job; a process cannot rejoin it (start a new job)")
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
    global_process_set.ranks = list(range(_kv.num_workers))
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            add_process_set(ps)


def is_initialized():
    """True between init() and shutdown()."""
    return _kv is not None


def shutdown():
    """Waits for this process's pending operations, then leaves the job: the process's
    store (also those of mx.kv.create) is closed and later operations fail. init() cannot
    be called again afterwards (a RuntimeError): the job does not take a worker back."""
    global _kv, _shut_down
    if _kv is None:
        return
    mx.nd.waitall()
    _kv = None
    _shut_down = True
    for ps in _sets.values():
        ps._invalidate()
    _sets.clear()
    core.shutdown()  # leaves the process sets, then the job


def _store():
    if _kv is None:
        if _shut_down:
            raise ValueError("hybridps.mxnet was shut down (shutdown()); the process left "
                             "the job")
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


def cross_rank():
    """As Horovod's: this worker's index among the workers with its local rank (one per
    node that has that many local ranks), in rank order; the node's index when every
    node runs as many workers."""
    return _store()._store.cross_rank


def cross_size():
    """As Horovod's: the number of workers with this worker's local rank (the number of
    nodes when every node runs as many workers)."""
    return _store()._store.cross_size


def mpi_built():
    """False: hybridps has no MPI; its scheduler and Gloo (dist_allreduce) connect the
    workers (mpirun may start them: see docs/deployment.md)."""
    return False


def mpi_enabled():
    """False: no MPI (see mpi_built)."""
    return False


def mpi_threads_supported():
    """False: no MPI (see mpi_built)."""
    return False


def gloo_built():
    """Whether the extension was built with Gloo (the dist_allreduce store needs it)."""
    return core.built_with_gloo


def gloo_enabled():
    """Whether this job reduces with Gloo: the store is dist_allreduce."""
    return _store().type == "dist_allreduce"


def nccl_built():
    """As Horovod: the NCCL version the extension was built with (e.g. 21903 for 2.19.3),
    0 without NCCL. The MXNet plugin itself hands hybridps host arrays only (GPU arrays
    are staged through pinned host memory)."""
    return core.nccl_version


def cuda_built():
    """Whether the extension was built with CUDA (pinned staging of GPU arrays)."""
    return core.built_with_cuda


def rocm_built():
    """False: hybridps has no ROCm build."""
    return False


def ccl_built():
    """False: hybridps has no oneCCL build."""
    return False


def ddl_built():
    """False: hybridps has no IBM DDL build."""
    return False


def _name(kind, name, group=None):
    if name is not None:
        return f"{kind}.{name}"
    return f"{kind}.noname.{next(_counters[(group.id if group else 0, kind)])}"


def _resolve_op(op, average, what):
    """Horovod's rules: op or the deprecated average (not both); neither means Average."""
    if op is not None and average is not None:
        raise ValueError(f"{what}: give op= or the deprecated average=, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError(
            f"{what}: op=Adasum is not supported: it combines gradients pairwise by their "
            "dot products, which neither dist_hybrid's servers nor dist_allreduce's sum "
            "can compute; use op=hvd.Average")
    if op in _OP_NAMES:
        return op
    raise ValueError(f"{what}: unknown op {op!r} (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, "
                     "hvd.Product)")


# Min, Max and Product: the stores sum, so these gather every worker's tensor (one row
# each) and reduce the rows on every worker, in rank order (the same result everywhere).
_GATHERED = {Min: mx.nd.min, Max: mx.nd.max, Product: mx.nd.prod}


def _scale(x, factor, out=None):
    """x * factor into `out` (a new array when None), in the precision Horovod scales in:
    float64 for integer tensors (MXNet would cast the factor to the integer type first),
    float32 for float16, the tensor's own otherwise."""
    factor = float(factor)
    if x.dtype in (np.float32, np.float64):
        if out is None:
            return x * factor
        out[:] = x * factor if out is not x else out
        if out is x:
            out *= factor
        return out
    wide = "float64" if np.issubdtype(x.dtype, np.integer) else "float32"
    scaled = (x.astype(wide) * factor).astype(x.dtype)
    if out is None:
        return scaled
    out[:] = scaled
    return out


def _allreduce_into(tensor, out, op, name, priority, prescale_factor, postscale_factor,
                    group):
    """out = postscale * reduce(prescale * tensor) over `group` (Average also divides by
    its size)."""
    if op in _GATHERED:
        src = _scale(tensor, prescale_factor) if prescale_factor != 1.0 else tensor
        rows = _gather_rows(src.reshape((1,) + tuple(src.shape)), name, priority, group,
                            counts=[1] * group.size)
        out[:] = _GATHERED[op](rows, axis=0).astype(out.dtype)
        if postscale_factor != 1.0:
            _scale(out, postscale_factor, out=out)
        return out
    scale = float(postscale_factor)
    if op == Average:
        scale /= group.size
    if scale != 1.0 and out.dtype == np.float16:
        # A float16 sum that is scaled afterwards is summed in float32 and rounded once,
        # after the scaling, as Horovod's CPU path computes it (a float16 sum rounded
        # before the scaling can be 1 ulp off that): twice the bytes of a float16 sum.
        src = _scale(tensor, prescale_factor) if prescale_factor != 1.0 else tensor
        wide = src.astype("float32")
        # A name of its own: the same name may also be reduced unscaled, as float16.
        group.kv.pushpull(f"{name}.f32", wide, priority=priority)
        wide *= scale
        out[:] = wide.astype("float16")
        return out
    if out is tensor:  # in place
        if prescale_factor != 1.0:
            _scale(tensor, prescale_factor, out=tensor)
        group.kv.pushpull(name, tensor, priority=priority)
    else:
        src = _scale(tensor, prescale_factor) if prescale_factor != 1.0 else tensor
        group.kv.pushpull(name, src, out=out, priority=priority)
    if scale != 1.0:
        _scale(out, scale, out=out)
    return out


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """In place: tensor = the sum (op=Sum) or the mean (op=Average, the default; or the
    deprecated average=True) over the workers (of `process_set`) of prescale_factor *
    tensor, times postscale_factor."""
    op = _resolve_op(op, average, "allreduce_")
    group = _group(process_set, "allreduce_")
    return _allreduce_into(tensor, tensor, op, _name("allreduce", name, group), priority,
                           prescale_factor, postscale_factor, group)


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """A new NDArray: allreduce_ of a copy (`tensor` is left as it is)."""
    op = _resolve_op(op, average, "allreduce")
    group = _group(process_set, "allreduce")
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    return _allreduce_into(tensor, out, op, _name("allreduce", name, group), priority,
                           prescale_factor, postscale_factor, group)


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce_ of each of `tensors` (in place), submitted back to back so that they run
    together (each is an asynchronous operation of MXNet's engine). Returns `tensors`."""
    op = _resolve_op(op, average, "grouped_allreduce_")
    group = _group(process_set, "grouped_allreduce_")
    base = _name("grouped_allreduce", name, group)
    for i, t in enumerate(tensors):
        _allreduce_into(t, t, op, f"{base}.{i}", priority, prescale_factor,
                        postscale_factor, group)
    return tensors


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce of each of `tensors`, submitted together: a list of new NDArrays."""
    op = _resolve_op(op, average, "grouped_allreduce")
    group = _group(process_set, "grouped_allreduce")
    base = _name("grouped_allreduce", name, group)
    outs = []
    for i, t in enumerate(tensors):
        out = mx.nd.empty(t.shape, ctx=t.context, dtype=t.dtype)
        outs.append(_allreduce_into(t, out, op, f"{base}.{i}", priority, prescale_factor,
                                    postscale_factor, group))
    return outs


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """A new NDArray: every worker's `tensor` concatenated along the first dimension, in
    rank order. The first dimension may differ between workers (the others and the dtype
    must agree). Two sum-allreduces: of the first dimensions (each worker's at its rank),
    then of a zero buffer of all rows holding this worker's rows in its slot (exact: the
    other slots add zeros). On dist_hybrid after a Trainer put the optimizer on the
    servers, plain sums (so allgather) are refused on the job's store (a process set's
    store is a dist_allreduce one)."""
    group = _group(process_set, "allgather")
    return _gather_rows(tensor, _name("allgather", name, group), priority, group)


def _gather_rows(tensor, base, priority, group, counts=None):
    """allgather's work over `group`, under the names `base`.*. `counts`: every worker's
    first dimension, when the caller knows them already (no exchange of them then)."""
    n, r = group.size, group.rank
    shape = tensor.shape if tensor.shape else (1,)
    if counts is None:
        rows = mx.nd.zeros((n,), dtype="int64")
        rows[r] = shape[0]
        group.kv.pushpull(f"{base}.rows", rows, priority=priority)
        counts = [int(c) for c in rows.asnumpy()]
    total, offset = sum(counts), sum(counts[:r])
    buf = mx.nd.zeros((total,) + tuple(shape[1:]), ctx=tensor.context, dtype=tensor.dtype)
    if shape[0]:
        buf[offset:offset + shape[0]] = tensor.reshape(shape)
    # The rows in the name: a later allgather of another total is another tensor.
    group.kv.pushpull(f"{base}.data.{total}", buf, priority=priority)
    buf.wait_to_read()  # as Horovod's: a mismatch raises here, not at a later read
    return buf


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of each of `tensors`: a list of new NDArrays."""
    group = _group(process_set, "grouped_allgather")
    base = _name("grouped_allgather", name, group)
    return [_gather_rows(t, f"{base}.{i}", priority, group) for i, t in enumerate(tensors)]


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Horovod's alltoall: this worker sends rows splits[j] of `tensor` (along the first
    dimension, in order) to worker j, and gets back the rows every worker sent it,
    concatenated in rank order. splits: a list or an int NDArray of size() counts that
    add up to tensor.shape[0]; None splits the rows evenly (they must divide by size()).
    Returns the rows, and with `splits` given also the received counts (an int32 NDArray
    of size() values), as Horovod does.

    The stores sum and broadcast, so this is an allgather of the counts and of the rows
    (every worker receives all rows, size() times the traffic of a true all-to-all); the
    result is exact. With a process set, j counts the set's workers (ProcessSet.rank())."""
    group = _group(process_set, "alltoall")
    n, r = group.size, group.rank
    base = _name("alltoall", name, group)
    shape = tuple(tensor.shape) if tensor.shape else (1,)
    given = splits is not None
    if splits is None:
        if shape[0] % n:
            raise InvalidArgument(f"alltoall: the first dimension ({shape[0]}) does not "
                                  f"divide by the {n} workers; give splits=")
        mine = [shape[0] // n] * n
    else:
        values = splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else np.asarray(splits)
        if values.size and not np.issubdtype(values.dtype, np.integer):
            raise InvalidArgument(f"alltoall: splits must be integers, not {values.dtype}")
        mine = [int(v) for v in values.reshape(-1)]
        if len(mine) != n or min(mine) < 0 or sum(mine) != shape[0]:
            raise InvalidArgument(f"alltoall: splits {mine} must be {n} counts, none "
                                  f"negative, adding up to the first dimension {shape[0]}")
    table = mx.nd.zeros((n, n), dtype="int64")
    table[r] = mx.nd.array(mine, dtype="int64")
    group.kv.pushpull(f"{base}.splits", table, priority=priority)
    table = table.asnumpy().astype(np.int64)  # table[i][j]: rows worker i sends to j
    rows = _gather_rows(tensor, base, priority, group,
                        counts=[int(v) for v in table.sum(axis=1)])
    pieces, start = [], 0
    for i in range(n):
        begin = start + int(table[i, :r].sum())
        pieces.append(rows[begin:begin + int(table[i, r])])
        start += int(table[i].sum())
    received = [p for p in pieces if p.shape[0]]
    out = (mx.nd.concat(*received, dim=0) if received else
           _no_rows("alltoall", shape, tensor))
    if given:
        return out, mx.nd.array(table[:, r], dtype="int32")
    return out


def reducescatter(tensor, op=None, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Horovod's reducescatter: the reduction (op=Average by default, or Sum, Min, Max,
    Product) of `tensor` over the workers, of which this worker keeps its part of the
    first dimension: rows split evenly, the first shape[0] % size() workers one more.
    The stores have no reduce-scatter collective: this is an allreduce of the whole tensor
    followed by the slice (twice the traffic of a true reduce-scatter)."""
    op = _resolve_op(op, None, "reducescatter")
    if not tensor.shape or tensor.ndim == 0:
        raise InvalidArgument("reducescatter: a scalar has no first dimension to scatter")
    group = _group(process_set, "reducescatter")
    n, r = group.size, group.rank
    whole = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _allreduce_into(tensor, whole, op, _name("reducescatter", name, group), priority,
                    prescale_factor, postscale_factor, group)
    rows = whole.shape[0] if whole.shape else 1
    each, extra = divmod(rows, n)
    begin = each * r + min(r, extra)
    mine = each + (1 if r < extra else 0)
    if mine == 0:
        return _no_rows("reducescatter", whole.shape or (1,), tensor)
    return whole[begin:begin + mine].copy()


def grouped_reducescatter(tensors, op=None, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each of `tensors`: a list of new NDArrays."""
    base = _name("grouped_reducescatter", name, _group(process_set, "grouped_reducescatter"))
    return [reducescatter(t, op=op, name=f"{base}.{i}", priority=priority,
                          process_set=process_set, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor)
            for i, t in enumerate(tensors)]


def _no_rows(what, shape, like):
    """An array of no rows (the rest of `shape`), where MXNet can make one (numpy shape
    semantics, mx.npx.set_np()); else a ValueError that says so."""
    try:
        return mx.nd.zeros((0,) + tuple(shape[1:]), ctx=like.context, dtype=like.dtype)
    except mx.base.MXNetError:
        raise ValueError(f"{what}: this worker receives no rows, and MXNet makes no arrays "
                         "of zero rows unless numpy shape semantics are on "
                         "(mx.npx.set_np()); give every worker at least one row") from None


def _pickled(obj):
    data = io.BytesIO()
    pickle.dump(obj, data)
    return np.frombuffer(data.getvalue(), dtype=np.uint8)


def _broadcast_bytes(base, payload, root_rank, group):
    """root_rank's bytes (a uint8 numpy array there; ignored elsewhere) on every worker of
    `group` (root_rank: its index there): first their count (an int64 tensor of one
    element), then the bytes."""
    mine = group.rank == root_rank
    length = mx.nd.array([len(payload) if mine else 0], dtype="int64")
    group.kv.broadcast(f"{base}.len", length, length, root_rank=root_rank)
    count = int(length.asnumpy()[0])
    data = mx.nd.array(payload, dtype="uint8") if mine else mx.nd.zeros((count,),
                                                                        dtype="uint8")
    # The count in the name: every broadcast of one name has one size.
    group.kv.broadcast(f"{base}.data.{count}", data, data, root_rank=root_rank)
    return data.asnumpy().tobytes()


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (any picklable object) on every worker (of `process_set`)."""
    group = _group(process_set, "broadcast_object")
    root = group.root(root_rank, "broadcast_object")
    base = _name("broadcast_object", name, group)
    payload = _pickled(obj) if group.rank == root else None
    return pickle.loads(_broadcast_bytes(base, payload, root, group))


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every worker's `obj` (picklable), in rank order: each worker broadcasts
    its pickled object in turn (size() broadcasts, so it works on dist_hybrid also after
    a Trainer put the optimizer on its servers, and sends each object once)."""
    group = _group(process_set, "allgather_object")
    base = _name("allgather_object", name, group)
    mine = _pickled(obj)
    return [pickle.loads(_broadcast_bytes(f"{base}.{root}", mine, root, group))
            for root in range(group.size)]


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """In place: tensor = root_rank's tensor (root_rank: a job rank, also with a process
    set, as in Horovod)."""
    group = _group(process_set, "broadcast_")
    group.kv.broadcast(_name("broadcast", name, group), tensor, tensor, priority=priority,
                       root_rank=group.root(root_rank, "broadcast_"))
    return tensor


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """A new NDArray holding root_rank's `tensor` (root_rank: a job rank, also with a
    process set, as in Horovod)."""
    group = _group(process_set, "broadcast")
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    group.kv.broadcast(_name("broadcast", name, group), tensor, out, priority=priority,
                       root_rank=group.root(root_rank, "broadcast"))
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


class InvalidArgument(ValueError, mx.base.MXNetError):
    """A call's arguments that cannot work: a ValueError, and an MXNetError (a
    RuntimeError) as Horovod raises for the same arguments."""


def _refuse(call, why):
    raise NotImplementedError(f"hybridps.mxnet.{call} is not available: {why}")


def join():
    """Refused: every worker must issue the same operations (no uneven inputs)."""
    _refuse("join", "hybridps has no join for uneven numbers of steps; every worker must "
            "issue the same operations (give each worker the same number of batches)")


def start_timeline(file_path, mark_cycles=False):
    """As Horovod's: worker 0 records its timeline from now until stop_timeline(), which
    writes it to `file_path` as Chrome trace JSON (chrome://tracing, Perfetto). The
    timeline is the one HYBRIDPS_TIMELINE records (docs/troubleshooting.md): each
    operation, its wait for credit, its push to the servers and back, the node's local
    reduction and broadcast (dist_hybrid); negotiation, waits and fusion copies
    (dist_allreduce). The other workers record nothing, as in Horovod, whose
    coordinator writes the file; every worker's and server's timeline together is
    `hybridrun --timeline-filename`. mark_cycles adds nothing (no negotiation cycles
    to mark on dist_hybrid; dist_allreduce's negotiations are spans already)."""
    global _timeline_path
    store = _store()
    if _timeline_path is not None:
        raise ValueError(f"start_timeline: a timeline is already being recorded (to "
                         f"{_timeline_path}); call stop_timeline() first")
    path = os.path.abspath(os.fspath(file_path))
    if store.rank == 0:
        mx.nd.waitall()  # operations before the start are not in it
        try:
            store._store.start_timeline(path)
        except RuntimeError as exc:
            raise ValueError(f"start_timeline: {exc}") from None
    _timeline_path = path


def stop_timeline():
    """Stops the timeline of start_timeline and (on worker 0) writes its file, after this
    worker's pending operations complete. Without a timeline running: nothing."""
    global _timeline_path
    if _timeline_path is None:
        return
    _timeline_path = None
    mx.nd.waitall()
    if _kv is not None and _kv.rank == 0:
        _kv._store.stop_timeline()


class Compressor:
    """Horovod's interface: compress(tensor) -> (tensor to reduce, context);
    decompress(reduced, context) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Reduces the tensor as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors are cast to float16 before the reduction and back after:
    half the bytes on the wire on dist_allreduce; dist_hybrid's servers sum float16 in
    float32. Other dtypes go as they are."""

    @staticmethod
    def compress(tensor):
        if np.issubdtype(np.dtype(tensor.dtype), np.floating):
            return tensor.astype("float16", copy=False), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and np.dtype(tensor.dtype) != np.dtype(ctx):
            return tensor.astype(ctx, copy=False)
        return tensor


class Compression:
    """Horovod's gradient compression choices, for DistributedTrainer and
    DistributedOptimizer(..., compression=)."""
    none = NoneCompressor
    fp16 = FP16Compressor


def _reduce_compressed(name, grads, compression, priority, kv=None):
    """Sums `grads` (one per device) over the devices and workers (of store `kv`, the
    job's by default), in place, reducing compression.compress's tensors."""
    kv = kv or _store()
    if compression is NoneCompressor:
        kv.pushpull(name, grads, priority=priority)
        return
    packed = [compression.compress(g) for g in grads]
    kv.pushpull(name, [c for c, _ in packed], priority=priority)
    for g, (c, ctx) in zip(grads, packed):
        d = compression.decompress(c, ctx)
        if d is not g:
            d.copyto(g)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an optimizer: each update first averages the gradient over the workers (of
    `process_set`; a worker outside it updates with its own gradient, as in Horovod).
    Use with gluon.Trainer(params, DistributedOptimizer(opt), kvstore=None). num_groups
    changes nothing (every gradient is its own operation)."""

    # The gradient of index i is reduced under f"{_name_base}.{i}" (hybridps.mxnet.byteps'
    # optimizer sets its own, so that the two never share a tensor name).
    _name_base = "allreduce.gradient"

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=global_process_set, *, compression=Compression.none):
        if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
            raise TypeError("DistributedOptimizer: num_groups must be an int, not "
                            f"{num_groups!r} (Horovod's order: optimizer, "
                            "gradient_predivide_factor, num_groups, process_set; give "
                            "compression= by name)")
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_predivide", float(gradient_predivide_factor))
        object.__setattr__(self, "_compression", compression)
        object.__setattr__(self, "_process_set", process_set)

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def __setattr__(self, item, value):  # e.g. the Trainer's rescale_grad, param_dict
        setattr(self._optimizer, item, value)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _allreduce(self, index, grad):
        if self._process_set.process_set_id and not self._process_set.included():
            return  # not a member: its own gradient, as Horovod
        group = _group(self._process_set, "DistributedOptimizer")
        if group.size == 1:
            return
        indices = index if isinstance(index, (tuple, list)) else [index]
        grads = grad if isinstance(grad, (tuple, list)) else [grad]
        for i, g in zip(indices, grads):
            if self._predivide != 1.0:
                g /= self._predivide
            _reduce_compressed(f"{self._name_base}.{i}", [g], self._compression, -i,
                               group.kv)
            g *= self._predivide / group.size

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
                 compression=Compression.none, gradient_predivide_factor=1.0, prefix=None,
                 num_groups=0, process_set=global_process_set):
        # num_groups (Horovod's grouping of the gradients) changes nothing here: every
        # gradient is its own operation and all of them are submitted together.
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("DistributedTrainer does its own averaging: pass the plain "
                             "optimizer, not a DistributedOptimizer")
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._hps_predivide = float(gradient_predivide_factor)
        self._hps_process_set = process_set
        self._hps_prefix = prefix or ""
        self._hps_compression = compression
        if process_set.process_set_id and not process_set.included():
            self._hps_group = None  # not a member: trains on its own gradients
            return
        self._hps_group = _group(process_set, "DistributedTrainer")
        self._scale *= self._hps_predivide / self._hps_group.size

    def _allreduce_grads(self):
        if self._hps_group is None or self._hps_group.size == 1:
            return
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grads = param.list_grad()
            if self._hps_predivide != 1.0:
                for g in grads:
                    g /= self._hps_predivide
            _reduce_compressed(f"gradient.{self._hps_prefix}{i}", grads,
                               self._hps_compression, -i, self._hps_group.kv)
