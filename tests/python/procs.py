"""The processes a test started, found through /proc: live ones (not zombies) whose
environment holds a variable with a given value (each test marks its jobs so)."""
from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie or a gone process does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def pids_with(variable: str, value: str) -> list[int]:
    """Live processes other than this one whose environment holds VARIABLE=VALUE."""
    wanted = f"{variable}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            items = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in items and alive(int(entry)):
            found.append(int(entry))
    return found
