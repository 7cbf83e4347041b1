// hybridps-model-bench: the gradient exchange of one training iteration of a real model,
// timed. A worker program, started by hybridrun (bench/cluster_bench.py runs it on the
// emulated cluster):
//
//   scripts/hybridrun -np 2 --servers 2 -- build/bench/hybridps-model-bench
//       --model resnet50 --iters 5                       (one command line)
//
// Each iteration every worker push_pulls every parameter tensor of the model (float32, or
// float16 with --dtype float16,
// element counts in bench/models.h), submitted last layer first as a backward pass
// produces them, with priority -index as MXNet gives them; then waits for all. Workers
// meet at a barrier before each iteration, so the time is the exchange, not their skew.
// Every result is checked against the exact sum (inputs alternate between two patterns
// from one iteration to the next; outputs are poisoned before each), any mismatch ends
// the program with status 1.
//
// --compression 2bit packs the pushes (MXNet's 2bit, dist_hybrid): every input element is
// at least 1, so with a threshold of at most 1 each node sends +threshold per element and
// the result checked is the threshold times the nodes.
//
// Rank 0 prints each iteration and a final line
//   RESULT model=M backend=B workers=N servers=K bytes=S tensors=T median_ms=T min_ms=T
//          max_ms=T iters=I compression=none|2bit dtype=D label=L
// and, with --csv FILE, appends the same figures as a CSV row (header if new).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/models.h"
#include "common/options.h"
#include "common/status.h"
#include "worker/kvstore.h"

namespace hybridps {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model = "resnet50";
  int iters = 5;
  int warmup = 1;
  std::string csv;
  std::string label;  // free text copied into the CSV row (the configuration's name)
  GradientCompression compression;  // --compression 2bit: pushes packed (dist_hybrid)
  DType dtype = DType::kFloat32;     // --dtype float16: the gradients as Horovod's fp16
};

constexpr char kUsage[] =
    "usage: hybridps-model-bench [--model resnet50|vgg16] [--iters 5] [--warmup 1]\n"
    "  [--csv FILE] [--label TEXT] [--compression none|2bit] [--threshold 0.5]\n"
    "  [--dtype float32|float16]\n"
    "Run it under hybridrun: scripts/hybridrun -np N ... -- hybridps-model-bench ...\n";

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "-h" || name == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
    const std::string value = argv[++i];
    if (name == "--model") {
      f.model = value;
    } else if (name == "--iters" || name == "--warmup") {
      int v = 0;
      if (!absl::SimpleAtoi(value, &v) || v < (name == "--iters" ? 1 : 0)) {
        return absl::InvalidArgumentError(absl::StrCat("bad ", name, " '", value, "'"));
      }
      (name == "--iters" ? f.iters : f.warmup) = v;
    } else if (name == "--csv") {
      f.csv = value;
    } else if (name == "--label") {
      f.label = value;
    } else if (name == "--compression") {
      if (value != "none" && value != "2bit") {
        return absl::InvalidArgumentError(absl::StrCat("--compression '", value,
                                                       "': none or 2bit"));
      }
      f.compression.type = value == "2bit" ? Compression::kTwoBit : Compression::kNone;
    } else if (name == "--dtype") {
      if (value != "float32" && value != "float16") {
        return absl::InvalidArgumentError(absl::StrCat("--dtype '", value,
                                                       "': float32 or float16"));
      }
      f.dtype = value == "float16" ? DType::kFloat16 : DType::kFloat32;
    } else if (name == "--threshold") {
      // At most 1: every input element is at least 1, so each node then sends exactly
      // +threshold per element and iteration, which is what the results are checked for.
      if (!absl::SimpleAtof(value, &f.compression.threshold) ||
          !(f.compression.threshold > 0 && f.compression.threshold <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat("--threshold '", value,
                                                       "': a number in (0, 1]"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
  }
  if (f.dtype != DType::kFloat32 && f.compression.type != Compression::kNone) {
    return absl::InvalidArgumentError("--compression 2bit packs float32 gradients only");
  }
  if (f.model != "resnet50" && f.model != "vgg16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model '", f.model, "': resnet50 or vgg16"));
  }
  return f;
}

// Worker r's value at element i on iterations of parity p; sums stay exact in float32.
float Value(int r, size_t i, int p) { return static_cast<float>(1 + r + (i % 3) + 4 * p); }
float Sum(int n, size_t i, int p) {
  return static_cast<float>(n * (1 + static_cast<int>(i % 3) + 4 * p) + n * (n - 1) / 2);
}

absl::Status Run(const Flags& f, const Options& options, KVStore& kv) {
  const std::vector<size_t> counts = f.model == "vgg16" ? bench::Vgg16() : bench::ResNet50();
  std::vector<size_t> first(counts.size() + 1, 0);
  for (size_t j = 0; j < counts.size(); ++j) first[j + 1] = first[j] + counts[j];
  const size_t total = first.back();
  const int rank = kv.rank(), n = kv.num_workers();
  // The values are small integers: exact in float16 too, and so are their sums while they
  // stay within float16's 2048 (7n + n(n-1)/2 at most: up to 58 workers).
  const bool half = f.dtype == DType::kFloat16;
  if (half && 7 * n + n * (n - 1) / 2 > 2048) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype float16 checks exact sums, which float16 holds up to 58 workers, not ", n));
  }
  const size_t es = DTypeSize(f.dtype);
  auto put = [&](std::vector<char>& v, size_t i, float x) {
    if (half) {
      const uint16_t h = FloatToHalf(x);
      std::memcpy(v.data() + i * es, &h, es);
    } else {
      std::memcpy(v.data() + i * es, &x, es);
    }
  };
  auto get = [&](const std::vector<char>& v, size_t i) {
    if (half) {
      uint16_t h;
      std::memcpy(&h, v.data() + i * es, es);
      return HalfToFloat(h);
    }
    float x;
    std::memcpy(&x, v.data() + i * es, es);
    return x;
  };
  std::vector<char> input[2], output(total * es);
  for (int p = 0; p < 2; ++p) {
    input[p].resize(total * es);
    for (size_t i = 0; i < total; ++i) put(input[p], i, Value(rank, i, p));
  }
  std::vector<std::string> names(counts.size());
  for (size_t j = 0; j < counts.size(); ++j) names[j] = absl::StrCat(f.model, ".param", j);
  RETURN_IF_ERROR(kv.SetGradientCompression(f.compression));
  const bool compressed = f.compression.type != Compression::kNone;
  // Compressed, each node (its local ranks' sum, every element at least 1) sends
  // +threshold per element: the result is the threshold times the nodes.
  const float compressed_sum =
      f.compression.threshold * static_cast<float>(n / std::max(1, kv.local_size()));

  std::vector<double> ms;
  std::vector<Handle> handles;
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    const int p = it % 2;
    std::memset(output.data(), 0xff, output.size());  // NaN: never a valid sum
    RETURN_IF_ERROR(kv.Barrier());
    handles.clear();
    const Clock::time_point t0 = Clock::now();
    for (size_t j = counts.size(); j-- > 0;) {
      TensorView in{input[p].data() + first[j] * es, counts[j], f.dtype};
      TensorView out{output.data() + first[j] * es, counts[j], f.dtype};
      ASSIGN_OR_RETURN(Handle h, kv.PushPullAsync(names[j], in, out, -static_cast<int>(j)));
      handles.push_back(std::move(h));
    }
    for (const Handle& h : handles) RETURN_IF_ERROR(h.Wait());
    const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    for (size_t i = 0; i < total; ++i) {
      const float expected = compressed ? compressed_sum : Sum(n, i, p);
      if (get(output, i) != expected) {
        const size_t j = std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1;
        return absl::DataLossError(absl::StrCat(
            "MISMATCH at iteration ", it, ": tensor '", names[j], "' element ", i - first[j],
            " is ", get(output, i), ", the ", compressed ? "compressed" : "exact", " sum is ",
            expected));
      }
    }
    if (it >= f.warmup) ms.push_back(t);
    if (rank == 0) {
      std::printf("%s iteration %d: %.1f ms%s\n", f.model.c_str(), it, t,
                  it < f.warmup ? " (warmup)" : "");
      std::fflush(stdout);
    }
  }
  if (rank != 0) return absl::OkStatus();
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  const double median = m % 2 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
  const size_t bytes = total * es;
  const std::string backend(kv.type());
  std::printf(
      "RESULT model=%s backend=%s workers=%d servers=%d bytes=%zu tensors=%zu "
      "median_ms=%.2f min_ms=%.2f max_ms=%.2f iters=%d compression=%s dtype=%s label=%s\n",
      f.model.c_str(), backend.c_str(), n, options.num_servers, bytes, counts.size(), median,
      sorted.front(), sorted.back(), f.iters, compressed ? "2bit" : "none",
      std::string(DTypeName(f.dtype)).c_str(), f.label.empty() ? "-" : f.label.c_str());
  std::fflush(stdout);
  if (!f.csv.empty()) {
    const bool fresh = access(f.csv.c_str(), F_OK) != 0;
    std::ofstream out(f.csv, std::ios::app);
    if (fresh) {
      out << "label,model,backend,workers,servers,bytes,median_ms,min_ms,max_ms,iters,"
             "compression,dtype\n";
    }
    out << f.label << "," << f.model << "," << backend << "," << n << ","
        << options.num_servers << "," << bytes << "," << median << "," << sorted.front() << ","
        << sorted.back() << "," << f.iters << "," << (compressed ? "2bit" : "none") << ","
        << DTypeName(f.dtype) << "\n";
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", f.csv));
  }
  return absl::OkStatus();
}

// Joins the job described by the environment, runs, leaves.
absl::Status Main(const Flags& f) {
  ASSIGN_OR_RETURN(Options options, OptionsFromEnvironment());
  ASSIGN_OR_RETURN(std::unique_ptr<KVStore> kv, KVStore::Create(options.backend, options));
  if (absl::Status s = Run(f, options, *kv); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("worker ", kv->rank(), ": ", s.message()));
  }
  return kv->Shutdown();
}

}  // namespace
}  // namespace hybridps

int main(int argc, char** argv) {
  auto flags = hybridps::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "hybridps-model-bench: %s\n%s",
                 std::string(flags.status().message()).c_str(), hybridps::kUsage);
    return 2;
  }
  const absl::Status s = hybridps::Main(*flags);
  if (!s.ok()) std::fprintf(stderr, "hybridps-model-bench: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
