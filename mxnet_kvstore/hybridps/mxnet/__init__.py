"""hybridps for MXNet.

    import hybridps.mxnet                       # registers 'dist_hybrid', 'dist_allreduce'
    kv = mx.kv.create('dist_hybrid')
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {...}, kvstore=kv)

Start the script with scripts/hybridrun (it sets HYBRIDPS_* for every process).

Horovod-style helpers (horovod.mxnet's names and behaviour) on either store:

    import hybridps.mxnet as hvd
    hvd.init()                                  # dist_hybrid, or init('dist_allreduce')
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = hvd.DistributedTrainer(net.collect_params(), 'sgd', {...})

BytePS's (byteps.mxnet's names and behaviour), on the same machinery:

    import hybridps.mxnet.byteps as bps
    bps.init()                                  # the store hybridrun --backend chose
    trainer = bps.DistributedTrainer(net.collect_params(), 'sgd', {...})
"""
import os

# MXNet bulks up to 15 consecutive backward operators into one engine operation, so their
# gradients become ready together and nothing can be sent before the bulk ends: turn it
# off (unless the user chose) so that push_pulls start as each gradient is written.
os.environ.setdefault("MXNET_EXEC_BULK_EXEC_TRAIN", "0")

from .kvstore import (DistAllreduce, DistHybrid, now_ns, register,  # noqa: E402
                      timeline_mark, timeline_start, timeline_stop, timeline_take)
from .horovod import (Adasum, Average, Compression, DistributedOptimizer,  # noqa: E402
                      DistributedTrainer, Max, Min, ProcessSet, Product, Sum,
                      add_process_set, global_process_set,
                      allgather, allgather_object, allreduce, allreduce_, alltoall,
                      broadcast, broadcast_, broadcast_object, broadcast_parameters,
                      ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                      gloo_built, gloo_enabled, grouped_allgather, grouped_allreduce,
                      grouped_allreduce_, grouped_reducescatter, init, is_initialized, join,
                      local_rank, local_size, mpi_built, mpi_enabled,
                      mpi_threads_supported, nccl_built, rank, reducescatter,
                      remove_process_set, rocm_built, shutdown, size, start_timeline,
                      stop_timeline)

register()

__all__ = ["DistHybrid", "DistAllreduce", "now_ns", "timeline_mark", "timeline_start",
           "timeline_stop", "timeline_take", "init", "rank", "size", "local_rank",
           "local_size", "allreduce", "allreduce_", "broadcast", "broadcast_",
           "broadcast_parameters", "DistributedOptimizer", "DistributedTrainer",
           "is_initialized", "shutdown", "cross_rank", "cross_size", "mpi_built",
           "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
           "nccl_built", "cuda_built", "rocm_built", "Average", "Sum", "Adasum", "Min",
           "Max", "Product", "grouped_allreduce", "grouped_allreduce_", "allgather",
           "broadcast_object", "allgather_object", "Compression",
           "start_timeline", "stop_timeline", "alltoall", "reducescatter",
           "add_process_set", "remove_process_set", "join", "ccl_built", "ddl_built",
           "grouped_allgather", "grouped_reducescatter", "ProcessSet",
           "global_process_set"]
