"""Loads the extension _hybridps_core with a message that says how to get it."""
try:
    import _hybridps_core as core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "hybridps: the extension module _hybridps_core was not found or failed to load "
        f"({exc}). Build it with `bash scripts/build.sh` (which also puts it on the "
        "project's .venv path), or add <build>/mxnet_kvstore and <repo>/mxnet_kvstore "
        "to PYTHONPATH.") from exc
