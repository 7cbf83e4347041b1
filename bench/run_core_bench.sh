#!/usr/bin/env bash
# The core push_pull benchmark, run R times, with the medians across runs of its figures.
#
#   bench/run_core_bench.sh [-r RUNS] [--with-2x2] [--out DIR] [--build-dir DIR]
#                           [-- EXTRA hybridps-bench FLAGS]
#
# Standard configuration, run RUNS times (default 5):
#   scripts/hybridrun -np 1 --servers 1 -- build/bench/hybridps-bench \
#       --min-bytes 4K --max-bytes 64M --iters 20 --csv OUT/1w1s.runN.csv
# and with --with-2x2 the same with -np 2 --servers 2, alternating with it run by run.
# Builds hybridps-bench, hybridps-server and hybridps-scheduler first (incremental, -j2).
# Every run's log and CSV stay in OUT (default: a new folder under /tmp). Prints a Markdown
# table of the per-size medians (and min..max across runs of the key figures). Exit
# status: non-zero when the build or any run failed (a failed result check fails the run).
set -euo pipefail

runs=5
with_2x2=0
out=""
build_dir=build
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r|--runs) runs="$2"; shift 2 ;;
    --with-2x2) with_2x2=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run_core_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "run_core_bench: bad run count '$runs'" >&2; exit 2; }

cd "$(dirname "$0")/.."
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S . -B "$build_dir" >/dev/null
fi
cmake --build "$build_dir" -j2 --target hybridps-bench hybridps-server hybridps-scheduler \
  >/dev/null
bench="$build_dir/bench/hybridps-bench"
[[ -n "$out" ]] || out="$(mktemp -d /tmp/hybridps-core-bench.XXXXXX)"
mkdir -p "$out"

configs=("1 1")
[[ "$with_2x2" == 1 ]] && configs+=("2 2")
base_flags=(--min-bytes 4K --max-bytes 64M --iters 20)

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(nproc) cores, $(uname -sr), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
} | tee "$out/machine.txt"

# Raw loopback TCP, one stream, one direction (iperf3, when installed): the ceiling the
# machine puts under everything above. push_pull moves S each way at once.
tcp_ref() {
  command -v iperf3 >/dev/null || return 0
  local port=$((20000 + RANDOM % 20000))
  iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
  sleep 0.3
  iperf3 -c 127.0.0.1 -p "$port" -t 2 -f g 2>/dev/null |
    awk '/receiver/ {print "loopback TCP (iperf3, one stream): " $(NF-2) " Gbit/s = " $(NF-2)/8 " GB/s"}'
  wait 2>/dev/null || true
}

failed=0
for ((i = 1; i <= runs; i++)); do
  tcp_ref | tee -a "$out/tcp_ref.txt"
  for cfg in "${configs[@]}"; do
    read -r nw ns <<<"$cfg"
    name="${nw}w${ns}s"
    cmd=(scripts/hybridrun -np "$nw" --servers "$ns" -- "$bench" "${base_flags[@]}"
         "${extra[@]}" --csv "$out/$name.run$i.csv")
    echo "run $i/$runs $name (load average before: $(cut -d' ' -f1 /proc/loadavg)): ${cmd[*]}"
    if "${cmd[@]}" >"$out/$name.run$i.log" 2>&1; then
      grep -h "SUMMARY" "$out/$name.run$i.log" | sed 's/^\[worker 0\] # /    /'
    else
      rc=$?
      failed=1
      echo "    FAILED (exit $rc); the end of $out/$name.run$i.log:"
      tail -5 "$out/$name.run$i.log" | sed 's/^/    /'
    fi
  done
done

python3 - "$out" "$runs" "${configs[@]}" <<'EOF'
"""Medians across runs of every figure of hybridps-bench's CSV files."""
import csv
import statistics
import sys
from pathlib import Path

out, runs, configs = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]


def load(path: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    rows: list[dict[str, str]] = []
    idle: list[dict[str, str]] = []
    header: list[str] = []
    for line in csv.reader(path.open()):
        if line and line[0] == "kind":
            header = line
        elif line:
            (rows if line[0] == "pushpull" else idle).append(dict(zip(header, line)))
    return rows, idle


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(v: float, digits: int) -> str:
    return "-" if v != v else f"{v:.{digits}f}"


def size_name(b: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


for cfg in configs:
    nw, ns = cfg.split()
    name = f"{nw}w{ns}s"
    files = sorted(out.glob(f"{name}.run*.csv"))
    if not files:
        print(f"\n{name}: no successful run")
        continue
    per_size: dict[int, dict[str, list[float]]] = {}
    idle_max: list[float] = []
    idle_proc: dict[str, list[float]] = {}
    for f in files:
        rows, idle = load(f)
        for r in rows:
            d = per_size.setdefault(int(r["bytes"]), {})
            for k, v in r.items():
                if k not in ("kind", "bytes", "count") and v != "":
                    d.setdefault(k, []).append(float(v))
        if idle:
            idle_max.append(max(float(r["cpu_pct"]) for r in idle))
        for r in idle:
            p = idle_proc.setdefault(r["process"], [])
            p.append(float(r["cpu_pct"]))
            idle_proc.setdefault(r["process"] + " run%", []).append(float(r["run_pct"]))
            idle_proc.setdefault(r["process"] + " wakeups/s", []).append(
                float(r["wakeups_per_s"]))

    print(f"\n### {nw} worker(s) + {ns} server(s): medians of {len(files)} of {runs} runs\n")
    print("| size | push_pull time (us) | p99 (us) | goodput = algbw = busbw (GB/s) "
          "| min..max goodput | echo (us) | echo p99 (us) | echo_bw (GB/s) "
          "| echoP_bw (GB/s) | memcpy (GB/s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in sorted(per_size):
        d = per_size[b]
        small = b <= 64 * 1024
        g = d.get("goodput_gbps", [])
        print(f"| {size_name(b)} | {fmt(med(d.get('time_us', [])), 1)} "
              f"| {fmt(med(d.get('p99_us', [])), 1) if small else '-'} "
              f"| {fmt(med(g), 3)} | {fmt(min(g), 3)}..{fmt(max(g), 3)} "
              f"| {fmt(med(d.get('echo_us', [])), 1)} "
              f"| {fmt(med(d.get('echo_p99_us', [])), 1) if small else '-'} "
              f"| {fmt(med(d.get('echo_gbps', [])), 3)} "
              f"| {fmt(med(d.get('echop_gbps', [])), 3)} "
              f"| {fmt(med(d.get('memcpy_gbps', [])), 2)} |")

    g4 = per_size.get(4 << 20, {}).get("goodput_gbps", [])
    l4 = per_size.get(4 << 10, {})
    print(f"\nKEY {name}: 4 MiB goodput median {fmt(med(g4), 3)} GB/s "
          f"(runs {', '.join(fmt(x, 3) for x in g4)}; target >= 1.6)")
    print(f"KEY {name}: 4 KiB p50 median {fmt(med(l4.get('time_us', [])), 1)} us "
          f"(runs {', '.join(fmt(x, 1) for x in l4.get('time_us', []))}; target <= 80), "
          f"p99 median {fmt(med(l4.get('p99_us', [])), 1)} us")
    print(f"KEY {name}: reference 4 MiB echo {fmt(med(per_size.get(4 << 20, {}).get('echo_gbps', [])), 3)} GB/s, "
          f"4 KiB echo p50 {fmt(med(l4.get('echo_us', [])), 1)} us "
          f"p99 {fmt(med(l4.get('echo_p99_us', [])), 1)} us")
    print(f"KEY {name}: idle CPU, largest process per run: "
          f"{', '.join(fmt(x, 2) for x in idle_max)} % (median {fmt(med(idle_max), 2)} %)")
    for proc in sorted(k for k in idle_proc if not k.endswith(("run%", "wakeups/s"))):
        print(f"    {proc}: cpu% median {fmt(med(idle_proc[proc]), 2)}, "
              f"run% median {fmt(med(idle_proc[proc + ' run%']), 3)}, "
              f"wakeups/s median {fmt(med(idle_proc[proc + ' wakeups/s']), 1)}")
EOF
echo
echo "logs and CSV files: $out"
exit "$failed"
