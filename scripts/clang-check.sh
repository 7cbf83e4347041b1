#!/usr/bin/env bash
# Checks our C++ with clang's thread-safety analysis: clang++ -fsyntax-only (nothing is
# compiled or written) with -Wthread-safety(-beta, -verbose) -Werror, each file with
# its real include paths and defines from the build's compile_commands.json.
# (-Wthread-safety-negative is left out: it wants every lock's negative capability
# declared, dozens of annotations per file.)
#
#   scripts/clang-check.sh            every file of ours in compile_commands.json: common/,
#                                     scheduler/, server/, optimizers/, worker/,
#                                     mxnet_kvstore/src/, examples/, tests/, bench/
#   scripts/clang-check.sh FILE...    only these; a file missing from compile_commands.json
#                                     gets -std=c++20 -I<root> -I<build>
#
# The build directory is ${HYBRIDPS_BUILD_DIR:-<root>/build}; it needs at least a configure
# and the generated protobuf header (cmake --build build --target hybridps_proto).
# HYBRIDPS_CLANGXX picks the compiler (default clang++, else clang++-14),
# HYBRIDPS_CLANG_TIMEOUT the seconds one file may take (default 300). The warnings of the
# build's own flags are dropped (GCC checks those); files compiled by nvcc are skipped.
# Exits 0 with one summary line, or prints clang's diagnostics and exits 1 (2: no
# clang++, or no compile_commands.json to check the tree with).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HYBRIDPS_BUILD_DIR:-$root/build}
build=$(cd "$build" 2>/dev/null && pwd || echo "$build")
timeout_s=${HYBRIDPS_CLANG_TIMEOUT:-300}
# -verbose adds a note naming the function of each finding.
export CLANG_CHECK_FLAGS="-Wthread-safety -Wthread-safety-beta -Wthread-safety-verbose -Werror"

clangxx=${HYBRIDPS_CLANGXX:-}
if [ -z "$clangxx" ]; then
  for c in clang++ clang++-14; do
    if command -v "$c" >/dev/null; then clangxx=$c; break; fi
  done
fi
if [ -z "$clangxx" ] || ! command -v "$clangxx" >/dev/null; then
  echo "clang-check: no clang++ (install Debian's clang: scripts/install-deps.sh)" >&2
  exit 2
fi
if [ $# -eq 0 ] && [ ! -f "$build/compile_commands.json" ]; then
  echo "clang-check: $build/compile_commands.json is missing: configure first" \
       "(scripts/build.sh, or cmake -S . -B build && cmake --build build --target hybridps_proto)" >&2
  exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/clang-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS

# One job per file: N.dir (where clang runs), N.rsp (its arguments, a response file),
# N.src (the file's name for the report).
python3 - "$root" "$build" "$work" "$@" <<'PY'
import json, os, shlex, sys
from pathlib import Path

root, build, work = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
named = [Path(f).resolve() for f in sys.argv[4:]]
OURS = ("common", "scheduler", "server", "optimizers", "worker", "mxnet_kvstore/src",
        "examples", "tests", "bench")
CHECK = ["-fsyntax-only", "-Qunused-arguments"] + os.environ["CLANG_CHECK_FLAGS"].split()
# GCC flags clang does not know, dropped (exact names or prefixes), and translated ones.
GCC_ONLY = {"-fconcepts", "-fcoroutines", "-fno-gnu-unique", "-fext-numeric-literals",
            "-fno-ext-numeric-literals", "-fvar-tracking", "-fno-var-tracking",
            "-fvar-tracking-assignments", "-fno-var-tracking-assignments",
            "-ffat-lto-objects", "-fno-fat-lto-objects", "-fno-keep-inline-dllexport",
            "-fno-canonical-system-headers", "-fipa-pta", "-fno-ipa-cp-clone"}
GCC_ONLY_PREFIXES = ("-flto", "-fipa-", "-fno-ipa-", "-ftree-", "-fno-tree-", "-fabi-version=",
                     "-fvect-cost-model", "-fsimd-cost-model", "-fcompare-debug",
                     "-fdump-", "-fopt-info", "-fplugin", "-fno-diagnostics-show-caret")
WITH_VALUE = {"-o", "-MF", "-MT", "-MQ"}  # dropped together with their value


def ours(path: Path) -> bool:
    if build == path or build in path.parents:
        return False
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        return False
    return any(rel.startswith(d + "/") for d in OURS)


def translate(args, src: Path):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in WITH_VALUE:
            skip = True
        elif a in ("-c", "-MD", "-MMD", "-MP") or a.startswith(("-o", "-MF", "-MT", "-MQ")):
            continue
        elif a.startswith("-W") and not a.startswith(("-Wp,", "-Wa,", "-Wl,")):
            continue  # the build's warnings: GCC's business; the check sets its own
        elif a.startswith("-fmax-errors="):
            out.append("-ferror-limit=" + a.split("=", 1)[1])
        elif a in GCC_ONLY or a.startswith(GCC_ONLY_PREFIXES):
            continue
        elif a.startswith("-g"):
            continue
        else:
            out.append(a)
    return out


entries = {}
cc = build / "compile_commands.json"
if cc.is_file():
    for e in json.loads(cc.read_text()):
        d = Path(e["directory"])
        f = (d / e["file"]).resolve()
        args = e.get("arguments") or shlex.split(e["command"])
        entries.setdefault(f, (d, args))

jobs, skipped = [], 0
if named:
    for f in named:
        if not f.is_file():
            sys.exit(f"clang-check: {f}: no such file")
        if f in entries:
            jobs.append((f,) + entries[f])
        else:
            lang = "c++-header" if f.suffix in (".h", ".hh", ".hpp") else "c++"
            args = ["clang++", "-x", lang, "-std=c++20", f"-I{root}"]
            if build.is_dir():
                args.append(f"-I{build}")
            jobs.append((f, Path.cwd(), args + [str(f)]))
else:
    for f, (d, args) in sorted(entries.items()):
        if ours(f):
            jobs.append((f, d, args))

n = 0
for f, d, args in jobs:
    if "nvcc" in os.path.basename(args[0]) or f.suffix == ".cu":
        skipped += 1
        continue
    # The source is dropped with the other arguments that name it and put back last.
    rest = [a for a in args[1:] if a != str(f) and (d / a).resolve() != f]
    rsp = translate(rest, f) + CHECK + [str(f)]
    (work / f"{n}.dir").write_text(str(d))
    (work / f"{n}.rsp").write_text("\n".join(shlex.quote(a) for a in rsp) + "\n")
    (work / f"{n}.src").write_text(str(f.relative_to(root)) if root in f.parents else str(f))
    n += 1
(work / "skipped").write_text(str(skipped))
if n == 0:
    sys.exit("clang-check: no files to check")
PY

export clangxx timeout_s
# Two at a time; each clang ends by itself or by timeout (TERM, then KILL 10 s later).
# --foreground keeps clang in this script's process group, so that Ctrl-C or a kill of the
# group reaches it (clang's front end runs in the driver's process: nothing escapes).
# The wrapper always exits 0 so that xargs runs every file; N.rc holds clang's status.
find "$work" -name '*.rsp' -print0 | sort -z |
  xargs -0 -P2 -n1 bash -c '
    job=${1%.rsp}
    cd "$(cat "$job.dir")" &&
      timeout --foreground -k 10 "$timeout_s" "$clangxx" @"$1" > "$job.out" 2>&1 < /dev/null
    echo $? > "$job.rc"' _

total=0 failed=0
for rsp in "$work"/*.rsp; do
  job=${rsp%.rsp}
  total=$((total + 1))
  rc=$(cat "$job.rc" 2>/dev/null || echo missing)
  if [ "$rc" != 0 ]; then
    failed=$((failed + 1))
    echo "=== clang-check: $(cat "$job.src") (exit $rc$([ "$rc" = 124 ] && echo ", timed out after ${timeout_s}s"))"
    cat "$job.out" 2>/dev/null || true
  fi
done
skipped=$(cat "$work/skipped")
skip_note=""
[ "$skipped" != 0 ] && skip_note=", $skipped nvcc files skipped"
version=$("$clangxx" --version | sed -n '1s/.*version \([0-9.]*\).*/\1/p')
if [ "$failed" -ne 0 ]; then
  echo "clang-check: $failed of $total files failed (clang++ $version, $CLANG_CHECK_FLAGS)" >&2
  exit 1
fi
echo "clang-check: $total files checked, clean (clang++ $version, $CLANG_CHECK_FLAGS," \
     "$((SECONDS - start)) s$skip_note)"
