"""The Horovod-style API with any number of workers on any nodes, and its process sets,
run by mx_worker.py: in the 3-worker, two-node job of test_mxnet_nodes.py (which computes
what each call must give for that size), and horovod_process_sets_two in the 2-worker
job of test_mxnet_kvstore.py."""
import mxnet as mx

import hybridps.mxnet as hps
from mx_common import STORE, _err, report


def horovod_generic():
    """Reductions, broadcast, allgather, alltoall, reducescatter, object gathering and a
    mismatched shape, each with values that tell the ranks apart."""
    hps.init(STORE)
    n, r = hps.size(), hps.rank()
    got = {}
    t = mx.nd.array([[r + 1.0, -(r + 1.0)], [2.0 * r, 1.0]])
    for name in ("Sum", "Average", "Min", "Max", "Product"):
        got[name] = hps.allreduce(t, op=getattr(hps, name), name=f"g{name}").asnumpy().tolist()
    got["broadcast"] = hps.broadcast(mx.nd.full((3,), 10.0 * r), root_rank=n - 1,
                                     name="gb").asnumpy().tolist()
    got["allgather"] = hps.allgather(mx.nd.full((r + 1, 2), float(r)),
                                     name="gag").asnumpy().tolist()
    splits = [(r + j) % 2 + 1 for j in range(n)]  # rows for worker j
    rows = mx.nd.array([[100.0 * r + i] for i in range(sum(splits))])
    out, received = hps.alltoall(rows, splits=splits, name="ga2a")
    got["alltoall"] = [out.asnumpy().ravel().tolist(), received.asnumpy().tolist()]
    column = mx.nd.array([[float(i)] for i in range(2 * n + 1)]) * (r + 1)
    got["reducescatter"] = hps.reducescatter(column, op=hps.Sum,
                                             name="grs").asnumpy().ravel().tolist()
    got["objects"] = hps.allgather_object({"rank": r})
    got["mismatch"] = [
        _err(lambda rep=rep: hps.allreduce(mx.nd.ones((3, 2) if r == n - 1 else (2, 3)),
                                           name=f"gmm{rep}"))
        for rep in range(5)]
    report("horovod_generic", rank=r, size=n, local_rank=hps.local_rank(),
           local_size=hps.local_size(),
           cross_rank=hps.cross_rank(), cross_size=hps.cross_size(), **got)


def horovod_process_sets():
    """Process sets on a job of 3 workers: [0, 2] and [1] given to init, [0, 1] added
    after; each set's calls with values that tell the ranks apart; the errors a user can
    meet; unnamed operations of a set beside the job's; removal. Run first, so that its
    init is the one that joins."""
    a, b = hps.ProcessSet([2, 0]), hps.ProcessSet([1])
    hps.init(STORE, process_sets=[a, b])
    n, r = hps.size(), hps.rank()
    assert n == 3, n
    got = {}
    c = hps.add_process_set([0, 1])  # a list
    sets = {"a": a, "b": b, "c": c}
    got["ids"] = {k: ps.process_set_id for k, ps in sets.items()}
    got["included"] = {k: ps.included() for k, ps in sets.items()}
    got["sizes"] = {k: ps.size() for k, ps in sets.items()}
    got["set_rank"] = {k: ps.rank() for k, ps in sets.items() if ps.included()}
    t = mx.nd.array([r + 1.0, -2.0 * r])
    for k, ps in sets.items():
        if not ps.included():
            got[f"{k}.foreign"] = _err(lambda ps=ps: hps.allreduce(t, name="f", process_set=ps))
            continue
        res = got[k] = {}
        for op in ("Sum", "Average", "Max", "Product"):
            res[op] = hps.allreduce(t, op=getattr(hps, op), name=f"{k}{op}",
                                    process_set=ps).asnumpy().tolist()
        res["broadcast"] = hps.broadcast(mx.nd.full((2,), 10.0 * r), root_rank=ps.ranks[-1],
                                         name=f"{k}b", process_set=ps).asnumpy().tolist()
        res["allgather"] = hps.allgather(mx.nd.full((r + 1, 1), float(r)), name=f"{k}ag",
                                         process_set=ps).asnumpy().ravel().tolist()
        out, received = hps.alltoall(mx.nd.array([[100.0 * r + j] for j in range(ps.size())]),
                                     splits=[1] * ps.size(), name=f"{k}a2a", process_set=ps)
        res["alltoall"] = [out.asnumpy().ravel().tolist(), received.asnumpy().tolist()]
        res["reducescatter"] = hps.reducescatter(
            mx.nd.array([[float(i)] for i in range(4)]) * (r + 1), op=hps.Sum, name=f"{k}rs",
            process_set=ps).asnumpy().ravel().tolist()
        res["objects"] = hps.allgather_object({"rank": r}, process_set=ps)
        res["object"] = hps.broadcast_object(f"from {ps.ranks[0]}" if r == ps.ranks[0]
                                             else None, root_rank=ps.ranks[0], process_set=ps)
        res["root_outside"] = _err(lambda ps=ps: hps.broadcast(
            t, root_rank=[q for q in range(n) if q not in ps.ranks][0], process_set=ps)
            if len(ps.ranks) < n else None)
        # An unnamed operation of the set: numbered apart from the job's unnamed ones.
        res["unnamed"] = hps.allreduce(t, op=hps.Sum, process_set=ps).asnumpy().tolist()
    got["unnamed_job"] = hps.allreduce(t, op=hps.Sum).asnumpy().tolist()
    # DistributedOptimizer over set a: members average their gradients ((r + 1)^2), rank
    # 1 updates with its own.
    opt = hps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0, wd=0.0),
                                   process_set=a)
    w = mx.nd.full((3,), 10.0)
    opt.update(0, w, mx.nd.full((3,), (r + 1.0) ** 2), None)
    got["optimizer"] = w.asnumpy().tolist()
    got["duplicate"] = _err(lambda: hps.add_process_set([1, 0]))
    got["disagree"] = _err(lambda: hps.add_process_set([1, 2] if r < 2 else [2]))
    got["outside"] = _err(lambda: hps.add_process_set([0, 5]))
    d = hps.add_process_set([1, 2])  # the job goes on after those errors
    got["d"] = (hps.allreduce(t, op=hps.Sum, name="d", process_set=d).asnumpy().tolist()
                if d.included() else None)
    got["removed"] = [hps.remove_process_set(ps) for ps in (a, b, c, d)]
    got["removed_again"] = hps.remove_process_set(a)
    got["removed_global"] = hps.remove_process_set(hps.global_process_set)
    got["use_removed"] = _err(lambda: hps.allreduce(t, process_set=c))
    got["after"] = hps.allreduce(t, op=hps.Sum, name="after").asnumpy().tolist()
    report("horovod_process_sets", rank=r, **got)


def horovod_process_sets_two():
    """Process sets of one worker each on a node of 2: a set's plain sums work also once
    dist_hybrid's servers run an optimizer (a set is a dist_allreduce store of its own);
    the job's set cannot be added again; a worker outside a set is refused; one set is
    removed, the other is left for shutdown() to leave."""
    hps.init(STORE)
    r = hps.rank()
    alone = [hps.add_process_set([0]), hps.add_process_set(hps.ProcessSet([1]))]
    mine, other = alone[r], alone[1 - r]
    report("horovod_process_sets_two", rank=r,
           sum=hps.allreduce(mx.nd.full((3,), r + 1.0), op=hps.Sum, name="s",
                             process_set=mine).asnumpy().tolist(),
           average=hps.allreduce(mx.nd.full((2,), 4.0 * (r + 1)), name="a",
                                 process_set=mine).asnumpy().tolist(),
           gathered=hps.allgather(mx.nd.full((2, 1), float(r)),
                                  process_set=mine).asnumpy().ravel().tolist(),
           set_rank=mine.rank(), other_rank=_err(other.rank),
           duplicate=_err(lambda: hps.add_process_set([1, 0])),
           other=_err(lambda: hps.broadcast(mx.nd.ones((1,)), root_rank=1 - r,
                                            process_set=other)),
           job=hps.broadcast(mx.nd.full((2,), r + 1.0), root_rank=1,
                             name="after_sets").asnumpy().tolist(),
           removed=hps.remove_process_set(alone[0]))
