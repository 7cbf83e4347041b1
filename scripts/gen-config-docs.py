#!/usr/bin/env python3
"""Generates docs/configuration.md from the code: every HYBRIDPS_* environment variable
that Options reads (common/options.cc: which variable sets which field, and its unit),
with the field's comment (common/options.h) as its meaning and the field's initialiser
as its default; then the variables the scripts read and the CMake build options.

    python3 scripts/gen-config-docs.py            # rewrite docs/configuration.md
    python3 scripts/gen-config-docs.py --check    # exit 1 if the page is stale, or if the
                                                  # code reads a variable it does not list
    python3 scripts/gen-config-docs.py --root DIR # another checkout (tests use a copy)

What the code cannot say is kept here: which five settings are worth touching (TOP_FIVE),
who must agree on each (AGREE; a variable missing there gets a guess from its comment)
and what the scripts' own variables mean (SCRIPT_VARS). The test
tests/python/test_config_docs.py (CTest config_docs) runs --check.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

PAGE = "docs/configuration.md"
NAME = re.compile(r"HYBRIDPS_[A-Z][A-Z0-9_]*[A-Z0-9]")

# The five settings worth touching, and why, in order.
TOP_FIVE = [
    ("HYBRIDPS_INTERFACE", "jobs over several hosts: the NIC (or IPv4 address) the servers "
     "and Gloo bind; hybridrun's `--network-interface`. Without it a host with several "
     "interfaces may advertise one the others cannot reach, and workers time out registering."),
    ("HYBRIDPS_TIMEOUT_MS", "how long one operation may take before it fails naming who is "
     "missing. Lower it to see a stuck job's cause sooner while debugging; raise it only for "
     "operations that truly take minutes (huge tensors over slow links)."),
    ("HYBRIDPS_LOG_LEVEL", "3 (debug) shows each process's registration, rounds and "
     "shutdown when something hangs or fails oddly; 1 quietens a large job."),
    ("HYBRIDPS_SERVER_WINDOW_BYTES", "`dist_hybrid` on fast networks: times a server's "
     "connections, it should cover the server's bandwidth times its round time; raise it "
     "(e.g. 4–16 MiB at 25 Gbit/s and up) when push_pull stays below the link rate with "
     "servers idle."),
    ("HYBRIDPS_MXNET_MERGE", "MXNet with several GPUs per process: `host` when the GPUs run "
     "out of memory (no merge buffers on the GPUs, at the price of k copies over PCIe)."),
]

# Who must give the same value. Keys missing here get a guess from the comment.
EVERY = "every process of the job"
WORKERS = "every worker of the job"
NODE = "every local rank of a node"
RANK0 = "rank 0's value is used by every worker"
OWN = "each process its own"
CHECKED = "; compared at registration (a process that differs fails the job at start)"
HYBRIDRUN = " (hybridrun sets it)"
AGREE = {
    "HYBRIDPS_ROLE": OWN + HYBRIDRUN,
    "HYBRIDPS_SCHEDULER_ADDR": EVERY + HYBRIDRUN,
    "HYBRIDPS_SCHEDULER_PORT": EVERY + HYBRIDRUN,
    "HYBRIDPS_SCHEDULER_ENDPOINT": EVERY,
    "HYBRIDPS_PORT_FILE": "the scheduler only" + HYBRIDRUN,
    "HYBRIDPS_NUM_WORKERS": EVERY + HYBRIDRUN + CHECKED,
    "HYBRIDPS_NUM_SERVERS": EVERY + HYBRIDRUN + CHECKED,
    "HYBRIDPS_RANK": OWN + ", distinct" + HYBRIDRUN,
    "HYBRIDPS_LOCAL_RANK": OWN + ", distinct within a node" + HYBRIDRUN,
    "HYBRIDPS_LOCAL_SIZE": NODE + HYBRIDRUN,
    "HYBRIDPS_DEPLOYMENT": EVERY + HYBRIDRUN + CHECKED,
    "HYBRIDPS_EXTRA_SERVERS": EVERY + HYBRIDRUN + CHECKED,
    "HYBRIDPS_NODE_ID": NODE + HYBRIDRUN,
    "HYBRIDPS_LOCAL_SLOTS": NODE,
    "HYBRIDPS_BACKEND": EVERY + HYBRIDRUN + CHECKED,
    "HYBRIDPS_INTERFACE": OWN + " (hybridrun gives every process the same name)",
    "HYBRIDPS_TRANSPORT": "the servers (every worker must be able to reach what they bind)",
    "HYBRIDPS_JOB_TOKEN": EVERY + HYBRIDRUN,
    "HYBRIDPS_JOB_TOKEN_FILE": EVERY + " (the same token as HYBRIDPS_JOB_TOKEN's)",
    "HYBRIDPS_ENCRYPT": EVERY + " (one that differs cannot connect)",
    "HYBRIDPS_TIMELINE": OWN + " (hybridrun --timeline-filename sets it)",
    "HYBRIDPS_SUMMARY_EVERY_MS": OWN + " (hybridrun --summary-every sets it)",
    "HYBRIDPS_PARTITION_BYTES": WORKERS + CHECKED,
    "HYBRIDPS_WIRE_CHUNK_BYTES": WORKERS + CHECKED,
    "HYBRIDPS_LOCAL_INLINE_BYTES": NODE,
    "HYBRIDPS_SERVER_THREADS": "each server its own",
    "HYBRIDPS_CREDIT_BYTES": "each worker its own",
    "HYBRIDPS_SERVER_WINDOW_BYTES": "each worker its own",
    "HYBRIDPS_MAX_SERVER_LANES": "each worker its own",
    "HYBRIDPS_SPIN_US": OWN,
    "HYBRIDPS_BURST_GATHER_US": "each worker its own (the same everywhere keeps the workers' "
                                "first windows alike)",
    "HYBRIDPS_MAX_MESSAGE_BYTES": OWN + " (at least the workers' largest data message; "
                                  "checked at start and registration)",
    "HYBRIDPS_HEARTBEAT_INTERVAL_MS": EVERY + " (below every peer's timeout)",
    "HYBRIDPS_HEARTBEAT_TIMEOUT_MS": EVERY,
    "HYBRIDPS_TIMEOUT_MS": OWN,
    "HYBRIDPS_START_TIMEOUT_MS": OWN,
    "HYBRIDPS_LOG_LEVEL": OWN,
    "HYBRIDPS_FUSION_BYTES": RANK0 + " (a worker whose own differs logs a warning)",
    "HYBRIDPS_FUSION_MAX_TENSOR_BYTES": RANK0,
    "HYBRIDPS_LOCAL_ALLREDUCE": RANK0,
    "HYBRIDPS_GPU_LOCAL_REDUCE": WORKERS + CHECKED,
    "HYBRIDPS_MXNET_MERGE": "each worker its own",
    "HYBRIDPS_HIERARCHICAL_ALLREDUCE": RANK0,
    "HYBRIDPS_EAGER_BYTES": "each worker its own (an operation goes eagerly only when every "
                            "worker sent it so)",
    "HYBRIDPS_EAGER_PROBE": RANK0 + " (so is its upper end, rank 0's HYBRIDPS_EAGER_BYTES; "
                            "every worker takes rank 0's verdict)",
    "HYBRIDPS_TWO_SHOT_BYTES": "each worker its own (a two-shot runs only when both sent "
                               "their halves)",
    "HYBRIDPS_DIRECT_TWO_SHOT": "each worker its own (a two-shot runs only when every worker "
                                "sent its shares)",
    "HYBRIDPS_DIRECT_ALLREDUCE_BYTES": RANK0 + " (a worker whose own differs logs a warning)",
    "HYBRIDPS_CYCLE_TIME_MS": "each worker its own",
    "HYBRIDPS_CALLER_ROUNDS": "each worker its own",
    "HYBRIDPS_BIND_TO": "each worker its own",
    "HYBRIDPS_STALL_WARNING_MS": ("each process its own: a server's and the scheduler's decide when "
                                  "they tell waiting workers, a worker's when it logs"),
}

# Variables the scripts read (not Options): name -> (read by, meaning).
# Variables read into a field of another name (by a helper of options.cc, not a Get*).
FIELD_OF = {"HYBRIDPS_JOB_TOKEN": "job_token", "HYBRIDPS_JOB_TOKEN_FILE": "job_token"}

SCRIPT_VARS = {
    "HYBRIDPS_BIN_DIR": ("hybridrun", "where `hybridps-scheduler` and `hybridps-server` are "
                         "(as `--bin-dir`); a bundle's `env.sh` sets it"),
    "HYBRIDPS_BUILD_DIR": ("build.sh, test.sh, demo.sh, build-wheel, clang-check.sh, "
                           "device-checks, the tests", "the build tree (default `build/`)"),
    "HYBRIDPS_CMAKE_ARGS": ("build.sh", "extra arguments for CMake's configure step, e.g. "
                            "`-DHYBRIDPS_WITH_CUDA=OFF`"),
    "HYBRIDPS_JOBS": ("build.sh", "parallel compile jobs (default 2)"),
    "HYBRIDPS_VENV": ("install-deps.sh", "the Python virtual environment (default `.venv`)"),
    "HYBRIDPS_PYTHON": ("install-deps.sh", "the interpreter that creates the virtual "
                        "environment (default `python3`); in CMake, the venv's interpreter "
                        "that runs the Python tests"),
    "HYBRIDPS_CLANGXX": ("clang-check.sh", "the clang++ of the thread-safety check (default "
                         "clang++, else clang++-14)"),
    "HYBRIDPS_CLANG_TIMEOUT": ("clang-check.sh", "seconds one file may take (default 300)"),
    "HYBRIDPS_CUDART_LIBRARY": ("a worker built with CUDA", "the CUDA runtime to load (a path "
                                "or a name for dlopen; default the soname built against, "
                                "e.g. `libcudart.so.13`)"),
    "HYBRIDPS_NCCL_LIBRARY": ("a worker built with CUDA", "NCCL to load (a path or a name for "
                              "dlopen; default `libnccl.so.2`)"),
}

# Where variables are read: C/C++ string literals, Python string literals, shell
# expansions, CMake's $ENV{...}.
SELF = Path(__file__).name  # its own tables name variables; they are not reads
SCAN_DIRS = ("common", "worker", "server", "scheduler", "mxnet_kvstore", "scripts")
READ_PATTERNS = {
    "c": re.compile(r'"(HYBRIDPS_[A-Z][A-Z0-9_]*[A-Z0-9])"'),
    "py": re.compile(r'["\'](HYBRIDPS_[A-Z][A-Z0-9_]*[A-Z0-9])["\']'),
    "sh": re.compile(r"\$\{?(HYBRIDPS_[A-Z][A-Z0-9_]*[A-Z0-9])"),
    "cmake": re.compile(r"\$ENV\{(HYBRIDPS_[A-Z][A-Z0-9_]*[A-Z0-9])\}"),
}


@dataclass
class Var:
    name: str
    fld: str
    unit: str = ""          # "ms", "µs" or ""
    default: str = ""
    meaning: str = ""
    agree: str = ""
    fallbacks: list[str] = field(default_factory=list)  # mpirun/Slurm names read instead


def kind_of(path: Path) -> str | None:
    if path.suffix in (".h", ".cc", ".cpp", ".cu"):
        return "c"
    if path.name == "CMakeLists.txt" or path.suffix == ".cmake":
        return "cmake"
    if path.suffix == ".py":
        return "py"
    if path.suffix == ".sh":
        return "sh"
    if path.is_file() and path.suffix == "":
        head = path.read_text(errors="replace")[:100]
        if head.startswith("#!"):
            return "py" if "python" in head.splitlines()[0] else "sh"
    return None


def variables_read(root: Path) -> dict[str, set[str]]:
    """Every HYBRIDPS_* name the code reads from the environment -> files reading it."""
    found: dict[str, set[str]] = {}
    for d in SCAN_DIRS:
        for path in sorted((root / d).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.name == SELF:
                continue
            kind = kind_of(path)
            if kind is None:
                continue
            text = path.read_text(errors="replace")
            for m in READ_PATTERNS[kind].finditer(text):
                found.setdefault(m.group(1), set()).add(path.relative_to(root).as_posix())
    return found


def parse_reads(options_cc: str) -> dict[str, tuple[str, str, list[str]]]:
    """options.cc: variable -> (field, unit, launcher fallbacks)."""
    out: dict[str, tuple[str, str, list[str]]] = {}
    for m in re.finditer(r'Get(Number|Millis|Micros)\("(HYBRIDPS_\w+)",\s*&o\.(\w+)\)',
                         options_cc):
        unit = {"Millis": "ms", "Micros": "µs"}.get(m.group(1), "")
        out.setdefault(m.group(2), (m.group(3), unit, []))
    for m in re.finditer(r'GetFirstNumber\(\s*\{([^}]*)\},\s*&o\.(\w+)', options_cc):
        names = re.findall(r'"(\w+)"', m.group(1))
        if names and names[0].startswith("HYBRIDPS_"):
            out[names[0]] = (m.group(2), "", names[1:])
    for m in re.finditer(r'Get\("(HYBRIDPS_\w+)"\)\)\s*(?:o\.(\w+)\s*=)?', options_cc):
        name = m.group(1)
        if name not in out:
            out[name] = (m.group(2) or name[len("HYBRIDPS_"):].lower(), "", [])
    for name in set(re.findall(r'"(HYBRIDPS_\w+)"', options_cc)) - set(out):
        out[name] = (FIELD_OF.get(name, name[len("HYBRIDPS_"):].lower()), "", [])
    return out


@dataclass
class Field:
    name: str
    init: str
    ctype: str
    comment: list[str]


def parse_fields(options_h: str) -> dict[str, Field]:
    """options.h's struct Options: field -> its initialiser and its comment (the lines from
    the last one that starts with a HYBRIDPS_ name, so a note above it stays out)."""
    body = options_h[options_h.index("struct Options {"):]
    body = body[:body.index("\n};")]
    fields: dict[str, Field] = {}
    comment: list[str] = []
    last_was_field = False
    for raw in body.splitlines()[1:]:
        line = raw.strip()
        if line.startswith("//"):
            if last_was_field:
                comment = []
            text = line[2:].strip()
            if re.match(r"(dist_allreduce only\. )?HYBRIDPS_", text):
                comment = []
            comment.append(text)
            last_was_field = False
            continue
        m = re.match(r"(?:static constexpr )?([\w:<>]+)\s+(\w+)(?:\s*=\s*(.*))?;$", line)
        if m and "(" not in m.group(2):
            fields[m.group(2)] = Field(m.group(2), (m.group(3) or "").strip(), m.group(1),
                                       list(comment))
            last_was_field = True
        else:
            comment, last_was_field = [], False
    return fields


SIZES = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]


def eval_int(expr: str) -> int | None:
    expr = re.sub(r"size_t\{(\d+)\}", r"\1", expr)
    if re.fullmatch(r"[\d\s<>()*+]+", expr):
        return int(eval(expr))  # noqa: S307 - digits and shifts only
    return None


def format_default(f: Field, unit: str, name: str) -> str:
    """The initialiser as a reader wants it: in the variable's unit, sizes also in KiB/MiB."""
    init = f.init
    if not init:
        return "unset" if f.ctype == "std::string" else "0"
    if init.startswith('"'):
        return f"`{init.strip(chr(34))}`" if init != '""' else "unset"
    m = re.fullmatch(r"absl::(Milliseconds|Seconds|Microseconds)\((\d+)\)", init)
    if m:
        us = int(m.group(2)) * {"Microseconds": 1, "Milliseconds": 1000,
                                "Seconds": 1000000}[m.group(1)]
        value = us // 1000 if unit == "ms" else us
        human = f" ({us // 1000000} s)" if us >= 1000000 and us % 1000000 == 0 else ""
        return f"{value} {unit}{human}"
    if init == "absl::ZeroDuration()":
        return f"0 {unit}" if unit else "0"
    m = re.fullmatch(r"Role::k(\w+)", init)
    if m:
        return f"`{m.group(1).lower()}`"
    n = eval_int(init)
    if n is not None:
        for size, suffix in SIZES:
            if "BYTES" in name and n >= size and n % size == 0:
                return f"{n} ({n // size} {suffix})"
        return str(n)
    return f"`{init}`"


def meaning_of(comment: list[str], names: list[str]) -> str:
    text = " ".join(comment)
    # Drop the leading "HYBRIDPS_X / HYBRIDPS_Y:" (or "." ) naming the variables.
    text = re.sub(r"^(dist_allreduce only\.\s*)?", "", text)
    lead = re.match(r"^((?:HYBRIDPS_\w+)(?:\s*/\s*HYBRIDPS_\w+)*)(\s*\(([^)]*)\))?\s*[:.]\s*",
                    text)
    if lead:
        scope = lead.group(3)
        text = text[lead.end():]
        if scope:
            text = f"({scope}) {text}"
    text = text.replace("<", "&lt;").replace(">", "&gt;").strip()
    text = text[:1].upper() + text[1:]
    return text or "(no comment in common/options.h)"


def guess_agree(meaning: str) -> str:
    if "Rank 0's value" in meaning:
        return RANK0
    if re.search(r"[Ee]very local rank", meaning):
        return NODE
    if re.search(r"[Ee]very worker .*must", meaning):
        return WORKERS
    return OWN + " (not stated: add it to AGREE in scripts/gen-config-docs.py)"


def collect(root: Path) -> list[Var]:
    reads = parse_reads((root / "common/options.cc").read_text())
    fields = parse_fields((root / "common/options.h").read_text())
    out = []
    for name, (fld, unit, fallbacks) in reads.items():
        f = fields.get(fld, Field(fld, "", "", []))
        meaning = meaning_of(f.comment, [name])
        v = Var(name, fld, unit, format_default(f, unit, name), meaning,
                AGREE.get(name) or guess_agree(meaning), fallbacks)
        if name == "HYBRIDPS_LOCAL_INLINE_BYTES":
            v.default += "; every tensor when the host has no more CPUs than the node has " \
                         "local ranks"
        if name == "HYBRIDPS_SERVER_THREADS":
            v.default = "0 (one per core, at most 4)"
        if name == "HYBRIDPS_RANK":
            v.default = "assigned by the scheduler"
        if name == "HYBRIDPS_NUM_SERVERS":
            v.default += "; 0 with `HYBRIDPS_BACKEND=dist_allreduce`"
        out.append(v)
    return out


def cmake_options(root: Path) -> list[tuple[str, str, str]]:
    text = (root / "CMakeLists.txt").read_text()
    out = []
    for m in re.finditer(r'option\((HYBRIDPS_\w+)\s+"([^"]*)"\s+(\w+)\)', text):
        out.append((m.group(1), m.group(3), m.group(2)))
    for m in re.finditer(r'set\((HYBRIDPS_\w+)\s+(\S+)\s+CACHE\s+\w+\s*\n?\s*"([^"]*)"\)',
                         text):
        default = m.group(2).replace("${PROJECT_SOURCE_DIR}", "<repo>").strip('"')
        out.append((m.group(1), default, m.group(3)))
    return out


def anchor(name: str) -> str:
    return name.lower()


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


GROUPS = [
    ("The job (hybridrun sets these)", ["HYBRIDPS_ROLE", "HYBRIDPS_SCHEDULER_ADDR",
     "HYBRIDPS_SCHEDULER_PORT", "HYBRIDPS_SCHEDULER_ENDPOINT", "HYBRIDPS_PORT_FILE",
     "HYBRIDPS_NUM_WORKERS", "HYBRIDPS_NUM_SERVERS", "HYBRIDPS_RANK", "HYBRIDPS_LOCAL_RANK",
     "HYBRIDPS_LOCAL_SIZE", "HYBRIDPS_NODE_ID", "HYBRIDPS_BACKEND", "HYBRIDPS_INTERFACE",
     "HYBRIDPS_DEPLOYMENT", "HYBRIDPS_EXTRA_SERVERS", "HYBRIDPS_JOB_TOKEN",
     "HYBRIDPS_JOB_TOKEN_FILE", "HYBRIDPS_ENCRYPT"]),
    ("Liveness and deadlines", ["HYBRIDPS_HEARTBEAT_INTERVAL_MS",
     "HYBRIDPS_HEARTBEAT_TIMEOUT_MS", "HYBRIDPS_TIMEOUT_MS", "HYBRIDPS_START_TIMEOUT_MS",
     "HYBRIDPS_STALL_WARNING_MS", "HYBRIDPS_LOG_LEVEL", "HYBRIDPS_MAX_MESSAGE_BYTES",
     "HYBRIDPS_TIMELINE", "HYBRIDPS_SUMMARY_EVERY_MS"]),
    ("dist_hybrid: partitions, the wire and the servers", ["HYBRIDPS_PARTITION_BYTES",
     "HYBRIDPS_WIRE_CHUNK_BYTES", "HYBRIDPS_CREDIT_BYTES", "HYBRIDPS_SERVER_WINDOW_BYTES",
     "HYBRIDPS_MAX_SERVER_LANES", "HYBRIDPS_BURST_GATHER_US", "HYBRIDPS_SPIN_US",
     "HYBRIDPS_SERVER_THREADS", "HYBRIDPS_TRANSPORT"]),
    ("Nodes of several local ranks, GPUs and MXNet", ["HYBRIDPS_LOCAL_SLOTS",
     "HYBRIDPS_LOCAL_INLINE_BYTES", "HYBRIDPS_GPU_LOCAL_REDUCE", "HYBRIDPS_MXNET_MERGE",
     "HYBRIDPS_CALLER_ROUNDS", "HYBRIDPS_BIND_TO"]),
    ("dist_allreduce", ["HYBRIDPS_FUSION_BYTES", "HYBRIDPS_FUSION_MAX_TENSOR_BYTES",
     "HYBRIDPS_LOCAL_ALLREDUCE", "HYBRIDPS_HIERARCHICAL_ALLREDUCE", "HYBRIDPS_EAGER_BYTES",
     "HYBRIDPS_EAGER_PROBE", "HYBRIDPS_TWO_SHOT_BYTES", "HYBRIDPS_DIRECT_ALLREDUCE_BYTES",
     "HYBRIDPS_DIRECT_TWO_SHOT", "HYBRIDPS_CYCLE_TIME_MS"]),
]


def render(root: Path) -> str:
    vars_ = {v.name: v for v in collect(root)}
    grouped = [(title, [vars_[n] for n in names if n in vars_]) for title, names in GROUPS]
    placed = {v.name for _, vs in grouped for v in vs}
    rest = [v for n, v in sorted(vars_.items()) if n not in placed]
    if rest:
        grouped.append(("Other", rest))
    w = []
    w.append("# Configuration")
    w.append("")
    w.append("<!-- Generated by scripts/gen-config-docs.py from common/options.h and "
             "common/options.cc; do not edit. -->")
    w.append("")
    w.append("Every setting is an environment variable, read in one place "
             "(`OptionsFromEnvironment()` in `common/options.cc`) into the typed `Options` "
             "of `common/options.h`, whose comments are the meanings below. `hybridrun` "
             "sets the job's own variables for every process and passes every other "
             "`HYBRIDPS_*` variable exported where it runs to every process (`-x VAR=VALUE` "
             "sets one explicitly). A malformed value is an error naming the variable. "
             "The measurements behind the defaults: [Design](design/index.md).")
    w.append("")
    w.append("## The five worth touching")
    w.append("")
    for i, (name, why) in enumerate(TOP_FIVE, 1):
        v = vars_.get(name)
        default = f" (default {v.default})" if v else ""
        w.append(f"{i}. [`{name}`](#{anchor(name)}){default}: {why}")
    w.append("")
    w.append("Everything else is tuned for the common case; change it after measuring "
             "([Performance](performance.md)).")
    w.append("")
    w.append("## All settings")
    w.append("")
    w.append("| variable | default | who must agree |")
    w.append("|---|---|---|")
    for _, vs in grouped:
        for v in vs:
            w.append(f"| [`{v.name}`](#{anchor(v.name)}) | {cell(v.default)} | "
                     f"{cell(v.agree)} |")
    w.append("")
    for title, vs in grouped:
        w.append(f"## {title}")
        w.append("")
        for v in vs:
            w.append(f"### `{v.name}` {{#{anchor(v.name)}}}")
            w.append("")
            w.append(f"Default **{v.default}** · {v.agree} · field `Options::{v.fld}`")
            w.append("")
            w.append(v.meaning)
            if v.fallbacks:
                w.append("")
                w.append("When unset on a worker, taken from the first of "
                         + ", ".join(f"`{f}`" for f in v.fallbacks)
                         + " that is set (mpirun, MPICH/Intel MPI, Slurm).")
            w.append("")
    w.append("## Workers started by mpirun or srun")
    w.append("")
    w.append("A worker without `HYBRIDPS_RANK`, `HYBRIDPS_NUM_WORKERS`, `HYBRIDPS_LOCAL_RANK` "
             "or `HYBRIDPS_LOCAL_SIZE` takes it from the launcher's own variables, first "
             "found (listed under each variable above; for the local size also this node's "
             "entry of `SLURM_TASKS_PER_NODE`, by `SLURM_NODEID`). `HYBRIDPS_*` always win; "
             "servers and the scheduler ignore the launcher's variables. hybridps never "
             "reads MXNet's `DMLC_*` variables: `import mxnet` with `DMLC_ROLE` set turns a "
             "process into MXNet's own parameter server.")
    w.append("")
    w.append("## Variables of the scripts")
    w.append("")
    w.append("| variable | read by | meaning |")
    w.append("|---|---|---|")
    for name, (who, what) in sorted(SCRIPT_VARS.items()):
        w.append(f"| `{name}` | {cell(who)} | {cell(what)} |")
    w.append("")
    w.append("## Build options (CMake)")
    w.append("")
    w.append("Given to `cmake -D...` (or through `HYBRIDPS_CMAKE_ARGS` to `scripts/build.sh`); "
             "not environment variables.")
    w.append("")
    w.append("| option | default | meaning |")
    w.append("|---|---|---|")
    for name, default, doc in cmake_options(root):
        w.append(f"| `{name}` | `{default}` | {cell(doc)} |")
    w.append("")
    return "\n".join(w)


def check(root: Path) -> list[str]:
    problems = []
    want = render(root)
    page = root / PAGE
    have = page.read_text() if page.exists() else ""
    if have != want:
        diff = difflib.unified_diff(have.splitlines(), want.splitlines(), PAGE,
                                    "generated", lineterm="", n=1)
        problems.append(f"{PAGE} is not what scripts/gen-config-docs.py generates; run it:\n"
                        + "\n".join(list(diff)[:40]))
    listed = set(NAME.findall(have))
    for name, files in sorted(variables_read(root).items()):
        if name not in listed:
            problems.append(f"{name} is read by {', '.join(sorted(files))} but {PAGE} does "
                            "not list it")
    return problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args(argv)
    if args.check:
        problems = check(args.root)
        for p in problems:
            print(p)
        if problems:
            return 1
        print(f"{PAGE} is current and lists every HYBRIDPS_* variable the code reads")
        return 0
    (args.root / PAGE).write_text(render(args.root))
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
