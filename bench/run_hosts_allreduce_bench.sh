#!/usr/bin/env bash
# dist_allreduce against plain Gloo across hosts: every worker on a host of its own, the
# hosts emulated on this machine (scripts/emulated-cluster: network namespaces, each link
# shaped with tc), so both go through Gloo over TCP. Needs root. Every figure comes from
# hybridps-gloo-ref (ours and plain Gloo taking turns iteration by iteration in the same
# processes, every result checked); prints, per link and worker count, the medians over
# the runs and the range of the runs' ratios.
#
#   sudo bench/run_hosts_allreduce_bench.sh [-r RUNS] [--np "2 4"] [--bandwidth "1gbit none"]
#       [--out DIR] [--build-dir DIR] [--sysctl KEY=VALUE ...]
#
# Per run (default 3), bandwidth ("none": the namespaces' links unshaped) and worker
# count, taking turns:
#   scripts/emulated-cluster run --hosts N --bandwidth B -- scripts/hybridrun -np N \
#       -H h0:1,...  --network-interface hps-net --remote-shell ... --backend dist_allreduce \
#       -- hybridps-gloo-ref --min-bytes 4K --max-bytes 16M --factor 4 --iters 20 --small-iters 100
# --sysctl (repeatable) is set in every emulated host, e.g.
# net.ipv4.tcp_congestion_control=cubic (the hosts otherwise inherit this machine's).
# Logs stay in OUT (default: a new folder under /tmp).
set -euo pipefail

runs=3
nps="2 4"
bandwidths="1gbit none"
out=""
build_dir=build
sysctls=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r|--runs) runs="$2"; shift 2 ;;
    --np) nps="$2"; shift 2 ;;
    --bandwidth) bandwidths="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --sysctl)
      [[ $# -ge 2 ]] || { echo "run_hosts_allreduce_bench: --sysctl needs KEY=VALUE" >&2; exit 2; }
      sysctls+=(--sysctl "$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_hosts_allreduce_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
build_dir="$(cd "$build_dir" && pwd)"  # absolute: the job runs from the namespaces
if [[ -f "$build_dir/CMakeCache.txt" ]]; then
  cmake --build "$build_dir" -j2 --target hybridps-gloo-ref hybridps-server hybridps-scheduler \
    >/dev/null
fi
ref="$build_dir/bench/hybridps-gloo-ref"
[[ -n "$out" ]] || out="$(mktemp -d /tmp/hybridps-hosts-bench.XXXXXX)"
mkdir -p "$out"
echo "date $(date -u +%FT%TZ); $(nproc) cores; $(uname -sr);" \
  "load at start: $(cut -d' ' -f1-3 /proc/loadavg);" \
  "this machine's congestion control: $(sysctl -n net.ipv4.tcp_congestion_control);" \
  "set in the hosts: ${sysctls[*]:-nothing}" \
  | tee "$out/machine.txt"

# Run inside the emulated cluster: one worker per emulated host.
cat >"$out/job.sh" <<EOF
#!/usr/bin/env bash
n=\$1; shift
hosts=\$(echo "\$EMU_HOSTS" | tr ',' '\n' | head -n "\$n" | sed 's/\$/:1/' | paste -sd,)
exec "$(pwd)/.venv/bin/python" "$(pwd)/scripts/hybridrun" -np "\$n" -H "\$hosts" \
  --network-interface "\$EMU_IFACE" --remote-shell "\$EMU_REMOTE_SHELL" \
  --backend dist_allreduce --bin-dir "$build_dir" -- "$ref" "\$@"
EOF
chmod +x "$out/job.sh"

for run in $(seq 1 "$runs"); do
  for bw in $bandwidths; do
    for n in $nps; do
      echo "run $run, $bw, $n workers (load $(cut -d' ' -f1 /proc/loadavg))"
      scripts/emulated-cluster run --hosts "$n" --bandwidth "$bw" "${sysctls[@]}" -- \
        "$out/job.sh" "$n" \
        --min-bytes 4K --max-bytes 16M --factor 4 --iters 20 --small-iters 100 \
        >"$out/$bw.n$n.run$run.log" 2>&1 || echo "  failed: see $out/$bw.n$n.run$run.log"
    done
  done
done

python3 - "$out" "$bandwidths" "$nps" <<'EOF'
import glob, re, statistics, sys
out, bws, nps = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
row = re.compile(r"\[worker 0@\S+\]\s+(\d+)\s+\d+ \|\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+ \|"
                 r"\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+ \|\s+([\d.]+)")
for bw in bws:
    for n in nps:
        rows = {}
        files = sorted(glob.glob(f"{out}/{bw}.n{n}.run*.log"))
        for f in files:
            for line in open(f):
                m = row.match(line)
                if m:
                    rows.setdefault(int(m.group(1)), []).append(
                        (float(m.group(2)), float(m.group(3)), float(m.group(4))))
        print(f"\n{bw}, {n} workers ({len(files)} runs)\n")
        print("| size | plain Gloo (µs) | dist_allreduce (µs) | ours / Gloo: median (range) |")
        print("|---|---:|---:|---|")
        for size in sorted(rows):
            g = statistics.median(r[0] for r in rows[size])
            o = statistics.median(r[1] for r in rows[size])
            ratios = [r[2] for r in rows[size]]
            name = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
            print(f"| {name} | {g:.0f} | {o:.0f} | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) |")
EOF
