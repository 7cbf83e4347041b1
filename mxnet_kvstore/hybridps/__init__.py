"""hybridps: a hybrid parameter server (and ring allreduce) for data-parallel training.

    import hybridps.mxnet                 # registers the stores with MXNet
    kv = mx.kv.create('dist_hybrid')      # or 'dist_allreduce'

This package stays light: the extension (_hybridps_core) and MXNet are imported by
hybridps.mxnet only.
"""

from hybridps._version import __version__

__all__ = ["mxnet", "__version__"]
