"""Locating the hybridps-scheduler and hybridps-server executables."""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

SCHEDULER_BINARY = "hybridps-scheduler"
SERVER_BINARY = "hybridps-server"
# Sub-folder of a CMake build tree that holds each binary.
BUILD_SUBDIRS = {SCHEDULER_BINARY: "scheduler", SERVER_BINARY: "server"}
BIN_DIR_ENV = "HYBRIDPS_BIN_DIR"


class BinaryNotFoundError(Exception):
    """A required executable is missing; the message says where we looked."""


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _in_dir(directory: Path, name: str) -> list[Path]:
    """Candidates inside one folder: DIR/name, then the build-tree layout DIR/<sub>/name."""
    return [directory / name, directory / BUILD_SUBDIRS[name] / name]


# Where an installed package (a wheel, `pip install`) keeps the two binaries.
PACKAGE_BIN_DIR = Path(__file__).resolve().parent.parent / "bin"


def _beside_the_command() -> list[Path]:
    """The folder of the hybridrun being run (a `cmake --install` prefix's bin/), when it is
    run as a file (never the current folder, as for `python -c`)."""
    command = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    return [command.resolve().parent] if command is not None and command.is_file() else []


def find_binary(name: str, *, bin_dir: str | None, env: Mapping[str, str],
                repo_root: Path | None) -> Path:
    """Return the path of executable ``name``.

    An explicit folder (``--bin-dir``, else $HYBRIDPS_BIN_DIR) is the only place
    searched when given, so a typo never silently picks up another build. Without
    one: the installed package's ``bin/``, the folder of the hybridrun being run, then
    (run from a source tree)
    ``<repo>/build/<scheduler|server>/``, then PATH.
    """
    if bin_dir:
        candidates, source, use_path = _in_dir(Path(bin_dir), name), "--bin-dir", False
    elif env.get(BIN_DIR_ENV):
        candidates, source = _in_dir(Path(env[BIN_DIR_ENV]), name), f"${BIN_DIR_ENV}"
        use_path = False
    else:
        candidates = [PACKAGE_BIN_DIR / name, *(d / name for d in _beside_the_command())]
        source = "the installed package, beside hybridrun"
        if repo_root is not None:
            candidates.append(repo_root / "build" / BUILD_SUBDIRS[name] / name)
            source += ", the build tree"
        source, use_path = source + ", then PATH", True

    for candidate in candidates:
        if _is_executable(candidate):
            return candidate.resolve()
    if use_path:
        found = shutil.which(name, path=env.get("PATH", os.defpath))
        if found:
            return Path(found).resolve()

    looked = [str(c) for c in candidates]
    if use_path:
        looked.append(f"PATH ({env.get('PATH', os.defpath)})")
    not_exec = [str(c) for c in candidates if c.is_file()]
    hint = f"; not executable: {', '.join(not_exec)}" if not_exec else ""
    usage_hint = "" if bin_dir else " (use --bin-dir or set $HYBRIDPS_BIN_DIR)"
    raise BinaryNotFoundError(
        f"cannot find {name} (searched {source}); looked in: {', '.join(looked)}"
        f"{hint}{usage_hint}")
