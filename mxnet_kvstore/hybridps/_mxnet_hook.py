"""Makes a forgotten `import hybridps.mxnet` a clear error instead of a ps-lite crash.

Loaded from hybridps.pth (an installed wheel) or hybridps-dev.pth (what scripts/build.sh
writes into the project's virtual environment). When a script imports mxnet, placeholders are registered under
'dist_hybrid' and 'dist_allreduce'; without them, mx.kv.create('dist_hybrid') silently
falls back to MXNet's own ps-lite store (the name contains "dist"), which fails with
"Check notnull: ... DMLC_NUM_WORKER". `import hybridps.mxnet` replaces the placeholders
with the real stores. Nothing else is imported or changed.
"""
import importlib.abc
import importlib.machinery
import sys

_TARGET = "mxnet.kvstore.base"
STORE_NAMES = ("dist_hybrid", "dist_allreduce")


def missing_import_message(name):
    return (f"mx.kv.create('{name}'): the hybridps plugin was not imported. Add "
            f"`import hybridps.mxnet` to the script before creating the kvstore or the "
            f"Trainer (without it MXNet treats '{name}' as its own ps-lite 'dist' store).")


def _register_placeholders(base):
    for name in STORE_NAMES:
        if name in base.KVStoreBase.kv_registry:
            continue

        def __init__(self, _name=name):
            raise RuntimeError(missing_import_message(_name))

        klass = type(f"HybridpsNotImported_{name}", (base.KVStoreBase,),
                     {"__init__": __init__, "_hybridps_placeholder": True})
        base.KVStoreBase.kv_registry[name] = klass


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            _register_placeholders(module)
        except Exception:  # never break `import mxnet`
            pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install():
    if _TARGET in sys.modules:
        _register_placeholders(sys.modules[_TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
