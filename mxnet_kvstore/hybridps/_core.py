"""Loads the extension _hybridps_core with a message that says how to get it."""
try:
    import _hybridps_core as core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "hybridps: the extension module _hybridps_core was not found or failed to load "
        f"({exc}). Build it with `bash scripts/build.sh` (which also puts it on the "
        "project's .venv path), or add <build>/mxnet_kvstore and <repo>/mxnet_kvstore "
        "to PYTHONPATH.") from exc

from hybridps._version import __version__ as _package_version  # noqa: E402

if getattr(core, "__version__", None) != _package_version:
    raise ImportError(
        f"hybridps: the extension {core.__file__} is of hybridps "
        f"{getattr(core, '__version__', 'of an unknown version')} but the package is "
        f"{_package_version}: rebuild (`bash scripts/build.sh`) or reinstall hybridps")
