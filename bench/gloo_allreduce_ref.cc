// hybridps-gloo-ref: the job's KVStore (dist_allreduce, or dist_hybrid) against a plain
// Gloo allreduce loop, in the same processes and the same run. A worker program, started
// by hybridrun:
//
//   scripts/hybridrun -np 2 --backend dist_allreduce -- build/bench/hybridps-gloo-ref
//       --min-bytes 4K --max-bytes 64M --iters 20                 (one command line)
//   scripts/hybridrun -np 2 --backend dist_allreduce -- build/bench/hybridps-gloo-ref
//       --model resnet50 --iters 5
//
// The plain Gloo reference is what a Gloo user writes: its own context (bootstrapped
// through a gloo::rendezvous::FileStore in a directory rank 0 creates and broadcasts
// through the store), a tcp device on the job's interface, and one blocking
// gloo::allreduce (the newer options API, gloo::sum<float>) per tensor, in place.
//
// Sweep: for each size S, --iters timed iterations (after --warmup untimed ones), each one
// plain Gloo allreduce and one of ours (PushPullAsync + Wait, in place), taking turns so
// both see the same load; the medians are printed. Inputs are small integers
// (exact float32 sums) alternating between two patterns; every result is checked, warmup
// included, and a wrong element ends the program with status 1.
//
// --model resnet50: the 161 float32 parameter tensors of ResNet-50 (torchvision order,
// 25,557,032 parameters), submitted like a backward pass: last layer first, priority
// -index, all in flight at once (ours) or one blocking allreduce after the other (plain
// Gloo); and plain Gloo on all parameters packed into one buffer (the ideal fusion,
// packing not timed).
//
// --order blocks: each method's iterations of a size back to back instead of in turns
// (bench/run_mpi_bench.sh times Open MPI the same way).
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/allreduce_patterns.h"
#include "bench/models.h"
#include "common/log.h"
#include "common/options.h"
#include "common/status.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/allreduce/allreduce_store.h"
#include "worker/kvstore.h"

namespace hybridps {
namespace {

using Clock = std::chrono::steady_clock;

enum Method { kPlain, kPacked, kOurs };
constexpr const char* kNames[] = {"gloo", "gloo packed", "ours"};

struct Flags {
  size_t min_bytes = 4 << 10, max_bytes = 64 << 20, factor = 4;
  int iters = 30, warmup = 3;
  // Sizes up to 1 MiB, whose times are bimodal on a loaded machine (see
  // bench/results/allreduce/), run at least this many iterations.
  int small_iters = 200;
  std::string model;  // "" or "resnet50"
  // "turns": the methods take turns iteration by iteration (the same load for both);
  // "blocks": each method's iterations of a size run back to back, as MPI benchmarks
  // time them (no other method's skew between two of ours).
  std::string order = "turns";
  // --gloo 0: ours alone (plain Gloo's columns read 0), e.g. under a profiler.
  bool gloo = true;
};

absl::StatusOr<size_t> ParseBytes(std::string s) {
  size_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'M' || s.back() == 'G')) {
    mult = s.back() == 'K' ? 1 << 10 : s.back() == 'M' ? 1 << 20 : size_t{1} << 30;
    s.pop_back();
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v)) return absl::InvalidArgumentError(absl::StrCat("bad size ", s));
  return v * mult;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    int x = 0;
    if (k == "--min-bytes") {
      ASSIGN_OR_RETURN(f.min_bytes, ParseBytes(v));
    } else if (k == "--max-bytes") {
      ASSIGN_OR_RETURN(f.max_bytes, ParseBytes(v));
    } else if (k == "--model") {
      f.model = v;
    } else if (k == "--order" && (v == "turns" || v == "blocks")) {
      f.order = v;
    } else if (absl::SimpleAtoi(v, &x) && x >= 0 && k == "--factor" && x >= 2) {
      f.factor = static_cast<size_t>(x);
    } else if (absl::SimpleAtoi(v, &x) && x >= 1 && k == "--iters") {
      f.iters = x;
    } else if (absl::SimpleAtoi(v, &x) && x >= 1 && k == "--small-iters") {
      f.small_iters = x;
    } else if (absl::SimpleAtoi(v, &x) && (x == 0 || x == 1) && k == "--gloo") {
      f.gloo = x == 1;
    } else if (absl::SimpleAtoi(v, &x) && x >= 0 && k == "--warmup") {
      f.warmup = x;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("bad flag ", k, " ", v));
    }
  }
  if (argc % 2 == 0) return absl::InvalidArgumentError("flags come in pairs");
  if (!f.model.empty() && f.model != "resnet50") {
    return absl::InvalidArgumentError("--model knows only resnet50");
  }
  if (f.min_bytes < 4 || f.min_bytes > f.max_bytes) return absl::InvalidArgumentError("bad sizes");
  return f;
}

using bench::Median;
using bench::Patterns;
using bench::Quantile;

// OK when work[0, count) is parity p's sum, else the first wrong element.
absl::Status CheckResult(const Patterns& pat, const float* x, size_t count, int p,
                         const std::string& what) {
  const size_t i = pat.FirstWrong(x, count, p);
  if (i == count) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("MISMATCH in ", what, " element ", i, ": got ", x[i],
                                          ", expected ", pat.sum[p][i]));
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

class Bench {
 public:
  Bench(KVStore& kv, std::shared_ptr<gloo::Context> gloo, const Flags& f)
      : kv_(kv), gloo_(std::move(gloo)), f_(f), n_(kv.num_workers()), rank_(kv.rank()) {}

  // One plain Gloo allreduce of x[0, count), in place.
  void Plain(float* x, size_t count) {
    if (n_ == 1 || count == 0) return;
    gloo::AllreduceOptions opts(gloo_);
    opts.setOutput(x, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo::allreduce(opts);
  }

  // One timed operation of method `which` on work[0, count) (input loaded untimed before),
  // checked after the clock stopped.
  absl::StatusOr<double> Time(int which, const std::vector<size_t>& sizes,
                              const std::vector<size_t>& offset, float* work, size_t count,
                              const Patterns& pat, int p, const std::string& name) {
    if (!f_.gloo && which != kOurs) return 0.0;
    pat.Load(work, count, p);
    std::vector<Handle> handles;
    const Clock::time_point t0 = Clock::now();
    if (which == kPlain) {
      for (size_t i = sizes.size(); i-- > 0;) Plain(work + offset[i], sizes[i]);
    } else if (which == kPacked) {
      Plain(work, count);
    } else {
      for (size_t i = sizes.size(); i-- > 0;) {
        TensorView v{work + offset[i], sizes[i], DType::kFloat32};
        ASSIGN_OR_RETURN(Handle h, kv_.PushPullAsync(absl::StrCat(name, "/", i), v, v,
                                                     -static_cast<int>(i)));
        handles.push_back(std::move(h));
      }
      for (const Handle& h : handles) RETURN_IF_ERROR(h.Wait());
    }
    const double us = Micros(Clock::now() - t0);
    RETURN_IF_ERROR(CheckResult(pat, work, count, p, absl::StrCat(kNames[which], " ", name)));
    return us;
  }

  // Runs the methods in turn, iteration by iteration (the order rotating), so that every
  // method sees the same machine load, or with --order blocks each method's iterations
  // back to back; medians per method.
  // Per method: {median, p10}.
  absl::StatusOr<std::vector<std::pair<double, double>>> Interleave(
      const std::vector<int>& methods, const std::vector<size_t>& sizes, float* work,
      const Patterns& pat, const std::string& name, int iters) {
    std::vector<size_t> offset(sizes.size() + 1, 0);
    for (size_t i = 0; i < sizes.size(); ++i) offset[i + 1] = offset[i] + sizes[i];
    std::vector<std::vector<double>> us(methods.size());
    if (f_.order == "blocks") {
      for (size_t m = 0; m < methods.size(); ++m) {
        for (int it = 0; it < f_.warmup + iters; ++it) {
          ASSIGN_OR_RETURN(double t, Time(methods[m], sizes, offset, work, offset.back(), pat,
                                          it % 2, name));
          if (it >= f_.warmup) us[m].push_back(t);
        }
      }
    }
    for (int it = 0; f_.order == "turns" && it < f_.warmup + iters; ++it) {
      for (size_t k = 0; k < methods.size(); ++k) {
        const size_t m = (k + it) % methods.size();
        ASSIGN_OR_RETURN(double t, Time(methods[m], sizes, offset, work, offset.back(), pat,
                                        it % 2, name));
        if (it >= f_.warmup) us[m].push_back(t);
      }
    }
    std::vector<std::pair<double, double>> out;
    for (auto& v : us) out.emplace_back(Median(v), Quantile(v, 0.1));
    return out;
  }

  absl::Status Sweep() {
    const double busf = n_ > 1 ? 2.0 * (n_ - 1) / n_ : 1.0;
    std::vector<float> work(f_.max_bytes / 4);
    const Patterns pat(work.size(), rank_, n_);
    if (rank_ == 0) {
      std::printf(
          "# hybridps-gloo-ref: %s vs plain Gloo allreduce, %d workers, float32, in place\n"
          "# time = median of %d iterations (%d for sizes <= 1 MiB; %d warmup); plain Gloo "
          "and ours %s; every result checked; p10 = 10th percentile\n"
          "# algbw = S / median time (GB/s, 1e9 B); busbw = algbw * 2(n-1)/n = algbw * %.3g; "
          "ours/gloo = our median / plain Gloo median\n#\n"
          "# %11s %10s | %10s %8s %8s %8s | %10s %8s %8s %8s | %9s\n",
          std::string(kv_.type()).c_str(), n_, f_.iters, std::max(f_.iters, f_.small_iters),
          f_.warmup,
          f_.order == "blocks" ? "each back to back" : "take turns iteration by iteration",
          busf, "size(B)", "count", "gloo(us)", "p10", "algbw", "busbw", "ours(us)",
          "p10", "algbw", "busbw", "ours/gloo");
    }
    // dist_allreduce on rank 0: where its time went, per size.
    auto* ar = rank_ == 0 ? dynamic_cast<AllreduceStore*>(&kv_) : nullptr;
    std::string where;
    for (size_t s = f_.min_bytes; s <= f_.max_bytes; s *= f_.factor) {
      const int iters = s <= (1 << 20) ? std::max(f_.iters, f_.small_iters) : f_.iters;
      AllreduceStore::Stats before;
      if (ar) before = ar->stats();
      ASSIGN_OR_RETURN(auto t, Interleave({kPlain, kOurs}, {s / 4}, work.data(), pat,
                                          absl::StrCat("sweep/", s), iters));
      const double g = t[0].first, o = t[1].first;
      if (ar) {
        const AllreduceStore::Stats after = ar->stats();
        const double ops = f_.warmup + iters;
        absl::StrAppendFormat(
            &where,
            "#   %11zu: %.2f rounds (%.2f by the waiting thread, %.2f from the cached plan), "
            "%.2f eager, %.2f two-shot, negotiation %.1f us, execution %.1f us per op\n",
            s, double(after.rounds - before.rounds) / ops,
            double(after.caller_rounds - before.caller_rounds) / ops,
            double(after.cached_plans - before.cached_plans) / ops,
            double(after.eager - before.eager) / ops,
            double(after.two_shots - before.two_shots) / ops,
            absl::ToDoubleMicroseconds(after.negotiating - before.negotiating) / ops,
            absl::ToDoubleMicroseconds(after.executing - before.executing) / ops);
      }
      if (rank_ == 0) {
        std::printf("  %11zu %10zu | %10.2f %8.2f %8.3f %8.3f | %10.2f %8.2f %8.3f %8.3f | %9.2f\n",
                    s, s / 4, g, t[0].second, s / g / 1e3, s / g / 1e3 * busf, o, t[1].second,
                    s / o / 1e3, s / o / 1e3 * busf, o / g);
        std::fflush(stdout);
      }
    }
    if (!where.empty()) {
      std::printf("# dist_allreduce, mean per operation on rank 0 (rounds include idle ticks):\n%s",
                  where.c_str());
      std::fflush(stdout);
    }
    return absl::OkStatus();
  }

  absl::Status Model() {
    const std::vector<size_t> sizes = bench::ResNet50();
    size_t total = 0;
    for (size_t c : sizes) total += c;
    std::vector<float> work(total);
    const Patterns pat(total, rank_, n_);
    auto* ar = dynamic_cast<AllreduceStore*>(&kv_);
    AllreduceStore::Stats before;
    if (ar) before = ar->stats();
    ASSIGN_OR_RETURN(auto q, Interleave({kPlain, kPacked, kOurs}, sizes, work.data(), pat,
                                        "resnet50", f_.iters));
    const double t[3] = {q[0].first, q[1].first, q[2].first};
    if (rank_ != 0) return absl::OkStatus();
    const double bytes = static_cast<double>(total) * 4;
    const int iters = f_.warmup + f_.iters;
    std::printf(
        "# model resnet50: %zu float32 tensors, %zu parameters (%.1f MB), submitted last layer "
        "first; %d workers; medians of %d iterations (%d warmup), the three methods %s; "
        "every result checked\n",
        sizes.size(), total, bytes / 1e6, n_, f_.iters, f_.warmup,
        f_.order == "blocks" ? "each back to back" : "taking turns");
    std::printf("  plain Gloo, one allreduce per tensor        %10.1f ms  (%.3f GB/s algbw)\n",
                t[0] / 1e3, bytes / t[0] / 1e3);
    std::printf("  plain Gloo, all packed in one buffer        %10.1f ms  (%.3f GB/s algbw)\n",
                t[1] / 1e3, bytes / t[1] / 1e3);
    std::printf("  %-14s 161 PushPullAsync + Wait      %10.1f ms  (%.3f GB/s algbw)\n",
                std::string(kv_.type()).c_str(), t[2] / 1e3, bytes / t[2] / 1e3);
    if (ar) {
      const AllreduceStore::Stats after = ar->stats();
      std::printf(
          "  dist_allreduce per iteration: %.1f negotiation rounds (%.1f by waiting threads, "
          "%.1f from the cached plan), %.1f Gloo allreduces, %.1f tensors fused, %.1f tensors "
          "eager; %.1f ms negotiating, %.1f ms executing\n",
          double(after.rounds - before.rounds) / iters,
          double(after.caller_rounds - before.caller_rounds) / iters,
          double(after.cached_plans - before.cached_plans) / iters,
          double(after.allreduces - before.allreduces) / iters,
          double(after.fused_tensors - before.fused_tensors) / iters,
          double(after.eager - before.eager) / iters,
          absl::ToDoubleMilliseconds(after.negotiating - before.negotiating) / iters,
          absl::ToDoubleMilliseconds(after.executing - before.executing) / iters);
    }
    std::printf("  speedup over one allreduce per tensor: %.2fx\n", t[0] / t[2]);
    std::fflush(stdout);
    return absl::OkStatus();
  }

 private:
  KVStore& kv_;
  std::shared_ptr<gloo::Context> gloo_;
  const Flags& f_;
  const int n_, rank_;
};

absl::Status Run(const Flags& f, const Options& options) {
  SetLogLevel(options.log_level);
  ASSIGN_OR_RETURN(auto kv, KVStore::Create(options.backend, options));
  const int rank = kv->rank(), n = kv->num_workers();
  // Rank 0 makes the FileStore directory and tells the others its name.
  std::vector<uint8_t> dir(256, 0);
  if (rank == 0) {
    char tmpl[] = "/tmp/hybridps-gloo-ref-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
    std::memcpy(dir.data(), tmpl, std::strlen(tmpl));
  }
  RETURN_IF_ERROR(
      kv->Broadcast("gloo-ref/dir", TensorView{dir.data(), dir.size(), DType::kUInt8}, 0));
  const std::string path(reinterpret_cast<const char*>(dir.data()));
  std::shared_ptr<gloo::Context> ctx;
  if (n > 1) {
    // HYBRIDPS_INTERFACE as the store reads it: an IPv4 address, or an interface name.
    gloo::transport::tcp::attr attr;
    in_addr ip{};
    if (options.interface.empty()) {
      attr.hostname = "127.0.0.1";
    } else if (inet_pton(AF_INET, options.interface.c_str(), &ip) == 1) {
      attr.hostname = options.interface;
    } else {
      attr.iface = options.interface;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(path);
    auto c = std::make_shared<gloo::rendezvous::Context>(rank, n);
    c->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.op_timeout)));
    c->connectFullMesh(store, device);
    ctx = std::move(c);
  }
  RETURN_IF_ERROR(kv->Barrier());
  if (rank == 0) std::filesystem::remove_all(path);
  Bench bench(*kv, ctx, f);
  RETURN_IF_ERROR(f.model.empty() ? bench.Sweep() : bench.Model());
  RETURN_IF_ERROR(kv->Barrier());
  return kv->Shutdown();
}

}  // namespace
}  // namespace hybridps

int main(int argc, char** argv) {
  auto flags = hybridps::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr,
                 "hybridps-gloo-ref: %s\nusage: hybridps-gloo-ref [--min-bytes 4K] "
                 "[--max-bytes 64M] [--factor 4] [--iters 30] [--small-iters 200] [--warmup 3] "
                 "[--model resnet50] [--order turns|blocks] [--gloo 0|1]\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  auto options = hybridps::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "hybridps-gloo-ref: %s\n", options.status().ToString().c_str());
    return 2;
  }
  try {
    absl::Status s = hybridps::Run(*flags, *options);
    if (!s.ok()) {
      std::fprintf(stderr, "hybridps-gloo-ref: %s\n", s.ToString().c_str());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybridps-gloo-ref: gloo: %s\n", e.what());
    return 1;
  }
  return 0;
}
