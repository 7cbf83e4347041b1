"""hybridps for MXNet.

    import hybridps.mxnet                       # registers 'dist_hybrid', 'dist_allreduce'
    kv = mx.kv.create('dist_hybrid')
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {...}, kvstore=kv)

Start the script with scripts/hybridrun (it sets HYBRIDPS_* for every process).
"""
from .kvstore import (DistAllreduce, DistHybrid, now_ns, register, timeline_mark,
                      timeline_start, timeline_stop, timeline_take)

register()

__all__ = ["DistHybrid", "DistAllreduce", "now_ns", "timeline_mark", "timeline_start",
           "timeline_stop", "timeline_take"]
