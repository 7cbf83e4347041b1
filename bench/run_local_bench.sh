#!/usr/bin/env bash
# Local reduction on CPUs: push_pull of S bytes by 2 local ranks of one node (shared-memory
# reduction, one push per partition leaves the node) against 1 rank's push_pull of the
# same S bytes, side by side, run R times alternately; medians across runs.
#
#   bench/run_local_bench.sh [RUNS (default 5)] [OUT-DIR]   (binaries: $HYBRIDPS_BUILD_DIR or build/)
#
# Each run:
#   scripts/hybridrun -np 1 --servers 1 -- build/bench/hybridps-bench FLAGS --csv OUT/1rank.runN.csv
#   scripts/hybridrun -np 2 --servers 1 -- build/bench/hybridps-bench FLAGS --csv OUT/2local.runN.csv
# with FLAGS = --min-bytes 64K --max-bytes 64M --iters 20 --reference 0 --idle-seconds 0
# (hybridrun makes the -np workers of one host the local ranks of one node). Every result
# is checked by hybridps-bench. Prints a Markdown table: per size the median time of each
# and their ratio (target: 2 local ranks <= 1.2x one rank).
set -euo pipefail

runs=${1:-5}
out=${2:-}
build_dir=${HYBRIDPS_BUILD_DIR:-build}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "usage: run_local_bench.sh [RUNS] [OUT-DIR]" >&2; exit 2; }

cd "$(dirname "$0")/.."
bench="$build_dir/bench/hybridps-bench"
[[ -x "$bench" ]] || { echo "run_local_bench: build first ($bench missing)" >&2; exit 2; }
[[ -n "$out" ]] || out="$(mktemp -d /tmp/hybridps-local-bench.XXXXXX)"
mkdir -p "$out"
flags=(--min-bytes 64K --max-bytes 64M --iters 20 --reference 0 --idle-seconds 0)
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); $(nproc) cores; load average at start:" \
  "$(cut -d' ' -f1-3 /proc/loadavg); git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

failed=0
for ((i = 1; i <= runs; i++)); do
  for np in 1 2; do
    name=$([[ $np == 1 ]] && echo 1rank || echo 2local)
    cmd=(scripts/hybridrun -np "$np" --servers 1 -- "$bench" "${flags[@]}"
         --csv "$out/$name.run$i.csv")
    echo "run $i/$runs $name: ${cmd[*]}"
    if ! "${cmd[@]}" >"$out/$name.run$i.log" 2>&1; then
      failed=1
      echo "    FAILED; the end of $out/$name.run$i.log:"
      tail -5 "$out/$name.run$i.log" | sed 's/^/    /'
    fi
  done
done

python3 - "$out" <<'EOF'
import csv
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def times(name: str) -> dict[int, list[float]]:
    per: dict[int, list[float]] = {}
    for f in sorted(out.glob(f"{name}.run*.csv")):
        header: list[str] = []
        for row in csv.reader(f.open()):
            if row and row[0] == "kind":
                header = row
            elif row and row[0] == "pushpull":
                r = dict(zip(header, row))
                per.setdefault(int(r["bytes"]), []).append(float(r["time_us"]))
    return per


one, two = times("1rank"), times("2local")
print(f"\nmedians over {len(next(iter(one.values()), []))} runs (1 rank) and "
      f"{len(next(iter(two.values()), []))} runs (2 local ranks); time = median of 20 "
      "push_pulls\n")
print("| bytes per rank | 1 rank: time (µs) | 2 local ranks: time (µs) | ratio | runs' ratios |")
print("|---|---|---|---|---|")
for b in sorted(set(one) & set(two)):
    m1, m2 = statistics.median(one[b]), statistics.median(two[b])
    ratios = [y / x for x, y in zip(one[b], two[b])]
    unit = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {unit} | {m1:.0f} | {m2:.0f} | {m2 / m1:.2f}x | "
          f"{min(ratios):.2f}..{max(ratios):.2f} |")
EOF
exit "$failed"
