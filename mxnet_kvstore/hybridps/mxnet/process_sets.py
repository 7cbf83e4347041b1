"""Horovod's process sets for hybridps.mxnet (re-exported by hybridps.mxnet.horovod and
hybridps.mxnet): ProcessSet, global_process_set, add_process_set, remove_process_set, and
the store an operation with process_set= runs on (_group). Each added set is a
dist_allreduce store of its own over its members (worker/process_set.h)."""
import itertools

import mxnet as mx
import numpy as np

from .._core import core
from .kvstore import DistAllreduce


def _hvd():
    """hybridps.mxnet.horovod (the job's store, ranks, InvalidArgument), imported on use:
    it imports this module."""
    from . import horovod
    return horovod


class ProcessSet:
    """Horovod's process set: workers, by their ranks in the job, that run operations
    among themselves while the others do something else. ProcessSet(ranks) (or a plain
    list) is added on every worker by add_process_set, or by init(process_sets=[...]), and
    then passed as process_set= to the operations. Each set is a dist_allreduce store of
    its own over its members, whatever the job's store (docs/horovod-api.md)."""
    process_set_id = None
    ranks = None

    def __init__(self, ranks):
        try:
            ranks = sorted(ranks)
        except TypeError:
            raise ValueError(f"ProcessSet takes a list of ranks, not {ranks!r}") from None
        if any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) for r in ranks):
            raise ValueError(f"ProcessSet takes a list of integer ranks, not {ranks!r}")
        self.ranks = [int(r) for r in ranks]
        self._kv = None  # this worker's store of the set, once added (members only)

    def _invalidate(self):
        self.process_set_id = None
        self._kv = None

    def size(self):
        """The number of workers in the set; None before it is added."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self):
        """This worker's index in the set (its rank in allgather's order); None before
        the set is added; a ValueError on a worker outside it. Operations' root_rank is the
        job's rank (hvd.rank()), as in Horovod."""
        if self.process_set_id is None:
            return None
        me = _hvd().rank()
        if me not in self.ranks:
            raise ValueError(f"worker {me} is not part of {self}")
        return self.ranks.index(me)

    def included(self):
        """Whether this worker is in the set; None before the set is added."""
        return None if self.process_set_id is None else _hvd().rank() in self.ranks

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


global_process_set = ProcessSet([])  # every worker; its ranks are filled in by init()
global_process_set.process_set_id = 0
_sets = {}  # id -> the added ProcessSet (not the global one)
_set_ids = itertools.count(1)  # the same on every worker: adding is collective


def add_process_set(process_set):
    """Collective (every worker of the job, the same sets in the same order, as in
    Horovod): adds `process_set` (a ProcessSet or a list of ranks) and returns it. The
    set's lowest member runs the set's rendezvous; the members connect to each other
    (Gloo, and shared memory between those on one host). A set with the ranks of one
    that exists, ranks outside the job, or ranks that differ between workers raise a
    ValueError on every worker."""
    store = _hvd()._store()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    # The id first and the refusals through the exchange: should the workers' sets differ,
    # every worker still takes part, fails alike, and counts ids alike.
    set_id = next(_set_ids)
    refusal = ""
    if process_set.process_set_id is not None:
        refusal = f"{process_set} was added already"
    for existing in [global_process_set] + list(_sets.values()):
        if not refusal and existing.ranks == process_set.ranks:
            refusal = (f"attempted to add a duplicate process set: {process_set} has the "
                       f"ranks of {existing}")
    mx.nd.waitall()  # the exchange runs on the job's store, after what was pushed before
    try:
        member = store._store.add_process_set(process_set.ranks, set_id, refusal)
    except ValueError as exc:
        raise _hvd().InvalidArgument(f"add_process_set: {exc}") from None
    process_set.process_set_id = set_id
    if member is not None:
        process_set._kv = DistAllreduce(_process_set=member)
    _sets[set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Removes an added process set on every worker (collective, as adding is): its
    operations must be complete, and the set object is invalidated. Returns False for the
    global set or a set that is not added, as Horovod does. The set's lowest member waits
    (up to HYBRIDPS_TIMEOUT_MS) for the other members to leave."""
    set_id = getattr(process_set, "process_set_id", None)
    if not set_id or _sets.get(set_id) is not process_set:
        return False
    mx.nd.waitall()
    del _sets[set_id]
    process_set._invalidate()
    core.Store.remove_process_set(set_id)
    return True


class _Group:
    """Where an operation runs: the job's store, or a process set's that this worker is
    a member of. size/rank are within it; ranks: its members' job ranks (None: all)."""

    def __init__(self, kv, ranks=None, set_id=0, label="the job"):
        self.kv = kv
        self.ranks = ranks
        self.id = set_id
        self.label = label
        self.size = kv.num_workers
        self.rank = kv.rank

    def root(self, root_rank, what):
        """The set's index of job rank `root_rank` (the rank itself for the job)."""
        if self.ranks is None:
            return root_rank
        if root_rank not in self.ranks:
            raise _hvd().InvalidArgument(f"{what}: root rank {root_rank} is not part of "
                                  f"{self.label}")
        return self.ranks.index(root_rank)


def _group(process_set, what):
    kv = _hvd()._store()
    if process_set is None or process_set.process_set_id == 0:
        return _Group(kv)
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set must be a ProcessSet, not "
                         f"{type(process_set).__name__}")
    added = _sets.get(process_set.process_set_id)
    if added is None or added.ranks != process_set.ranks:
        raise ValueError(f"{what}: {process_set} is not an added process set "
                         "(add_process_set), or it was removed")
    if added._kv is None:
        raise _hvd().InvalidArgument(f"{what}: worker {_hvd().rank()} is not part of "
                                     f"{added}")
    return _Group(added._kv, added.ranks, added.process_set_id, str(added))
