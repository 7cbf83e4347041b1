// The shared part of hybridps-bench: flags, exact-sum patterns, timing, and one size's
// push_pull measurement (bench_sweep.cc); the GPU staging benchmark (gpu_staging_bench.cc).
// hybridps_bench.cc holds the sweep's reference, its output and main().
#ifndef HYBRIDPS_BENCH_BENCH_SWEEP_H_
#define HYBRIDPS_BENCH_BENCH_SWEEP_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "worker/kvstore.h"

namespace hybridps::bench {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;
// Each worker contributes 1..kMaxValue per element.
constexpr int kMaxValue = 8;

struct Flags {
  std::string backend;  // empty: the job's HYBRIDPS_BACKEND
  size_t min_bytes = 4 * kKiB;
  size_t max_bytes = 64 * kMiB;
  size_t factor = 2;
  int iters = 20;
  int warmup = 5;
  // Sizes up to small_max_bytes run max(iters, small_iters) iterations, enough for a p99.
  size_t small_max_bytes = 64 * kKiB;
  int small_iters = 1000;
  DType dtype = DType::kFloat32;
  int tensors = 1;
  bool inplace = false;
  // A barrier of all workers before each iteration, outside the timed region: every rank
  // starts its push_pull together, so one rank's untimed work (checking the last result)
  // does not count in another's time.
  bool barrier = false;
  bool reference = true;
  double idle_seconds = 3;
  std::string csv;  // rank 0 writes the figures there too
  bool gpu = false;  // issue 5's GPU staging benchmark instead of the sweep
  bool shared_gpu = false;  // several NCCL ranks on one GPU (a distinct NCCL_HOSTID each)
};

struct Timing {
  double median_us = 0;
  double p99_us = 0;  // nearest rank
  double min_us = 0;
  size_t samples = 0;
};

// Median, p99 (nearest rank) and minimum of the samples.
Timing Summarize(std::vector<double> us);

// Bytes per microsecond are 1e6 bytes per second: / 1e3 gives GB/s (1 GB = 1e9 bytes).
double GBps(size_t bytes, double us);

// Owns `bytes` of 64-byte-aligned memory.
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : data_(static_cast<unsigned char*>(
            std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64)))) {
    std::memset(data_.get(), 0, bytes);  // fault the pages in before anything is timed
  }
  unsigned char* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> data_;
};

// Largest sum of small integers the type holds exactly (and, for uint8, below the
// poison byte 0xff).
int64_t ExactLimit(DType t);
// The element at `p` as a double.
double Load(DType t, const unsigned char* p);

// This worker's inputs and the exact sums, for both parities, over the largest size;
// every size uses a prefix.
struct Patterns {
  std::unique_ptr<Buffer> input[2], expected[2];
};
// `count` elements of worker `rank`'s inputs and of the exact sums of `num_workers`.
Patterns MakePatterns(DType t, size_t count, int rank, int num_workers);

// The sweep's sizes; the iterations and warmup of a size.
std::vector<size_t> Sizes(const Flags& f);
int ItersFor(const Flags& f, size_t bytes);
int WarmupFor(const Flags& f, size_t bytes);

// The push_pull figures of one size; checks every iteration's result.
// `samples`: where given, the timed iterations' microseconds are appended there too;
// `first_it`: the number of the first iteration (the input pattern alternates with it).
absl::StatusOr<Timing> MeasurePushPull(const Flags& f, KVStore& kv, size_t bytes,
                                       const Patterns& pat, Buffer& work,
                                       std::vector<double>* samples = nullptr,
                                       int first_it = 0);

// --gpu 1: issue 5's benchmark of dist_hybrid's GPU staging (gpu_staging_bench.cc).
absl::Status RunGpu(const Flags& f, KVStore& kv);

}  // namespace hybridps::bench

#endif  // HYBRIDPS_BENCH_BENCH_SWEEP_H_
