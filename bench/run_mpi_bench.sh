#!/usr/bin/env bash
# Open MPI's MPI_Allreduce (shared memory and TCP) beside plain Gloo and dist_allreduce on
# this machine, the same methodology for all (float32, in place, each method's iterations
# back to back, every result checked), run R times, with the medians across runs.
#
#   bench/run_mpi_bench.sh [-r RUNS] [--np "2 4"] [--out DIR] [--build-dir DIR]
#       [--bind core|none] [--sweep-args "..."] [--model-iters N] [--latency-ops K]
#
# Installs Debian's libopenmpi-dev and openmpi-bin (apt-get, as root) when mpicxx cannot
# compile an MPI program, compiles bench/mpi_allreduce_ref.cc into OUT, builds
# hybridps-gloo-ref, -scheduler and -server, then per run (default 3) and worker count N in
# --np (default "2 4"), taking turns (SWEEP = --sweep-args, default "--min-bytes 4K
# --max-bytes 64M --factor 4 --iters 30 --small-iters 200"; B = --bind, default core):
#   mpirun -np N --bind-to B[:overload-allowed] --mca pml ob1 --mca btl self,vader \
#       OUT/hybridps-mpi-ref SWEEP                        (shared memory)
#   mpirun ... --mca btl self,tcp --mca btl_tcp_if_include lo ...  (TCP over loopback)
#   scripts/hybridrun -np N --backend dist_allreduce [--bind-to core] -- hybridps-gloo-ref
#       --order blocks SWEEP             (plain Gloo and dist_allreduce, side by side)
# and the three again with --model resnet50 --iters N (--model-iters, default 10), and
# 4 KiB alone with K operations per run (--latency-ops, default 50000; 0: none), MPI over
# shared memory and dist_allreduce (--gloo 0) taking turns (which goes first swaps each
# run): the sweep's 200 operations are too few at that size on a loaded machine.
# Binding: mpirun binds each rank to one core, hybridrun each worker to floor(cores / N)
# whole cores: the same when there are as many ranks as cores (the 2-core VM, --np 2).
# Logs stay in OUT (default: a new folder under /tmp). Prints per N the per-size medians,
# the ResNet-50 medians of every method and the 4 KiB step's medians and ratios.
set -euo pipefail

runs=3
nps="2 4"
out=""
build_dir=build
bind=core
sweep_args="--min-bytes 4K --max-bytes 64M --factor 4 --iters 30 --small-iters 200"
model_iters=10
latency_ops=50000
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r|--runs|--np|--out|--build-dir|--bind|--sweep-args|--model-iters|--latency-ops)
      [[ $# -ge 2 ]] || { echo "run_mpi_bench: $1 needs a value (see --help)" >&2; exit 2; } ;;
  esac
  case "$1" in
    -r|--runs) runs="$2"; shift 2 ;;
    --np) nps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --bind) bind="$2"; shift 2 ;;
    --sweep-args) sweep_args="$2"; shift 2 ;;
    --model-iters) model_iters="$2"; shift 2 ;;
    --latency-ops) latency_ops="$2"; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_mpi_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$bind" == core || "$bind" == none ]] || {
  echo "run_mpi_bench: --bind is core or none, not '$bind'" >&2
  exit 2
}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "run_mpi_bench: bad -r $runs" >&2; exit 2; }
[[ "$model_iters" =~ ^[1-9][0-9]*$ ]] || {
  echo "run_mpi_bench: bad --model-iters $model_iters" >&2
  exit 2
}
[[ "$latency_ops" =~ ^(0|[1-9][0-9]*)$ ]] || {
  echo "run_mpi_bench: bad --latency-ops $latency_ops" >&2
  exit 2
}
for n in $nps; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "run_mpi_bench: bad worker count '$n' in --np" >&2; exit 2; }
done
read -r -a sweep <<<"$sweep_args"

# --out and --build-dir as given from the caller's folder; then the repo root.
[[ -z "$out" ]] || { mkdir -p "$out" && out="$(cd "$out" && pwd)"; }
[[ ! -d "$build_dir" ]] || build_dir="$(cd "$build_dir" && pwd)"
cd "$(dirname "$0")/.."
root="$PWD"
hybrid_bind=()
if [[ "$bind" == core ]]; then
  hybridrun_help="$(scripts/hybridrun --help 2>&1 || true)"
  if [[ "$hybridrun_help" != *--bind-to* ]]; then
    echo "run_mpi_bench: scripts/hybridrun has no --bind-to here; use --bind none" >&2
    exit 2
  fi
  hybrid_bind=(--bind-to core)
fi
[[ -n "$out" ]] || out="$(mktemp -d /tmp/hybridps-mpi-bench.XXXXXX)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# An MPI compiler that works: install Debian's Open MPI when it does not.
mpi_works() {
  command -v mpicxx >/dev/null && command -v mpirun >/dev/null || return 1
  printf '#include <mpi.h>\nint main(int c, char** v) { MPI_Init(&c, &v); return MPI_Finalize(); }\n' \
    >"$out/mpi-check.cc"
  local rc=0
  mpicxx "$out/mpi-check.cc" -o "$out/mpi-check" >"$out/mpi-check.log" 2>&1 || rc=1
  rm -f "$out/mpi-check.cc" "$out/mpi-check"
  return "$rc"
}
if ! mpi_works; then
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "run_mpi_bench: mpicxx cannot compile an MPI program ($out/mpi-check.log) and this" \
      "is not root on Debian: install libopenmpi-dev and openmpi-bin" >&2
    exit 1
  fi
  echo "mpicxx cannot compile an MPI program: installing libopenmpi-dev openmpi-bin"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y libopenmpi-dev openmpi-bin >"$out/apt.log" 2>&1; then
    apt-get update >>"$out/apt.log" 2>&1 || true
    apt-get install -y libopenmpi-dev openmpi-bin >>"$out/apt.log" 2>&1 || {
      echo "run_mpi_bench: apt-get install libopenmpi-dev openmpi-bin failed; see $out/apt.log" >&2
      exit 1
    }
  fi
  mpi_works || {
    echo "run_mpi_bench: mpicxx still cannot compile an MPI program; see $out/mpi-check.log" >&2
    exit 1
  }
fi
rm -f "$out/mpi-check.log"
mpiref="$out/hybridps-mpi-ref"
mpicxx -O2 -std=c++17 -I"$root" bench/mpi_allreduce_ref.cc -o "$mpiref" || {
  echo "run_mpi_bench: compiling bench/mpi_allreduce_ref.cc failed" >&2
  exit 1
}

if [[ -f "$build_dir/CMakeCache.txt" ]]; then  # a build tree (not a scripts/bundle folder)
  cmake --build "$build_dir" -j2 --target hybridps-gloo-ref hybridps-server hybridps-scheduler \
    >"$out/build.log" 2>&1 || {
    echo "run_mpi_bench: building failed; see $out/build.log" >&2
    exit 1
  }
fi
ref="$build_dir/bench/hybridps-gloo-ref"
[[ -x "$ref" ]] || { echo "run_mpi_bench: no $ref (build it, or see --build-dir)" >&2; exit 1; }

# More ranks than cores (--np 4 on 2 cores) need overload-allowed to bind to cores; pml ob1
# makes Open MPI use the btl named (not UCX, where built in).
mpi_bind=none
[[ "$bind" == none ]] || mpi_bind=core:overload-allowed
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to "$mpi_bind" --mca pml ob1)
shm=(--mca btl "self,vader")
tcp=(--mca btl "self,tcp" --mca btl_tcp_if_include lo)

echo "date $(date -u +%FT%TZ); $(nproc) cores; $(uname -sr); load at start: $(cut -d' ' -f1-3 /proc/loadavg)" \
  | tee "$out/machine.txt"
echo "$(mpirun --version 2>&1 | head -n1); bind $bind; sweep: ${sweep[*]}; model iterations $model_iters" \
  | tee -a "$out/machine.txt"

# Runs a command with its output in a log (the command on its first line); stops the
# benchmark with the end of the log when it fails.
logged() {
  local log="$1"
  shift
  echo "# $*" >"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "run_mpi_bench: failed: $*" >&2
    echo "run_mpi_bench: the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}

for run in $(seq 1 "$runs"); do
  for n in $nps; do
    echo "run $run, $n workers (load $(cut -d' ' -f1 /proc/loadavg))"
    logged "$out/sweep.mpi-shm.n$n.run$run.log" "${mpirun[@]}" -np "$n" "${shm[@]}" "$mpiref" \
      "${sweep[@]}"
    logged "$out/sweep.mpi-tcp.n$n.run$run.log" "${mpirun[@]}" -np "$n" "${tcp[@]}" "$mpiref" \
      "${sweep[@]}"
    logged "$out/sweep.gloo.n$n.run$run.log" scripts/hybridrun -np "$n" --backend dist_allreduce \
      "${hybrid_bind[@]}" -- "$ref" --order blocks "${sweep[@]}"
    logged "$out/resnet.mpi-shm.n$n.run$run.log" "${mpirun[@]}" -np "$n" "${shm[@]}" "$mpiref" \
      --model resnet50 --iters "$model_iters"
    logged "$out/resnet.mpi-tcp.n$n.run$run.log" "${mpirun[@]}" -np "$n" "${tcp[@]}" "$mpiref" \
      --model resnet50 --iters "$model_iters"
    logged "$out/resnet.gloo.n$n.run$run.log" scripts/hybridrun -np "$n" \
      --backend dist_allreduce "${hybrid_bind[@]}" -- "$ref" --order blocks --model resnet50 \
      --iters "$model_iters"
    if [[ "$latency_ops" -gt 0 ]]; then
      latency=(--min-bytes 4K --max-bytes 4K --iters 30 --small-iters "$latency_ops")
      steps=(mpi ours)
      (( run % 2 == 0 )) && steps=(ours mpi)
      for step in "${steps[@]}"; do
        if [[ "$step" == mpi ]]; then
          logged "$out/latency.mpi-shm.n$n.run$run.log" "${mpirun[@]}" -np "$n" "${shm[@]}" \
            "$mpiref" "${latency[@]}"
        else
          logged "$out/latency.gloo.n$n.run$run.log" scripts/hybridrun -np "$n" \
            --backend dist_allreduce "${hybrid_bind[@]}" -- "$ref" --order blocks --gloo 0 \
            "${latency[@]}"
        fi
      done
    fi
  done
done

python3 - "$out" "$nps" <<'EOF'
import glob, re, statistics, sys
out, nps = sys.argv[1], sys.argv[2].split()
med = statistics.median
MPI = re.compile(r"\s+(\d+)\s+\d+ \|\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s*$")
GLOO = re.compile(r"\[worker 0\]\s+(\d+)\s+\d+ \|\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+ \|"
                  r"\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+ \|\s+[\d.]+")

# dist_allreduce alone (--gloo 0: the plain Gloo columns are zero, their ratio inf).
OURS = re.compile(r"\[worker 0\]\s+(\d+)\s+\d+ \|.*\|\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+ \|")

def run_of(f):
    return int(re.search(r"\.run(\d+)\.log$", f)[1])

def sweep(kind, n, step="sweep"):
    """{size: {run: [median us, ...]}} from the logs of one method."""
    rows = {}
    for f in glob.glob(f"{out}/{step}.{kind}.n{n}.run*.log"):
        for line in open(f, errors="replace"):
            m = (GLOO if kind == "gloo" else MPI).match(line)
            if m:
                rows.setdefault(int(m[1]), {})[run_of(f)] = [float(x) for x in m.groups()[1:]]
    return rows

def fmt(vals, spec=".0f"):
    return format(med(vals), spec) if vals else "-"

for n in nps:
    shm, tcp, gloo = sweep("mpi-shm", n), sweep("mpi-tcp", n), sweep("gloo", n)
    nruns = len(glob.glob(f"{out}/sweep.gloo.n{n}.run*.log"))
    print(f"\n{n} workers, sweep: medians across {nruns} runs of each run's median")
    print("| size | MPI shm median µs | MPI tcp median µs | plain Gloo median µs "
          "| dist_allreduce median µs | ours/MPI-shm (per run) | ours/Gloo |")
    print("|---:|---:|---:|---:|---:|---|---:|")
    for size in sorted(set(shm) | set(tcp) | set(gloo)):
        s, t, g = shm.get(size, {}), tcp.get(size, {}), gloo.get(size, {})
        ours_shm = [g[r][1] / s[r][0] for r in sorted(g) if r in s and s[r][0] > 0]
        ours_gloo = [g[r][1] / g[r][0] for r in sorted(g) if g[r][0] > 0]
        per_run = ", ".join(f"{x:.2f}" for x in ours_shm)
        print(f"| {size} | {fmt([v[0] for v in s.values()], '.1f')} "
              f"| {fmt([v[0] for v in t.values()], '.1f')} "
              f"| {fmt([v[0] for v in g.values()], '.1f')} "
              f"| {fmt([v[1] for v in g.values()], '.1f')} "
              f"| {fmt(ours_shm, '.2f')} ({per_run}) | {fmt(ours_gloo, '.2f')} |")
    methods = [("mpi-shm", "MPI shm, one allreduce per tensor", r"MPI, one allreduce per tensor\s+([\d.]+) ms"),
               ("mpi-shm", "MPI shm, all packed in one buffer", r"MPI, all packed in one buffer\s+([\d.]+) ms"),
               ("mpi-tcp", "MPI tcp, one allreduce per tensor", r"MPI, one allreduce per tensor\s+([\d.]+) ms"),
               ("mpi-tcp", "MPI tcp, all packed in one buffer", r"MPI, all packed in one buffer\s+([\d.]+) ms"),
               ("gloo", "plain Gloo, one allreduce per tensor", r"plain Gloo, one allreduce per tensor\s+([\d.]+) ms"),
               ("gloo", "plain Gloo, all packed in one buffer", r"plain Gloo, all packed in one buffer\s+([\d.]+) ms"),
               ("gloo", "dist_allreduce, 161 PushPullAsync + Wait", r"PushPullAsync \+ Wait\s+([\d.]+) ms")]
    print(f"\n{n} workers, resnet50 per iteration: medians across runs of each run's median")
    print("| method | median ms | per run ms |")
    print("|---|---:|---|")
    for kind, label, pat in methods:
        vals = []
        for f in sorted(glob.glob(f"{out}/resnet.{kind}.n{n}.run*.log"), key=run_of):
            for line in open(f, errors="replace"):
                m = re.search(pat, line)
                if m:
                    vals.append(float(m[1]))
        print(f"| {label} | {fmt(vals, '.1f')} | {', '.join(f'{x:.1f}' for x in vals)} |")
    mpi, ours = sweep("mpi-shm", n, "latency"), {}
    for f in glob.glob(f"{out}/latency.gloo.n{n}.run*.log"):
        for line in open(f, errors="replace"):
            m = OURS.match(line)
            if m:
                ours[run_of(f)] = float(m[2])
    if ours:
        m4, o4 = mpi.get(4096, {}), ours
        ratios = [o4[r] / m4[r][0] for r in sorted(o4) if r in m4 and m4[r][0] > 0]
        print(f"\n{n} workers, 4 KiB alone (--latency-ops per run): medians across runs")
        print("| MPI shm median µs | dist_allreduce median µs | ours/MPI-shm (per run) |")
        print("|---:|---:|---|")
        print(f"| {fmt([v[0] for v in m4.values()], '.2f')} | {fmt(list(o4.values()), '.2f')} "
              f"| {fmt(ratios, '.2f')} ({', '.join(f'{x:.2f}' for x in ratios)}) |")
EOF
echo "logs: $out"
