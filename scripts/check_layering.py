#!/usr/bin/env python3
"""Checks the source tree's layering: every `#include "folder/..."` of our own code goes
to a folder its own folder may depend on (the table below, the same edges as the folders'
CMake targets), and the folder map of docs/architecture.md names exactly the folders of
worker/.

    python3 scripts/check_layering.py [ROOT]

Prints one line per violation and exits 1 when there is any, 0 otherwise.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

# Folder -> the folders its files may include (its own included). tests/, bench/ and
# examples/ may include anything but mxnet_kvstore/ (they test and measure internals).
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "optimizers": {"common"},
    "scheduler": {"common"},
    "server": {"common", "optimizers"},
    # The public API only; the factory (below) is the one file that sees the stores.
    "worker": {"common", "optimizers"},
    "worker/node": {"common"},
    "worker/comm": {"common"},
    "worker/gpu": {"common", "worker", "worker/comm"},
    "worker/ps/local": {"common", "worker", "worker/node", "worker/comm", "worker/gpu"},
    "worker/ps": {"common", "optimizers", "worker", "worker/gpu", "worker/ps/local"},
    "worker/allreduce": {"common", "worker", "worker/node", "worker/comm"},
    "mxnet_kvstore": {"common", "optimizers", "worker"},
}
# Single files with more edges than their folder, and why.
FILE_ALLOWED: dict[str, set[str]] = {
    "worker/factory.cc": {"worker/ps", "worker/allreduce"},  # KVStore::Create
    "worker/process_set.cc": {"scheduler"},  # a process set's scheduler runs in a worker
}
FREE = ("tests", "bench", "examples")  # may include any folder but mxnet_kvstore/
SOURCE = re.compile(r"\.(h|cc|cu|cpp)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# The page whose folder map is checked, and a line of that map: a folder at the start of a
# line inside the map block.
MAP_FILE = "docs/architecture.md"
MAP_LINE = re.compile(r"^((?:[a-z_]+/)+)\s")


def folder_of(path: str) -> str:
    """The deepest folder of ALLOWED that holds `path` ('' when none does)."""
    best = ""
    for f in ALLOWED:
        if path.startswith(f + "/") and len(f) > len(best):
            best = f
    return best


def include_violations(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or not SOURCE.search(rel):
            continue
        if rel.startswith(("build", ".venv", ".git/")) or "/build" in rel:
            continue
        top = rel.split("/", 1)[0]
        src = folder_of(rel)
        if not src and top not in FREE:
            continue  # third-party or generated
        for lineno, m in _includes(path):
            target = m
            dst = folder_of(target)
            if not dst:
                continue  # a system or third-party header
            if top in FREE:
                if dst == "mxnet_kvstore":
                    out.append(f"{rel}:{lineno}: includes {target}: nothing outside "
                               "mxnet_kvstore/ may include it")
                continue
            if dst == src or dst in ALLOWED[src] or dst in FILE_ALLOWED.get(rel, set()):
                continue
            out.append(f"{rel}:{lineno}: includes {target}: {src}/ may not depend on "
                       f"{dst}/ (allowed: {', '.join(sorted(ALLOWED[src])) or 'nothing'})")
    return out


def _includes(path: Path):
    text = path.read_text(errors="replace")
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def readme_violations(root: Path) -> list[str]:
    """The folder map of MAP_FILE (its first code block that names worker/) against the
    folders of worker/ that hold sources."""
    readme = (root / MAP_FILE).read_text()
    mapped: set[str] = set()
    for block in _code_blocks(readme):
        if not re.search(r"^worker/", block, re.M):
            continue
        for line in block.splitlines():
            m = MAP_LINE.match(line)
            if m:
                mapped.add(m.group(1).rstrip("/"))
        break
    if not mapped:
        return [f"{MAP_FILE}: no folder map (a code block listing worker/ and its folders)"]
    out = []
    for f in sorted(mapped):
        if not (root / f).is_dir():
            out.append(f"{MAP_FILE}: the folder map names {f}/, which does not exist")
    for d in sorted(p for p in (root / "worker").rglob("*") if p.is_dir()):
        rel = d.relative_to(root).as_posix()
        if any(SOURCE.search(x.name) for x in d.iterdir()) and rel not in mapped:
            out.append(f"{MAP_FILE}: the folder map does not name {rel}/")
        if any(SOURCE.search(x.name) for x in d.iterdir()) and rel not in ALLOWED:
            out.append(f"{rel}/: a folder with sources that the layering table does not know")
    return out


def _code_blocks(text: str) -> list[str]:
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent)
    problems = include_violations(root) + readme_violations(root)
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} violation(s)")
        return 1
    print(f"layering: every include follows the allowed edges; {MAP_FILE}'s map is the tree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
