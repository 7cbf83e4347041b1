#!/usr/bin/env bash
# dist_allreduce against plain Gloo (and dist_hybrid) on this machine, run R times, with
# the medians across runs. Every figure comes from hybridps-gloo-ref (bench/gloo_allreduce_ref.cc),
# which checks every result.
#
#   bench/run_allreduce_bench.sh [-r RUNS] [--np "2 4"] [--out DIR] [--build-dir DIR]
#
# Per worker count N in --np (default "2 4") and run (default 3), taking turns:
#   scripts/hybridrun -np N --backend dist_allreduce -- hybridps-gloo-ref \
#       --min-bytes 4K --max-bytes 64M --factor 4 --iters 30 --small-iters 200
#   scripts/hybridrun -np N --backend dist_allreduce -- hybridps-gloo-ref --model resnet50 --iters 10
#   scripts/hybridrun -np N --servers N --backend dist_hybrid -- hybridps-gloo-ref --model resnet50 --iters 10
# Logs stay in OUT (default: a new folder under /tmp). Prints the per-size medians.
set -euo pipefail

runs=3
nps="2 4"
out=""
build_dir=build
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r|--runs) runs="$2"; shift 2 ;;
    --np) nps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_allreduce_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
if [[ -f "$build_dir/CMakeCache.txt" ]]; then  # a build tree (not a scripts/bundle folder)
  cmake --build "$build_dir" -j2 --target hybridps-gloo-ref hybridps-server hybridps-scheduler \
    >/dev/null
fi
ref="$build_dir/bench/hybridps-gloo-ref"
[[ -n "$out" ]] || out="$(mktemp -d /tmp/hybridps-allreduce-bench.XXXXXX)"
mkdir -p "$out"
echo "date $(date -u +%FT%TZ); $(nproc) cores; $(uname -sr); load at start: $(cut -d' ' -f1-3 /proc/loadavg)" \
  | tee "$out/machine.txt"

for run in $(seq 1 "$runs"); do
  for n in $nps; do
    echo "run $run, $n workers (load $(cut -d' ' -f1 /proc/loadavg))"
    scripts/hybridrun -np "$n" --backend dist_allreduce -- "$ref" --min-bytes 4K \
      --max-bytes 64M --factor 4 --iters 30 --small-iters 200 >"$out/sweep.n$n.run$run.log" 2>&1
    scripts/hybridrun -np "$n" --backend dist_allreduce -- "$ref" --model resnet50 --iters 10 \
      >"$out/resnet.allreduce.n$n.run$run.log" 2>&1
    scripts/hybridrun -np "$n" --servers "$n" --backend dist_hybrid -- "$ref" --model resnet50 \
      --iters 10 >"$out/resnet.hybrid.n$n.run$run.log" 2>&1
  done
done

python3 - "$out" "$nps" <<'EOF'
import glob, re, statistics, sys
out, nps = sys.argv[1], sys.argv[2].split()
med = statistics.median
for n in nps:
    rows = {}
    for f in sorted(glob.glob(f"{out}/sweep.n{n}.run*.log")):
        for line in open(f):
            m = re.match(r"\[worker 0\]\s+(\d+)\s+\d+ \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+) \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+) \|\s+([\d.]+)", line)
            if m:
                rows.setdefault(int(m[1]), []).append([float(x) for x in m.groups()[1:]])
    print(f"\n{n} workers, sweep: medians of {len(glob.glob(f'{out}/sweep.n{n}.run*.log'))} runs")
    print("| size | gloo median µs | gloo p10 µs | gloo busbw GB/s | ours median µs | ours p10 µs | ours busbw GB/s | ours/gloo (per run) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for size, rs in sorted(rows.items()):
        c = list(zip(*rs))
        print(f"| {size} | {med(c[0]):.0f} | {med(c[1]):.0f} | {med(c[3]):.3f} | {med(c[4]):.0f} | {med(c[5]):.0f} | {med(c[7]):.3f} | {med(c[8]):.2f} ({', '.join(f'{x:.2f}' for x in c[8])}) |")
    for backend in ("allreduce", "hybrid"):
        vals = {}
        for f in sorted(glob.glob(f"{out}/resnet.{backend}.n{n}.run*.log")):
            for line in open(f):
                for key, pat in (("per tensor", r"one allreduce per tensor\s+([\d.]+) ms"),
                                 ("packed", r"all packed in one buffer\s+([\d.]+) ms"),
                                 ("ours", r"PushPullAsync \+ Wait\s+([\d.]+) ms")):
                    m = re.search(pat, line)
                    if m:
                        vals.setdefault(key, []).append(float(m[1]))
        if vals:
            print(f"\n{n} workers, resnet50 with dist_{backend}: " + "; ".join(
                f"{k} {med(v):.1f} ms ({', '.join(f'{x:.0f}' for x in v)})" for k, v in vals.items()))
EOF
