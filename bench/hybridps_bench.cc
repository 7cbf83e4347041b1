// hybridps-bench: nccl-tests-style push_pull sweep of a running hybridps job, measured
// against the transport it runs on. A worker program, started by hybridrun:
//
//   scripts/hybridrun -np 1 --servers 1 -- build/bench/hybridps-bench
//       --min-bytes 4K --max-bytes 64M --iters 20      (one command line)
//
// For each size S every worker fills its input with small integers that depend on its
// rank (so float sums are exact), runs warmup and then timed push_pulls (PushPullAsync +
// Wait, --tensors K handles in flight at once), and checks every result, warmup included,
// against the exact sum; any mismatch ends the program with status 1. The inputs alternate
// between two patterns from one iteration to the next, and out-of-place outputs are
// poisoned before each iteration, so a stale or missing result cannot pass.
//
// Rank 0 prints the table. Before the sweep it measures, in the same process, the
// ceiling our push_pull is read against: a plain ZeroMQ DEALER<->ROUTER echo of S bytes
// over loopback TCP between two threads (socket options as in common/transport.cc), and a
// memcpy of S bytes. After the sweep every worker waits at a barrier while rank 0 samples
// the CPU time of every process of the job for --idle-seconds (nothing is sent then: the
// figure shows busy polling). The last line sums the figures up against the core issue's
// targets.
//
// --gpu 1 (CUDA builds; issue 5's benchmark of dist_hybrid's GPU staging): per size, in
// the same run, the pinned cudaMemcpy bandwidth both ways (rank 0), the push_pull of a
// CPU tensor and the push_pull of a GPU tensor (every worker, GPU local_rank % devices;
// results checked exactly; the CPU and GPU iterations take turns); %ref = GPU push_pull
// bandwidth / the slower of (pinned memcpy, CPU push_pull), target >= 80%:
//
//   scripts/hybridrun -np 1 --servers 1 -- build/bench/hybridps-bench --gpu 1
//       --min-bytes 1M --max-bytes 256M --iters 10 --warmup 2      (one command line)
//
// Run on an H100 (bench/results/gpu-staging/). The code: gpu_staging_bench.cc; the flags, patterns
// and one size's measurement that both use: bench_sweep.h. With -np N (a node of N local
// ranks) it measures the node's GPU reduction, host (default) or HYBRIDPS_GPU_LOCAL_REDUCE=
// nccl; --shared-gpu 1 lets N NCCL ranks share one GPU (a distinct NCCL_HOSTID per process:
// NCCL then connects them over its socket transport, so this checks the path and its
// PCIe/staging cost, not NVLink speed).
#include <dirent.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/options.h"
#include "common/status.h"
#include "worker/kvstore.h"
#include "bench/bench_sweep.h"
#include "bench/idle_cpu.h"
#include "bench/zmq_echo.h"

namespace hybridps {
namespace {

using Clock = std::chrono::steady_clock;
using bench::Buffer;
using bench::ExactLimit;
using bench::Flags;
using bench::GBps;
using bench::IdleFigure;
using bench::ItersFor;
using bench::kKiB;
using bench::kMaxValue;
using bench::kMiB;
using bench::Load;
using bench::MakePatterns;
using bench::JobSwitches;
using bench::MeasureIdle;
using bench::ProcessSwitches;
using bench::MeasurePushPull;
using bench::Micros;
using bench::Patterns;
using bench::RunGpu;
using bench::Sizes;
using bench::Summarize;
using bench::Timing;
using bench::WarmupFor;
using bench::ZmqEcho;

// Sizes of the targets.
constexpr size_t kGoodputSize = 4 * kMiB;
constexpr size_t kLatencySize = 4 * kKiB;
constexpr double kGoodputTargetGBps = 1.6;
constexpr double kLatencyTargetUs = 80;
constexpr double kIdleTargetPct = 1.0;  // "~0%": no process above 1% of a core

constexpr char kUsage[] =
    "usage: hybridps-bench [--backend dist_hybrid] [--min-bytes 4K] [--max-bytes 64M]\n"
    "  [--factor 2] [--iters 20] [--warmup 5] [--small-max-bytes 64K] [--small-iters 1000]\n"
    "  [--dtype float32|float64|float16|bfloat16|int32|int64|uint8] [--tensors 1]\n"
    "  [--inplace 0|1] [--barrier 0|1] [--reference 0|1] [--idle-seconds 3] [--csv FILE]\n"
    "  [--gpu 0|1] [--shared-gpu 0|1]\n"
    "Run it under hybridrun: scripts/hybridrun -np N --servers M -- hybridps-bench ...\n";

// "4096", "4K", "64M", "1G", "4KiB" -> bytes (binary multiples).
absl::StatusOr<size_t> ParseBytes(absl::string_view text) {
  std::string s = absl::AsciiStrToUpper(text);
  for (absl::string_view suffix : {"IB", "B"}) {
    if (s.size() > suffix.size() && absl::EndsWith(s, suffix)) {
      s.resize(s.size() - suffix.size());
      break;
    }
  }
  size_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
        mult = kKiB;
        break;
      case 'M':
        mult = kMiB;
        break;
      case 'G':
        mult = kMiB * kKiB;
        break;
      default:
        break;
    }
    if (mult != 1) s.pop_back();
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size"));
  }
  return static_cast<size_t>(v) * mult;
}

absl::StatusOr<int> ParseInt(absl::string_view name, absl::string_view v, int min) {
  int out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " wants an integer >= ", min, ", not '", v, "'"));
  }
  return out;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i], value;
    if (name == "-h" || name == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
    }
    if (name == "--backend") {
      f.backend = value;
    } else if (name == "--min-bytes") {
      ASSIGN_OR_RETURN(f.min_bytes, ParseBytes(value));
    } else if (name == "--max-bytes") {
      ASSIGN_OR_RETURN(f.max_bytes, ParseBytes(value));
    } else if (name == "--small-max-bytes") {
      ASSIGN_OR_RETURN(f.small_max_bytes, ParseBytes(value));
    } else if (name == "--factor") {
      ASSIGN_OR_RETURN(int v, ParseInt(name, value, 2));
      f.factor = static_cast<size_t>(v);
    } else if (name == "--iters") {
      ASSIGN_OR_RETURN(f.iters, ParseInt(name, value, 1));
    } else if (name == "--warmup") {
      ASSIGN_OR_RETURN(f.warmup, ParseInt(name, value, 0));
    } else if (name == "--small-iters") {
      ASSIGN_OR_RETURN(f.small_iters, ParseInt(name, value, 1));
    } else if (name == "--dtype") {
      ASSIGN_OR_RETURN(f.dtype, ParseDType(value));
    } else if (name == "--tensors") {
      ASSIGN_OR_RETURN(f.tensors, ParseInt(name, value, 1));
    } else if (name == "--inplace") {
      ASSIGN_OR_RETURN(int v, ParseInt(name, value, 0));
      f.inplace = v != 0;
    } else if (name == "--barrier") {
      ASSIGN_OR_RETURN(int v, ParseInt(name, value, 0));
      f.barrier = v != 0;
    } else if (name == "--reference") {
      ASSIGN_OR_RETURN(int v, ParseInt(name, value, 0));
      f.reference = v != 0;
    } else if (name == "--idle-seconds") {
      if (!absl::SimpleAtod(value, &f.idle_seconds) || f.idle_seconds < 0) {
        return absl::InvalidArgumentError(absl::StrCat("bad --idle-seconds '", value, "'"));
      }
    } else if (name == "--csv") {
      f.csv = value;
    } else if (name == "--gpu") {
      ASSIGN_OR_RETURN(int v, ParseInt(name, value, 0));
      f.gpu = v != 0;
    } else if (name == "--shared-gpu") {
      ASSIGN_OR_RETURN(int v, ParseInt(name, value, 0));
      f.shared_gpu = v != 0;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
  }
  if (f.min_bytes == 0 || f.min_bytes > f.max_bytes) {
    return absl::InvalidArgumentError("need 0 < --min-bytes <= --max-bytes");
  }
  return f;
}

// ---- the sweep ------------------------------------------------------------------------

struct Row {
  size_t bytes = 0, count = 0;
  Timing ours;
  // The echo of S bytes as one message; as messages of the job's partition size (only
  // when S is larger); a memcpy of S bytes.
  std::optional<Timing> echo, echo_parts, memcpy;
  // Context switches per iteration (sizes <= small_max_bytes, rank 0): of every thread of
  // every process of the job during our push_pulls (warmup included), and of this process
  // (the echo's two threads) during the echo of S bytes as one message.
  std::optional<double> switches, echo_switches;
};

// The reference figures of every size (rank 0, before the sweep).
absl::Status MeasureReference(const Flags& f, const std::vector<size_t>& sizes,
                              size_t partition_bytes, const Buffer& src, Buffer& dst,
                              std::vector<Row>& rows) {
  ASSIGN_OR_RETURN(auto echo, ZmqEcho::Start());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t s = sizes[k];
    const int iters = ItersFor(f, s), warmup = WarmupFor(f, s);
    std::vector<double> echo_us, parts_us, copy_us;
    const int64_t switches = ProcessSwitches(getpid());
    for (int i = 0; i < warmup + iters; ++i) {
      ASSIGN_OR_RETURN(double us, echo->RoundTripUs(src.get(), s, s));
      if (i >= warmup) echo_us.push_back(us);
    }
    if (s <= f.small_max_bytes) {
      rows[k].echo_switches =
          static_cast<double>(ProcessSwitches(getpid()) - switches) / (warmup + iters);
    }
    if (s > partition_bytes) {
      for (int i = 0; i < warmup + iters; ++i) {
        ASSIGN_OR_RETURN(double us, echo->RoundTripUs(src.get(), s, partition_bytes));
        if (i >= warmup) parts_us.push_back(us);
      }
      rows[k].echo_parts = Summarize(std::move(parts_us));
    }
    for (int i = 0; i < warmup + iters; ++i) {
      const Clock::time_point t0 = Clock::now();
      std::memcpy(dst.get(), src.get(), s);
      const Clock::time_point t1 = Clock::now();
      if (i >= warmup) copy_us.push_back(Micros(t1 - t0));
    }
    if (std::memcmp(dst.get(), src.get(), s) != 0) {
      return absl::InternalError(absl::StrCat("memcpy of ", s, " bytes is wrong"));
    }
    rows[k].echo = Summarize(std::move(echo_us));
    rows[k].memcpy = Summarize(std::move(copy_us));
  }
  return absl::OkStatus();
}

// ---- output ---------------------------------------------------------------------------

void PrintHeader(const Flags& f, absl::string_view backend, int workers, int servers,
                 const Options& o, double busbw_factor) {
  std::printf(
      "# hybridps-bench: %s push_pull, %d workers, %d servers, dtype %s, %d tensor(s) in "
      "flight per size, %s\n"
      "# partition %zu bytes, wire chunk %zu bytes, credit %zu bytes, %u hardware threads "
      "on this host\n"
      "# iterations: %d timed after %d warmup (sizes <= %zu bytes: %d after %d); every "
      "result checked against the exact sum\n"
      "# time   = median per-iteration time (= p50); p99 (nearest rank) where >= 100 "
      "iterations were timed (sizes <= %zu bytes)\n"
      "# algbw  = S / time (GB/s, 1 GB = 1e9 bytes); busbw = algbw * %.3g (%s)\n"
      "# goodput = bytes pushed per second per worker = S / time\n",
      std::string(backend).c_str(), workers, servers, std::string(DTypeName(f.dtype)).c_str(),
      f.tensors, f.inplace ? "in-place" : "out-of-place", o.partition_bytes,
      o.wire_chunk_bytes, o.credit_bytes,
      std::thread::hardware_concurrency(), f.iters, f.warmup, f.small_max_bytes,
      std::max(f.iters, f.small_iters), std::max(f.warmup, f.small_iters / 10), f.small_max_bytes,
      busbw_factor, backend == "dist_allreduce" ? "allreduce: 2(n-1)/n" : "push_pull: factor 1");
  if (f.reference) {
    std::printf(
        "# reference (rank 0, before the sweep, same iterations and statistics), the "
        "transport ceiling: a plain ZeroMQ DEALER->ROUTER->DEALER echo over loopback TCP "
        "between two threads of this process\n"
        "#   echo   = S bytes sent as one message, echoed back once whole; echo_bw = S / echo "
        "time\n"
        "#   echoP  = S bytes sent at once as messages of the partition size (%zu bytes), each "
        "echoed as it arrives, like push_pull's partitions (only where S > partition)\n"
        "#   %%ref   = best echo time / our time;  memcpy = S / median time of a memcpy of S "
        "bytes\n",
        o.partition_bytes);
  }
  std::printf("#\n# %11s %10s %8s %10s %9s %8s %8s %8s |%10s %9s %8s %10s %8s %6s %8s\n", "size(B)",
              "count", "dtype", "time(us)", "p99(us)", "algbw", "busbw", "goodput", "echo(us)",
              "echo_p99", "echo_bw", "echoP(us)", "echoP_bw", "%ref", "memcpy");
  std::fflush(stdout);
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

void PrintRow(const Flags& f, const Row& r, double busbw_factor) {
  const bool p99 = r.ours.samples >= 100;
  const double bw = GBps(r.bytes, r.ours.median_us);
  std::string ref =
      absl::StrFormat("%10s %9s %8s %10s %8s %6s %8s", "-", "-", "-", "-", "-", "-", "-");
  if (r.echo && r.memcpy) {
    double best = r.echo->median_us;
    std::string parts = absl::StrFormat("%10s %8s", "-", "-");
    if (r.echo_parts) {
      best = std::min(best, r.echo_parts->median_us);
      parts = absl::StrFormat("%10.1f %8.3f", r.echo_parts->median_us,
                              GBps(r.bytes, r.echo_parts->median_us));
    }
    ref = absl::StrFormat("%10.1f %9s %8.3f %s %6.1f %8.2f", r.echo->median_us,
                          r.echo->samples >= 100 ? Fixed(r.echo->p99_us, 1) : "-",
                          GBps(r.bytes, r.echo->median_us), parts, 100 * best / r.ours.median_us,
                          GBps(r.bytes, r.memcpy->median_us));
  }
  std::printf("  %11zu %10zu %8s %10.1f %9s %8.3f %8.3f %8.3f |%s\n", r.bytes, r.count,
              std::string(DTypeName(f.dtype)).c_str(), r.ours.median_us,
              p99 ? Fixed(r.ours.p99_us, 1).c_str() : "-", bw, bw * busbw_factor, bw, ref.c_str());
  std::fflush(stdout);
}

const Row* FindRow(const std::vector<Row>& rows, size_t bytes) {
  for (const Row& r : rows) {
    if (r.bytes == bytes) return &r;
  }
  return nullptr;
}

void PrintSummary(const std::vector<Row>& rows, const std::vector<IdleFigure>& idle,
                  bool idle_measured) {
  std::string goodput = "4 MiB goodput n/a (not in the sweep)";
  if (const Row* r = FindRow(rows, kGoodputSize)) {
    const double g = GBps(r->bytes, r->ours.median_us);
    goodput = absl::StrFormat("4 MiB goodput %.3f GB/s (target >= %.1f: %s)", g, kGoodputTargetGBps,
                              g >= kGoodputTargetGBps ? "met" : "NOT MET");
  }
  std::string latency = "4 KiB latency n/a (not in the sweep)";
  if (const Row* r = FindRow(rows, kLatencySize)) {
    latency = absl::StrFormat("4 KiB latency p50 %.1f us, p99 %.1f us (target p50 <= %.0f: %s)",
                              r->ours.median_us, r->ours.p99_us, kLatencyTargetUs,
                              r->ours.median_us <= kLatencyTargetUs ? "met" : "NOT MET");
  }
  std::string cpu = "idle CPU not measured";
  if (idle_measured) {
    double max_pct = 0, total = 0;
    for (const IdleFigure& fig : idle) {
      max_pct = std::max(max_pct, fig.cpu_pct);
      total += fig.cpu_pct;
    }
    cpu = absl::StrFormat(
        "idle CPU max %.2f%%, total %.2f%% over %zu processes (target ~0, "
        "each <= %.0f%%: %s)",
        max_pct, total, idle.size(), kIdleTargetPct,
        !idle.empty() && max_pct <= kIdleTargetPct ? "met" : "NOT MET");
  }
  std::printf("# SUMMARY: %s | %s | %s\n", goodput.c_str(), latency.c_str(), cpu.c_str());
  std::fflush(stdout);
}

absl::Status WriteCsv(const std::string& path, const std::vector<Row>& rows,
                      const std::vector<IdleFigure>& idle) {
  std::ofstream out(path);
  out << "kind,bytes,count,time_us,p99_us,goodput_gbps,echo_us,echo_p99_us,echo_gbps,"
         "echop_us,echop_gbps,memcpy_gbps\n";
  for (const Row& r : rows) {
    out << "pushpull," << r.bytes << "," << r.count << "," << r.ours.median_us << ","
        << r.ours.p99_us << "," << GBps(r.bytes, r.ours.median_us) << ",";
    if (r.echo && r.memcpy) {
      out << r.echo->median_us << "," << r.echo->p99_us << "," << GBps(r.bytes, r.echo->median_us)
          << ",";
      if (r.echo_parts) {
        out << r.echo_parts->median_us << "," << GBps(r.bytes, r.echo_parts->median_us);
      } else {
        out << ",";
      }
      out << "," << GBps(r.bytes, r.memcpy->median_us);
    } else {
      out << ",,,,,";
    }
    out << "\n";
  }
  out << "kind,process,pid,cpu_pct,run_pct,wakeups_per_s\n";
  for (const IdleFigure& f : idle) {
    out << "idle," << f.proc.label << "," << f.proc.pid << "," << f.cpu_pct << "," << f.run_pct
        << "," << f.wakeups_per_s << "\n";
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status Run(const Flags& f, const Options& options, absl::string_view backend, KVStore& kv) {
  const int rank = kv.rank(), n = kv.num_workers();
  if (static_cast<int64_t>(n) * kMaxValue > ExactLimit(f.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("with ", n, " workers the sums exceed what ", DTypeName(f.dtype),
                     " holds exactly (", ExactLimit(f.dtype), "); use fewer workers or float32"));
  }
  if (f.gpu) return RunGpu(f, kv);
  const std::vector<size_t> sizes = Sizes(f);
  if (sizes.empty()) return absl::InvalidArgumentError("no size to measure");
  const size_t max_bytes = sizes.back(), es = DTypeSize(f.dtype);
  const Patterns pat = MakePatterns(f.dtype, max_bytes / es, rank, n);
  Buffer work(max_bytes);
  const double busbw_factor = backend == "dist_allreduce" ? 2.0 * (n - 1) / std::max(n, 1) : 1.0;

  std::vector<Row> rows(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    rows[k].bytes = sizes[k];
    rows[k].count = sizes[k] / es;
  }
  if (rank == 0 && f.reference) {
    std::printf("# measuring the ZeroMQ echo and memcpy reference...\n");
    std::fflush(stdout);
    RETURN_IF_ERROR(MeasureReference(f, sizes, options.partition_bytes, *pat.input[0], work, rows));
  }
  RETURN_IF_ERROR(kv.Barrier());
  if (rank == 0) PrintHeader(f, backend, n, options.num_servers, options, busbw_factor);
  const char* port = std::getenv("HYBRIDPS_SCHEDULER_PORT");
  const std::string job_port = port ? port : "";
  for (Row& r : rows) {
    const bool count = rank == 0 && r.bytes <= f.small_max_bytes;
    const int64_t switches = count ? JobSwitches(job_port, options.job_token) : 0;
    ASSIGN_OR_RETURN(r.ours, MeasurePushPull(f, kv, r.bytes, pat, work));
    if (count) {
      r.switches = static_cast<double>(JobSwitches(job_port, options.job_token) - switches) /
                   (ItersFor(f, r.bytes) + WarmupFor(f, r.bytes));
    }
    if (rank == 0) PrintRow(f, r, busbw_factor);
  }
  if (rank == 0 && !rows.empty() && rows[0].switches) {
    std::printf(
        "#\n# context switches per round trip (every thread; %s), sizes <= %zu bytes:\n"
        "# %11s %12s %12s\n",
        "push_pull: all processes of the job, echo: its two threads", f.small_max_bytes,
        "size(B)", "push_pull", "echo");
    for (const Row& r : rows) {
      if (!r.switches) continue;
      std::printf("  %11zu %12.2f %12s\n", r.bytes, *r.switches,
                  r.echo_switches ? absl::StrFormat("%.2f", *r.echo_switches).c_str() : "-");
    }
  }

  // Idle: everyone waits at a barrier while rank 0 watches the job's processes.
  std::vector<IdleFigure> idle;
  const bool measure_idle = f.idle_seconds > 0;
  if (measure_idle) {
    RETURN_IF_ERROR(kv.Barrier());
    if (rank == 0) {
      idle = MeasureIdle(f.idle_seconds, port ? port : "", options.job_token);
      std::printf(
          "#\n# idle CPU over %.1f s after a barrier, nothing sent (processes whose environment "
          "has HYBRIDPS_SCHEDULER_PORT=%s, and the job's scheduler)\n"
          "# cpu%% = utime+stime (/proc/PID/stat) / wall; run%% = same from "
          "/proc/PID/task/*/schedstat (ns); wakeups/s = context switches of all threads\n"
          "# %8s  %-36s %7s %7s %10s\n",
          f.idle_seconds, port ? port : "(unset)", "pid", "process", "cpu%", "run%", "wakeups/s");
      for (const IdleFigure& fig : idle) {
        std::printf("  %8d  %-36s %7.2f %7.3f %10.1f\n", fig.proc.pid, fig.proc.label.c_str(),
                    fig.cpu_pct, fig.run_pct, fig.wakeups_per_s);
      }
      if (idle.empty()) std::printf("  (no process of this job found under /proc)\n");
    }
    RETURN_IF_ERROR(kv.Barrier());
  }
  if (rank == 0) {
    PrintSummary(rows, idle, measure_idle);
    if (!f.csv.empty()) RETURN_IF_ERROR(WriteCsv(f.csv, rows, idle));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace hybridps

int main(int argc, char** argv) {
  auto flags = hybridps::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "hybridps-bench: %s\n%s", std::string(flags.status().message()).c_str(),
                 hybridps::kUsage);
    return 2;
  }
  if (flags->shared_gpu) {  // before anything can initialise NCCL
    const std::string host = absl::StrCat("hybridps-bench-pid-", getpid());
    setenv("NCCL_HOSTID", host.c_str(), 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  }
  auto options = hybridps::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "hybridps-bench: %s\n", options.status().ToString().c_str());
    return 2;
  }
  const std::string backend = flags->backend.empty() ? options->backend : flags->backend;
  auto kv = hybridps::KVStore::Create(backend, *options);
  if (!kv.ok()) {
    std::fprintf(stderr, "hybridps-bench: cannot join the job: %s\n",
                 kv.status().ToString().c_str());
    return 1;
  }
  absl::Status s = hybridps::Run(*flags, *options, backend, **kv);
  if (!s.ok()) {
    std::fprintf(stderr, "hybridps-bench: worker %d: %s\n", (*kv)->rank(), s.ToString().c_str());
    return 1;
  }
  s = (*kv)->Shutdown();
  if (!s.ok()) {
    std::fprintf(stderr, "hybridps-bench: shutdown: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
