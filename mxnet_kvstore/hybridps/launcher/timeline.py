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


# Written by the MXNet plugin beside its process's timeline: {"0/3": "dense0_weight"}, the
# parameters' names of the tensors its Trainers hand over by index.
NAMES_SUFFIX = ".names.json"


def tensor_names(prefix: Path) -> dict[str, str]:
    """Every process's tensor-to-parameter names (the same across the workers)."""
    names: dict[str, str] = {}
    for part in prefix.parent.glob(prefix.name + ".*" + NAMES_SUFFIX):
        try:
            found = json.loads(part.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(found, dict):
            names.update({str(k): str(v) for k, v in found.items()})
    return names


def name_tensors(events: list[dict], names: dict[str, str]) -> list[dict]:
    """Puts the parameters' names into the spans': 'dense0_weight' (0/3) for '0/3'."""
    if not names:
        return events
    for event in events:
        name = event.get("name")
        if not isinstance(name, str) or "'" not in name:
            continue
        head, quote, rest = name.partition("'")
        tensor, quote2, tail = rest.partition("'")
        for key in (tensor, tensor[:-len(":init")] if tensor.endswith(":init") else tensor):
            if quote2 and key in names:
                event["name"] = f"{head}'{names[key]}' ({tensor}){tail}"
                event.setdefault("args", {})["parameter"] = names[key]
                break
    return events


def merge(filename: str, expected: list[str]) -> str:
    """Merges the files the processes wrote into ``filename`` and removes them; returns a
    line for the user. ``expected``: the processes' labels ("worker 0", "server 1")."""
    prefix = Path(parts_prefix(filename))
    events: list[dict] = []
    found: list[str] = []
    offsets: dict[str, int] = {}
    dropped = 0
    names = tensor_names(prefix)
    for part in sorted(prefix.parent.glob(prefix.name + ".*.json")):
        if part.name.endswith(NAMES_SUFFIX):
            continue
        try:
            data = json.loads(part.read_text())
        except (OSError, ValueError):
            continue  # a process that died while writing
        events.extend(name_tensors(data.get("traceEvents", []), names))
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
