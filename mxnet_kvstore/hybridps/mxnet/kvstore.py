"""The MXNet KVStores 'dist_hybrid' and 'dist_allreduce' (subclasses of mx.kv.KVStoreBase).

Every operation is pushed into MXNet's dependency engine and returns at once: it starts
when the arrays' earlier writers (the backward pass) are done, runs while the next
operations compute, and the arrays' next readers wait for it. Errors surface at the next
read of an output array (MXNetError naming the tensor).

Arrays off the host (GPUs) go through pinned host arrays of the store. A pushpull of
several arrays, all of them off the host (one per GPU), is summed on one of their devices
first, as MXNet's dist_device_sync does (HYBRIDPS_MXNET_MERGE=device, the default): the
others are copied to that device (chosen per key, spreading the keys' bytes over the
devices as MXNet's CommDevice does), summed there, and only the sum is copied to the host,
push_pulled, copied back to that device and from there to the other outputs (a broadcast
to several devices likewise: one copy from the host, then device to device). Otherwise
(HYBRIDPS_MXNET_MERGE=host, or some arrays on the host), as MXNet's dist_sync does with its
CPU merge buffers: each array is copied to the host, the copies and the host arrays of the
key are summed there, push_pulled (or broadcast), and the result is copied back to every
output array. MXNet's engine orders all of it, so it too returns at once. The buffers are
made on a key's first use and reused.

MXNet's classic API (Module's, and any store user with the optimizer on the workers):
init(key, value) broadcasts rank 0's value into a host array of the store; push(key, value)
push_pulls the value (summed over the devices) into that array: the workers' sum, or with
the optimizer on the servers the updated weights; pull(key, out) copies the array out
(local). row_sparse_pull is refused: hybridps stores dense arrays only.
"""
import atexit
import json
import os
import sys
import threading

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from .._core import core
from .._mxnet_hook import STORE_NAMES
from .optimizer import server_spec

_attach_lock = threading.Lock()
_attached = False
_process_store = None  # the core.Store this process joined the job with
_instances = 0  # KVStore objects created so far: the namespace of the next one's keys
# Set once an optimizer runs on the servers: from then on every push_pull of the job goes
# through it (the C++ store's mode is per job), so plain sums are refused up front.
_servers_optimizer = None
# Arrays of these device types are handed to hybridps as they are; others (GPUs) are
# staged through the store's host arrays.
_HOST_DEVICE_TYPES = ("cpu", "cpu_pinned", "cpu_shared")


class _TimelineNames:
    """With a timeline (HYBRIDPS_TIMELINE), the parameters' names of the tensors a Gluon
    Trainer hands over by index: PREFIX.worker-R.names.json, {"0/3": "dense0_weight"},
    which hybridrun's merge (hybridps.launcher.timeline) puts into the spans' names. The
    operations keep their index names: those are what every worker agrees on."""

    def __init__(self):
        self._prefix = os.environ.get("HYBRIDPS_TIMELINE", "")
        self._seen = set()  # names looked up, with a parameter or not: each looked up once
        self._names = {}
        self._path = None
        self._written = 0  # names in the file

    def note(self, name, key, rank):
        """Learns `name`'s parameter when a Trainer is the caller (it passes its index)."""
        if not self._prefix or name in self._seen or not isinstance(key, (int, np.integer)):
            return
        self._seen.add(name)
        if self._path is None:
            self._path = f"{self._prefix}.worker-{rank}.names.json"
            atexit.register(self._write)  # before the merge, which waits for the process
        frame = sys._getframe(2)
        for _ in range(6):  # the Trainer's method is a few calls up
            if frame is None:
                return
            owner = frame.f_locals.get("self")
            if isinstance(owner, mx.gluon.Trainer):
                params = getattr(owner, "_params", [])
                if 0 <= key < len(params):
                    self._names[name] = params[key].name
                    if len(self._names) >= 2 * self._written:  # a file of n names: log n writes
                        self._write()
                return
            frame = frame.f_back

    def _write(self):
        if not self._prefix or self._path is None or len(self._names) == self._written:
            return
        self._written = len(self._names)
        tmp = self._path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self._names, f)
            os.replace(tmp, self._path)
        except OSError:
            self._prefix = ""  # the timeline's folder is gone: names are only a nicety


_timeline_names = _TimelineNames()


def _attach():
    global _attached
    with _attach_lock:
        if not _attached:
            core.attach_mxnet(mx.base._LIB._name)
            atexit.register(_shutdown_at_exit)
            _attached = True


def _shutdown_at_exit():
    try:
        mx.nd.waitall()
    except Exception:  # an operation's error was already reported where it was read
        pass
    try:
        core.shutdown()
    except Exception as exc:  # leaving the job late is not worth a traceback at exit
        print(f"hybridps: shutdown: {exc}")


def _as_list(arrays, what, key):
    if isinstance(arrays, mx.nd.NDArray):
        return [arrays]
    if isinstance(arrays, (list, tuple)) and arrays and all(
            isinstance(a, mx.nd.NDArray) for a in arrays):
        return list(arrays)
    raise TypeError(f"key {key!r}: {what} must be an NDArray or a non-empty list of "
                    f"NDArrays (one per device), not {type(arrays).__name__}")


def _pairs(key, values, what):
    """The (key, value) pairs of one call: one key (int or str) and its value, or a list of
    keys and a list of as many values, one per key (MXNet's convention)."""
    if not isinstance(key, (list, tuple)):
        return [(key, values)]
    if not isinstance(values, (list, tuple)) or len(values) != len(key):
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise ValueError(f"keys {list(key)!r}: {what} must be a list of one entry per key "
                         f"({len(key)}), not {got}")
    return list(zip(key, values))


def _one_array(value, key, what):
    """`value` as one NDArray: an NDArray, or a one-element list of one (MXNet's stores take
    both for a broadcast or an init)."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, mx.nd.NDArray):
        raise TypeError(f"key {key!r}: {what} must be one NDArray (or a list of one), not "
                        f"{type(value).__name__}"
                        + (f" of {len(value)}" if isinstance(value, (list, tuple)) else ""))
    return value


def _check_dense(key, arrays, what):
    for i, a in enumerate(arrays):
        if a.stype != "default":
            raise NotImplementedError(
                f"key {key!r}: {what}[{i}] is a {a.stype} array; hybridps handles dense "
                "arrays only (no row_sparse weights, no sparse gradients)")


def _is_capable(capability, optimizer):
    if capability.lower() == KVStoreBase.OPTIMIZER:
        return optimizer
    raise ValueError(f"Unknown capability: {capability}")


def _check(key, arrays, what, shape, dtype):
    _check_dense(key, arrays, what)
    for i, a in enumerate(arrays):
        if a.shape != shape or a.dtype != dtype:
            raise ValueError(
                f"key {key!r}: {what}[{i}] has shape {a.shape} and dtype "
                f"{np.dtype(a.dtype).name}, expected {shape} and {np.dtype(dtype).name} "
                "(every array of one key must match)")


def _same(a, b):
    return a is b or a.handle.value == b.handle.value


def _on_host(a):
    return a.context.device_type in _HOST_DEVICE_TYPES


class _HybridKVStore(KVStoreBase):
    """Common implementation; `_TYPE` names the hybridps store."""

    _TYPE = None

    def __init__(self, _process_set=None):
        super().__init__()
        _attach()
        global _process_store, _instances
        if _process_set is not None:
            # A process set's store (hybridps.mxnet.add_process_set): a job of its own, so
            # its names need no prefix, and the job's stores keep their numbering.
            self._store = _process_set
            self._prefix = ""
            self._in_process_set = True
        else:
            self._store = core.Store.open(self._TYPE)
            _process_store = self._store
            # Keys are small ints (parameter indices) that every Trainer reuses: the tensor
            # names of the n-th store object of the process are "n/key", so two Trainers
            # never mix their tensors. Every worker must create its stores in the same
            # order.
            self._prefix = f"{_instances}/"
            _instances += 1
            self._in_process_set = False
        self._optimizer_on_servers = False
        self._optimizer = None
        self._updater = None
        self._sent = {}
        self._staging = {}  # (tensor name, slot) -> this store's pinned host array
        self._order = {}  # tensor name -> the array its operations write in turn (_push)
        # Device merges (see the module's docstring): per tensor name, the context that sums
        # its arrays; per context, the bytes of the names it sums; the buffers there.
        self._merge_on_device = self._store.merge == "device"
        self._merge_ctx = {}
        self._merge_bytes = {}
        self._merge_bufs = {}  # (tensor name, slot) -> array on the name's merge device
        # The classic API (init, push, pull): tensor name -> the host array holding the
        # key's value, rank 0's after init, the workers' sum (or the servers' updated
        # weights) after each push; pull copies it out.
        self._values = {}

    # ---- properties ------------------------------------------------------------------
    @property
    def type(self):
        return self._TYPE

    @property
    def rank(self):
        return self._store.rank

    @property
    def num_workers(self):
        return self._store.num_workers

    @property
    def local_rank(self):
        return self._store.local_rank

    @property
    def local_size(self):
        return self._store.local_size

    # ---- communication ---------------------------------------------------------------
    def _name(self, key):
        if not isinstance(key, (int, np.integer, str)):
            raise TypeError(f"a key must be an int or a str, not {type(key).__name__} "
                            f"({key!r}); several keys: a list of them, with a list of "
                            "values (one per key)")
        return f"{self._prefix}{key}"

    def _host_array(self, name, slot, like):
        """The store's pinned host array `slot` of tensor `name`, shaped like `like`: made
        on first use, then reused (MXNet's engine orders its writers and readers)."""
        buf = self._staging.get((name, slot))
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            ctx = like.context
            buf = mx.nd.empty(like.shape, dtype=like.dtype, ctx=mx.cpu_pinned(
                ctx.device_id if ctx.device_type == "gpu" else 0))
            self._staging[(name, slot)] = buf
        return buf

    def _merge_array(self, name, slot, like):
        """The store's array `slot` of tensor `name` on `like`'s device, shaped like it."""
        buf = self._merge_bufs.get((name, slot))
        if (buf is None or buf.shape != like.shape or buf.dtype != like.dtype
                or buf.context != like.context):
            buf = mx.nd.empty(like.shape, dtype=like.dtype, ctx=like.context)
            self._merge_bufs[(name, slot)] = buf
        return buf

    def _merge_index(self, name, arrays):
        """Which of `arrays` sits on the device that sums tensor `name`: chosen on the
        name's first use, the device of `arrays` that sums the fewest bytes so far."""
        ctx = self._merge_ctx.get(name)
        ctxs = [a.context for a in arrays]
        if ctx not in ctxs:
            load = [self._merge_bytes.get(c, 0) for c in ctxs]
            ctx = ctxs[load.index(min(load))]
            self._merge_ctx[name] = ctx
            nbytes = int(np.prod(arrays[0].shape)) * np.dtype(arrays[0].dtype).itemsize
            self._merge_bytes[ctx] = self._merge_bytes.get(ctx, 0) + nbytes
        return ctxs.index(ctx)

    def _merge_on_one_device(self, name, arrays):
        """The sum of `arrays` (several, all off the host) in the store's array on one of
        their devices: the others are copied there first."""
        j = self._merge_index(name, arrays)
        parts = [a if i == j else a.copyto(self._merge_array(name, i, arrays[j]))
                 for i, a in enumerate(arrays)]
        return mx.nd.add_n(*parts, out=self._merge_array(name, "sum", arrays[j]))

    def _on_host_list(self, name, arrays):
        """`arrays` with those off the host replaced by copies in the store's host arrays;
        also whether any was copied."""
        host = [a if _on_host(a) else a.copyto(self._host_array(name, i, a))
                for i, a in enumerate(arrays)]
        return host, any(h is not a for h, a in zip(host, arrays))

    def _push(self, kind, name, src, dst, priority, root_rank=0):
        for a in (src, dst):
            if a is not None and not _on_host(a):  # the layers above stage every array
                raise AssertionError(f"{kind} of {name}: {a.context} array handed to hybridps")
        count = int(np.prod(dst.shape)) if dst.shape else 1
        # Every operation on `name` also writes the name's order array, so MXNet's engine
        # hands them to hybridps in the order they were issued even when they go through
        # different arrays (a Trainer's broadcast of the weights and its first push_pull
        # of the gradients, staged through different host arrays, have no other
        # dependency: the engine could run them either way round, and the workers differ).
        order = self._order.get(name)
        if order is None:
            order = self._order[name] = mx.nd.zeros((1,), ctx=mx.cpu())
        self._store.push(kind, name, 0 if src is None else src.handle.value,
                         dst.handle.value, count, np.dtype(dst.dtype).name, int(priority),
                         int(root_rank), order.handle.value,
                         [int(d) for d in dst.shape])

    def broadcast(self, key, value, out, priority=0, root_rank=0):
        """Sets every array of `out` to `value` of worker `root_rank` (0). `value` is one
        NDArray (or a list of one); several keys: lists of keys, values and outs."""
        for (k, v), (_, o) in zip(_pairs(key, value, "value"), _pairs(key, out, "out")):
            self._broadcast_one(k, v, o, priority, root_rank)

    def _broadcast_one(self, key, value, out, priority, root_rank):
        name = self._name(key)
        _timeline_names.note(name, key, self._store.rank)
        value = _one_array(value, key, "value")
        outs = _as_list(out, "out", key)
        _check(key, [value], "value", value.shape, value.dtype)
        _check(key, outs, "out", value.shape, value.dtype)
        # The array broadcast: `value` itself if it is an output on the host, else a host
        # output or the store's host array, with value copied in.
        target = next((o for o in outs if _same(o, value) and _on_host(o)), None)
        if target is None:
            target = next((o for o in outs if _on_host(o)), None)
            if target is None:
                target = self._host_array(name, "out", value)
            value.copyto(target)
        # With the optimizer on the servers the broadcast also gives the servers the
        # weights, under the name push_pull uses; pushpull's `out` (the weights) orders the
        # two. Without, the names differ: nothing orders a gradient's first push_pull after
        # the weights' broadcast, and operations on one name must come in the same order
        # on every worker.
        bname = name if self._optimizer_on_servers else f"{name}:init"
        self._push("broadcast", bname, None, target, priority, root_rank)
        # Several outputs, all on devices (GPUs): one copy from the host, to the output on
        # value's device, and from there to the others, as pushpull's device merge does.
        first = None
        if (self._merge_on_device and len(outs) > 1
                and not any(_on_host(o) for o in outs)):
            first = next((o for o in outs if o.context == value.context), outs[0])
            target.copyto(first)
        for o in outs:
            if not _same(o, target) and o is not first:
                (target if first is None else first).copyto(o)

    def pushpull(self, key, value, out=None, priority=0):
        """Sums `value` (one array per device) over devices and workers into `out` (or
        into `value` when out is None). With the optimizer on the servers (dist_hybrid
        after set_optimizer), `out` receives the updated weights instead. Several keys:
        lists of keys, values and outs."""
        pairs = _pairs(key, value, "value")
        outs = [(k, None) for k, _ in pairs] if out is None else _pairs(key, out, "out")
        for (k, v), (_, o) in zip(pairs, outs):
            self._pushpull_one(k, v, o, priority)

    def _pushpull_one(self, key, value, out, priority):
        name = self._name(key)
        _timeline_names.note(name, key, self._store.rank)
        if self._optimizer_on_servers:
            self._sync_optimizer_params()
        elif _servers_optimizer is not None and not self._in_process_set:
            raise RuntimeError(
                f"pushpull of key {key!r}: the servers of this dist_hybrid job run an "
                f"optimizer ({_servers_optimizer}, set by a Trainer or set_optimizer), and "
                "then every push_pull of the job is an update, not a plain sum. Create the "
                "Trainers with update_on_kvstore=False (or set MXNET_UPDATE_ON_KVSTORE=0) "
                "to sum gradients instead, or use dist_allreduce for plain sums")
        values = _as_list(value, "value", key)
        outs = values if out is None else _as_list(out, "out", key)
        shape, dtype = values[0].shape, values[0].dtype
        _check(key, values, "value", shape, dtype)
        _check(key, outs, "out", shape, dtype)
        merged = None  # the devices' sum on one of them (device merge)
        if (self._merge_on_device and len(values) > 1
                and not any(_on_host(v) for v in values)):
            merged = self._merge_on_one_device(name, values)
            host, staged = [merged.copyto(self._host_array(name, "sum", merged))], True
        else:
            host, staged = self._on_host_list(name, values)
        if len(host) == 1:
            src = host[0]
        elif staged:  # summed into the store's host array, not a new one each step
            src = mx.nd.add_n(*host, out=self._host_array(name, "sum", host[0]))
        else:
            src = mx.nd.add_n(*host)
        # The result goes to a host output, else (every output off the host) in place into
        # src when it is the store's own array, else into the store's host array; then it
        # is copied to the other outputs.
        dst = next((o for o in outs if _on_host(o)), None)
        if dst is None:
            dst = src if staged or len(host) > 1 else self._host_array(name, "out", src)
        self._push("push_pull", name, None if _same(src, dst) else src, dst, priority)
        if merged is not None and not all(_on_host(o) for o in outs):
            # One copy to the merge device; the devices' outputs are copied from there.
            dst.copyto(merged)
        for o in outs:
            if not _same(o, dst):
                (dst if merged is None or _on_host(o) else merged).copyto(o)

    # ---- the classic API: init, push, pull (MXNet's Module, update_on_kvstore=False) ---
    def init(self, key, value):
        """Collective: stores rank 0's `value` under `key` (every worker's pull returns it
        until the next push). With the optimizer on the servers it also gives them the
        weights, as a broadcast does. Several keys: lists of keys and values."""
        for k, v in _pairs(key, value, "value"):
            name = self._name(k)
            v = _one_array(v, k, "init's value")
            _check_dense(k, [v], "init's value")
            self._broadcast_one(k, v, self._value_array(name, v), 0, 0)

    def push(self, key, value, priority=0):
        """Collective: sums `value` (an NDArray, or one per device) over the devices and
        the workers into the key's stored value, which the next pull returns; with the
        optimizer on the servers (dist_hybrid after set_optimizer) `value` is a gradient
        and the stored value becomes the updated weights (one update per push). Returns
        at once, as pushpull does. Several keys: lists of keys and values. Every worker
        must push the same keys in the same order (MXNet's dist_sync waits for all too)."""
        for k, v in _pairs(key, value, "value"):
            name = self._name(k)
            values = _as_list(v, "value", k)
            _check_dense(k, values, "value")
            stored = self._values.get(name)
            if stored is not None and (stored.shape != values[0].shape
                                       or stored.dtype != values[0].dtype):
                raise ValueError(
                    f"push of key {k!r}: the value has shape {values[0].shape} and dtype "
                    f"{np.dtype(values[0].dtype).name}, the key holds {stored.shape} and "
                    f"{np.dtype(stored.dtype).name} (from its init or first push)")
            self._pushpull_one(k, values, self._value_array(name, values[0]), priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copies the key's stored value (init's, or the last push's result) into `out`
        (an NDArray or one per device; several keys: lists of keys and outs). Local: no
        communication, it waits in MXNet's engine for this worker's last push of the key.
        Sparse arrays in `out` are skipped with ignore_sparse=True (MXNet's contract),
        else an error."""
        if out is None:
            raise ValueError(f"pull of key {key!r}: out is required (the arrays to fill)")
        for k, o in _pairs(key, out, "out"):
            name = self._name(k)
            outs = _as_list(o, "out", k)
            stored = self._values.get(name)
            if stored is None:
                raise ValueError(
                    f"pull of key {k!r}: the key was never initialised (init) or pushed "
                    f"on this {self._TYPE} store")
            if ignore_sparse:
                outs = [a for a in outs if a.stype == "default"]
            _check(k, outs, "out", stored.shape, stored.dtype)
            for a in outs:
                stored.copyto(a)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Refused: hybridps stores dense arrays only."""
        keys = list(key) if isinstance(key, (list, tuple)) else key
        raise NotImplementedError(
            f"row_sparse_pull of key {keys!r}: {self._TYPE} stores dense arrays only, so "
            "it has no row_sparse weights to pull rows of; keep the weights dense "
            "(pull gives the whole array), or use MXNet's dist_sync for sparse models")

    def _value_array(self, name, like):
        """The host array holding tensor `name`'s value (init, push, pull), shaped like
        `like`: made on first use, then reused."""
        buf = self._values.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = mx.nd.empty(like.shape, dtype=like.dtype, ctx=mx.cpu())
            self._values[name] = buf
        return buf

    def barrier(self):
        """Returns when every worker called barrier (waits for this worker's arrays)."""
        mx.nd.waitall()
        self._store.barrier()

    # ---- capabilities, optimizer, compression -----------------------------------------
    # is_capable: a staticmethod of each store class (MXNet's own stores and Horovod's
    # answer on the class: type(kv).is_capable('optimizer')).

    def set_optimizer(self, optimizer):
        """Runs `optimizer` on the servers (dist_hybrid): collective, before the weights'
        broadcast (gluon.Trainer's order) or init (Module's; keys init'ed before get their
        values sent as the weights now). Afterwards pushpull(key, grads, out=weights), or
        push(key, grads) then pull(key, out=weights), returns the updated weights. Rules
        and schedulers the servers do not have are an error naming them (run those on the
        workers: update_on_kvstore=False)."""
        if not self._store.optimizer_capable:
            raise NotImplementedError(
                f"{self._TYPE} cannot run the optimizer: the workers update their weights "
                "(gluon.Trainer does so by itself: is_capable('optimizer') is False)")
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"set_optimizer takes an mx.optimizer.Optimizer, not "
                            f"{type(optimizer).__name__}")
        global _servers_optimizer
        spec = server_spec(optimizer, self._name)
        mx.nd.waitall()
        self._store.set_optimizer(spec["rule"], spec["params"], spec["schedule"],
                                  spec["multi_precision"], spec["multipliers"])
        self._optimizer_on_servers = True
        _servers_optimizer = spec["rule"]
        # Keys init'ed (or pushed) before: their values become the servers' weights, as
        # MXNet's servers already hold them (every worker has the same keys, in order).
        for name, stored in self._values.items():
            self._broadcast_one(name[len(self._prefix):], stored, stored, 0, 0)
        self._optimizer = optimizer
        self._updater = mx.optimizer.get_updater(optimizer)  # Trainer.load_states reads it
        self._sent = {"learning_rate": optimizer.lr, "rescale_grad": optimizer.rescale_grad,
                      "wd": optimizer.wd}

    def _sync_optimizer_params(self):
        """Hyper-parameters the Trainer changes on its optimizer object between steps
        (set_learning_rate, rescale_grad from step(batch_size), wd) reach the servers
        before the next push."""
        opt = self._optimizer
        current = {"rescale_grad": opt.rescale_grad, "wd": opt.wd}
        if opt.lr_scheduler is None:  # with one, the servers compute the rate
            current["learning_rate"] = opt.lr
        changed = {k: v for k, v in current.items() if v != self._sent.get(k)}
        if not changed:
            return
        mx.nd.waitall()  # the previous step's updates keep the old values
        for name, value in changed.items():
            self._store.set_optimizer_param(name, float(value))
            self._sent[name] = value

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Worker 0 writes the servers' weights and optimizer states to `fname` (the
        other workers write nothing). dump_optimizer: the spec is always in the file."""
        if not self._optimizer_on_servers:
            raise NotImplementedError(
                f"{self._TYPE}: no optimizer on the servers (set_optimizer was not called); "
                "with update_on_kvstore=False gluon.Trainer saves its states itself")
        mx.nd.waitall()
        if self.rank == 0:
            self._store.save_optimizer_states(str(fname))

    def load_optimizer_states(self, fname):
        """Collective: worker 0 reads `fname` (written by save_optimizer_states, also by a
        job with another number of servers) and the servers continue from it."""
        if not self._optimizer_on_servers:
            raise NotImplementedError(
                f"{self._TYPE}: no optimizer on the servers (set_optimizer was not called); "
                "with update_on_kvstore=False gluon.Trainer loads its states itself")
        mx.nd.waitall()
        self._store.load_optimizer_states(str(fname))

    def set_gradient_compression(self, compression_params):
        """MXNet's: {'type': '2bit', 'threshold': 0.5} (gluon.Trainer's compression_params
        calls it). From the next push on, float32 gradients travel to the servers as 2 bits
        per element with error feedback (MXNet's scheme); the replies stay float32.
        {'type': 'none'} turns it off. dist_hybrid only: its servers unpack the pushes."""
        params = dict(compression_params or {})
        kind = str(params.pop("type", "none")).lower()
        threshold = params.pop("threshold", 0.5)
        if params:
            raise ValueError(f"set_gradient_compression: unknown parameters {sorted(params)} "
                             "(type and threshold)")
        if kind not in ("2bit", "none"):
            raise ValueError(f"set_gradient_compression: type {kind!r} is not offered: '2bit' "
                             "(MXNet's) or 'none'")
        if self._TYPE == "dist_allreduce" and kind != "none":
            raise NotImplementedError(
                "dist_allreduce has no 2bit gradient compression: it needs servers that "
                "unpack and sum the pushes (use dist_hybrid, or Horovod's Compression.fp16, "
                "which halves dist_allreduce's traffic)")
        # This store object's tensors only (their names begin with its prefix), as MXNet's
        # compression is a setting of one kvstore.
        self._store.set_gradient_compression(kind, float(threshold), self._prefix)


class DistHybrid(_HybridKVStore):
    """mx.kv.create('dist_hybrid'): the parameter-server store."""
    _TYPE = "dist_hybrid"

    @staticmethod
    def is_capable(capability):
        """'optimizer': True (the servers run it: set_optimizer)."""
        return _is_capable(capability, optimizer=True)


class DistAllreduce(_HybridKVStore):
    """mx.kv.create('dist_allreduce'): ring allreduce (Gloo), no servers."""
    _TYPE = "dist_allreduce"

    @staticmethod
    def is_capable(capability):
        """'optimizer': False (no servers: the workers update their weights)."""
        return _is_capable(capability, optimizer=False)


def register():
    """Registers the stores under their names (KVStoreBase.register would use the class
    name). Replaces the placeholders of hybridps' missing-import hook."""
    for name, klass in zip(STORE_NAMES, (DistHybrid, DistAllreduce)):
        KVStoreBase.kv_registry[name] = klass


def timeline_start():
    """Starts recording when each engine operation started and completed."""
    core.set_timeline(True)


def timeline_take():
    """Events since the last call: dicts with name, kind, start_ns and end_ns (ns of
    CLOCK_MONOTONIC, the clock of now_ns())."""
    return [dict(name=n, kind=k, start_ns=s, end_ns=e) for n, k, s, e in core.take_timeline()]


def timeline_stop():
    core.set_timeline(False)


def timeline_mark(name, array):
    """Records a 'mark' event named `name` when the array's pending writes are done (e.g.
    a gradient at the end of the backward pass). Needs a store of this process."""
    if _process_store is None:
        raise RuntimeError("timeline_mark needs a store: create one first")
    _process_store.push("mark", name, 0, array.handle.value, 0, "float32", 0, 0)


now_ns = core.now_ns
