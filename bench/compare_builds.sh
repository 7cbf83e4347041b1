#!/usr/bin/env bash
# Two builds of hybridps side by side (e.g. a change against the code before it), taking
# turns run by run in the same window, with the per-size medians of push_pull time for
# each and their ratio. Every result is checked by hybridps-bench itself.
#
#   bench/compare_builds.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [-r RUNS] [--out DIR]
#                           [--after-env VAR=VALUE]...
#
# --after-env sets a variable for the AFTER runs only, e.g. one build against itself with
# a setting changed: bench/compare_builds.sh build build --after-env HYBRIDPS_ENCRYPT=1.
#
# Per run (default 3) and build, taking turns (which build goes first swaps each run):
#   scripts/hybridrun -np 1 --servers 1 --bin-dir B -- B/bench/hybridps-bench \
#       --min-bytes 4K --max-bytes 64M --iters 20 --idle-seconds 0 --reference 0
#   the same with -np 2 --servers 2
# Logs and CSVs stay in OUT (default: a new folder under /tmp). Exit status non-zero when
# any run failed.
set -euo pipefail

[[ $# -ge 2 ]] || { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
shift 2
runs=3
out=""
after_env=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r|--runs) runs="$2"; shift 2 ;;
    --after-env)
      [[ "$2" == *=* ]] || { echo "compare_builds: --after-env takes VAR=VALUE" >&2; exit 2; }
      after_env+=("$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "compare_builds: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "compare_builds: bad run count '$runs'" >&2; exit 2; }
cd "$(dirname "$0")/.."
[[ -n "$out" ]] || out="$(mktemp -d /tmp/hybridps-compare.XXXXXX)"
mkdir -p "$out"
echo "before: $before" | tee "$out/machine.txt"
echo "after: $after ${after_env[*]:-}" | tee -a "$out/machine.txt"
echo "host: $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" |
  tee -a "$out/machine.txt"

flags=(--min-bytes 4K --max-bytes 64M --iters 20 --idle-seconds 0 --reference 0)
for i in $(seq 1 "$runs"); do
  # Which build goes first swaps from run to run, so that neither always runs in the
  # other's wake.
  order=(before after)
  (( i % 2 == 0 )) && order=(after before)
  for which in "${order[@]}"; do
    b=${!which}
    for cfg in "1 1" "2 2"; do
      read -r nw ns <<<"$cfg"
      name="$which-${nw}w${ns}s.run$i"
      echo "run $i: $which ${nw}w${ns}s"
      env_args=()
      [[ $which == after ]] && env_args=("${after_env[@]}")
      timeout 600 env "${env_args[@]}" scripts/hybridrun -np "$nw" --servers "$ns" --bin-dir "$b" -- \
        "$b/bench/hybridps-bench" "${flags[@]}" --csv "$out/$name.csv" >"$out/$name.log" 2>&1 ||
        { echo "compare_builds: $name failed (see $out/$name.log)" >&2; exit 1; }
    done
  done
done

python3 - "$out" <<'EOF'
"""Per-size medians of push_pull time for each build, and after/before."""
import csv
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def times(path: Path) -> dict[int, float]:
    header, got = [], {}
    for line in csv.reader(path.open()):
        if line and line[0] == "kind":
            header = line
        elif line and line[0] == "pushpull":
            r = dict(zip(header, line))
            got[int(r["bytes"])] = float(r["time_us"])
    return got


def size_name(b: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


for cfg in ("1w1s", "2w2s"):
    med = {}
    for which in ("before", "after"):
        per: dict[int, list[float]] = {}
        for f in sorted(out.glob(f"{which}-{cfg}.run*.csv")):
            for b, t in times(f).items():
                per.setdefault(b, []).append(t)
        med[which] = {b: statistics.median(v) for b, v in per.items()}
        n = len(list(out.glob(f"{which}-{cfg}.run*.csv")))
    print(f"\n### {cfg}: push_pull time (us), medians of {n} alternating runs\n")
    print("| size | before | after | after/before |")
    print("|---:|---:|---:|---:|")
    for b in sorted(med["before"]):
        x, y = med["before"][b], med["after"].get(b, float("nan"))
        print(f"| {size_name(b)} | {x:.1f} | {y:.1f} | {y / x:.3f} |")
EOF
echo "logs and CSVs: $out"
