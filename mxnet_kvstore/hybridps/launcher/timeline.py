"""--timeline-filename: the job's processes write their timelines (HYBRIDPS_TIMELINE) into
a folder beside the file, and hybridrun merges them into one Chrome trace-event file."""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def parts_prefix(filename: str) -> str:
    """The HYBRIDPS_TIMELINE prefix of a job whose timeline goes to ``filename``; the
    folder must be reachable at the same path from every host (one host, a shared file
    system)."""
    return str(Path(filename).resolve().parent / (Path(filename).name + ".parts") / "p")


def prepare(filename: str) -> None:
    """An empty parts folder before the job starts (a killed earlier run may have left
    files there that would be merged as this job's)."""
    folder = Path(parts_prefix(filename)).parent
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def merge(filename: str, expected: list[str]) -> str:
    """Merges the files the processes wrote into ``filename`` and removes them; returns a
    line for the user. ``expected``: the processes' labels ("worker 0", "server 1")."""
    prefix = Path(parts_prefix(filename))
    events: list[dict] = []
    found: list[str] = []
    offsets: dict[str, int] = {}
    dropped = 0
    for part in sorted(prefix.parent.glob(prefix.name + ".*.json")):
        try:
            data = json.loads(part.read_text())
        except (OSError, ValueError):
            continue  # a process that died while writing
        events.extend(data.get("traceEvents", []))
        other = data.get("otherData", {})
        found.append(str(other.get("process", part.stem)))
        offsets[found[-1]] = int(other.get("clock_offset_us", 0))
        dropped += int(other.get("dropped_spans", 0))
    missing = [label for label in expected if label not in found]
    Path(filename).write_text(json.dumps({
        "traceEvents": events, "displayTimeUnit": "ms",
        "otherData": {"processes": found, "missing": missing, "dropped_spans": dropped,
                      "clock_offsets_us": offsets}}))
    shutil.rmtree(prefix.parent, ignore_errors=True)
    line = f"timeline of {len(found)} processes in {filename}"
    if missing:
        line += (f"; none from {', '.join(missing)} (it did not end in order, or wrote "
                 "on a host that does not share this folder)")
    return line
