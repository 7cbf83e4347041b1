"""The Horovod-style API with any number of workers on any nodes, run by mx_worker.py in
the 3-worker, two-node job of test_mxnet_nodes.py (which computes what each call must
give for that size)."""
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
