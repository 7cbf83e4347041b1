#!/usr/bin/env bash
# Local reduction on CPUs: push_pull of S bytes by 2 local ranks of one node (shared-memory
# reduction, one push per partition leaves the node) against 1 rank's push_pull of the
# same S bytes, side by side, run R times alternately; medians across runs. A third job
# gives the same two workers a node each (no local reduction: each pushes its S bytes),
# what the two processes would cost without it.
#
#   bench/run_local_bench.sh [RUNS (default 5)] [OUT-DIR]   (binaries: $HYBRIDPS_BUILD_DIR or build/)
#
# Each run:
#   scripts/hybridrun -np 1 --servers 1 -- build/bench/hybridps-bench FLAGS --csv OUT/1rank.runN.csv
#   scripts/hybridrun -np 2 --servers 1 -- build/bench/hybridps-bench FLAGS --csv OUT/2local.runN.csv
#   scripts/hybridrun -np 2 --servers 1 -- bash -c 'HYBRIDPS_LOCAL_RANK=0 HYBRIDPS_LOCAL_SIZE=1
#       HYBRIDPS_NODE_ID=n$HYBRIDPS_RANK exec build/bench/hybridps-bench FLAGS --csv ...2nodes...'
# with FLAGS = --min-bytes 64K --max-bytes 64M --iters 20 --reference 0 --idle-seconds 0
# (hybridrun makes the -np workers of one host the local ranks of one node). Every result
# is checked by hybridps-bench. Prints a Markdown table: per size the median time of each,
# the ratio of 2 local ranks to 1 rank (target <= 1.2x) and of 2 local ranks to 2 nodes
# (below 1: the local reduction pays on this host).
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
  for name in 1rank 2local 2nodes; do
    case $name in
      1rank) cmd=(scripts/hybridrun -np 1 --servers 1 -- "$bench") ;;
      2local) cmd=(scripts/hybridrun -np 2 --servers 1 -- "$bench") ;;
      2nodes) cmd=(scripts/hybridrun -np 2 --servers 1 -- bash -c
                   'HYBRIDPS_LOCAL_RANK=0 HYBRIDPS_LOCAL_SIZE=1 HYBRIDPS_NODE_ID=n$HYBRIDPS_RANK \
                    exec "$0" "$@"' "$bench") ;;
    esac
    cmd+=("${flags[@]}" --csv "$out/$name.run$i.csv")
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


one, two, nodes = times("1rank"), times("2local"), times("2nodes")
print(f"\nmedians over {len(next(iter(one.values()), []))} runs; time = median of 20 "
      "push_pulls; 2 nodes: the same two workers without the local reduction\n")
print("| bytes per rank | 1 rank (µs) | 2 local ranks (µs) | ratio to 1 rank | runs' ratios "
      "| 2 nodes (µs) | 2 local / 2 nodes |")
print("|---|---|---|---|---|---|---|")
for b in sorted(set(one) & set(two)):
    m1, m2 = statistics.median(one[b]), statistics.median(two[b])
    ratios = [y / x for x, y in zip(one[b], two[b])]
    unit = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    mn = statistics.median(nodes[b]) if b in nodes else None
    n_cols = f"{mn:.0f} | {m2 / mn:.2f}x" if mn else "- | -"
    print(f"| {unit} | {m1:.0f} | {m2:.0f} | {m2 / m1:.2f}x | "
          f"{min(ratios):.2f}..{max(ratios):.2f} | {n_cols} |")
EOF
exit "$failed"
