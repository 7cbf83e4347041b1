// Update throughput of every optimizer rule on one 4 MiB float32 partition (the server's
// default partition size), on one core, beside memcpy of the same 4 MiB in the same run.
//
// bytes_per_second = 4 MiB of weights updated * iterations / time (SetBytesProcessed =
// weight bytes). A rule moves more than that through memory: SGD with momentum reads w,
// g, mom and writes w, mom (5 x 4 MiB), Adam 7 x 4 MiB; memcpy reads and writes 4 MiB.
// LAMB and LARS run both phases (Prepare, FinishNorms, Apply) per iteration. The label
// names the ISA the kernels dispatched to. The *_fp16 variants update float16 weights
// through a float32 master copy (4 MiB of float32 master = 2 MiB of float16 weights;
// bytes counted are the float16 weight bytes).
//
// of_memcpy (counter): the same ratio measured inside each rule's own run, so that both
// sides see the same load: every 16th iteration (outside the benchmark's timing) copies
// the 4 MiB 16 times (in blocks, so both sides run mostly from warm caches), and
// of_memcpy = (weight bytes / thread CPU time of the updates) /
// (4 MiB / thread CPU time of the copies). On a shared machine the load changes between
// one benchmark and the next; BM_Memcpy, timed once before the rules, then moves every
// ratio taken against it by tens of percent (see bench/results/optimizer-kernels/).
//
// Verification: after timing, the first 1024 elements are replayed from their initial
// values on the portable kernels, with the same update counts (and, for LAMB/LARS, the
// recorded whole-tensor norms); the benchmark fails unless weights match bit for bit.
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/dtype.h"
#include "optimizers/kernels.h"
#include "optimizers/update_rule.h"

namespace hybridps {
namespace optimizers {
namespace {

constexpr size_t kPartitionBytes = size_t{4} << 20;
constexpr size_t kCheck = 1024;

// A partition with its state, in one dtype.
struct Buffers {
  Buffers(DType dtype, size_t count, size_t nstate)
      : weight(count * DTypeSize(dtype)),
        grad(count * DTypeSize(dtype)),
        state(nstate, std::vector<float>(count)) {
    for (auto& s : state) ptrs.push_back(s.data());
  }
  Partition View(DType dtype, size_t count) {
    Partition p;
    p.weight = weight.data();
    p.grad = grad.data();
    p.dtype = dtype;
    p.count = count;
    p.state = std::span<float* const>(ptrs.data(), ptrs.size());
    return p;
  }
  std::vector<unsigned char> weight;
  std::vector<unsigned char> grad;
  std::vector<std::vector<float>> state;
  std::vector<float*> ptrs;
};

void Fill(DType dtype, std::vector<unsigned char>* bytes, size_t count, float scale, int seed) {
  for (size_t i = 0; i < count; ++i) {
    // A cheap deterministic spread of values in [-scale, scale).
    const float v = scale * (static_cast<float>((i * 2654435761u + seed) % 2001) / 1000.f - 1.f);
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes->data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v);
      std::memcpy(bytes->data() + 2 * i, &h, 2);
    }
  }
}

// Thread CPU time, in seconds.
double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The memcpy reference timed inside a rule's run (see of_memcpy above).
class CopyReference {
 public:
  static constexpr int kEvery = 16;  // iterations of the rule per block of copies
  CopyReference() : src_(kPartitionBytes), dst_(kPartitionBytes, 0) {
    for (size_t i = 0; i < kPartitionBytes; ++i) src_[i] = static_cast<unsigned char>(i * 131);
  }
  // Copies kEvery times; adds their thread CPU time.
  void Run() {
    const double start = ThreadSeconds();
    for (int k = 0; k < kEvery; ++k) {
      std::memcpy(dst_.data(), src_.data(), kPartitionBytes);
      benchmark::ClobberMemory();
    }
    seconds_ += ThreadSeconds() - start;
    copies_ += kEvery;
  }
  // Bytes per second of the copies.
  double rate() const { return static_cast<double>(copies_ * kPartitionBytes) / seconds_; }
  bool ok() const {
    return copies_ > 0 && std::memcmp(dst_.data(), src_.data(), kPartitionBytes) == 0;
  }

 private:
  std::vector<unsigned char> src_;
  std::vector<unsigned char> dst_;
  double seconds_ = 0;
  int64_t copies_ = 0;
};

// What happens to the new weights besides the update (the server sends them as the reply).
enum class Reply {
  kNone,      // nothing: the update alone
  kCopy,      // Apply, then a memcpy of the weights (the server before Partition::weight_copy)
  kInUpdate,  // Apply with Partition::weight_copy (the server now)
};

void BM_Update(benchmark::State& state, std::string rule_name, std::map<std::string, double> params,
               DType dtype, Reply reply = Reply::kNone) {
  OptimizerSpec spec;
  spec.rule = rule_name;
  spec.params = std::move(params);
  spec.multi_precision = dtype != DType::kFloat32;
  auto made = MakeUpdateRule(spec);
  if (!made.ok()) {
    state.SkipWithError(std::string(made.status().message()).c_str());
    return;
  }
  const UpdateRule& rule = **made;
  const size_t count = kPartitionBytes / sizeof(float);  // float32 elements (or master)
  const size_t nstate = rule.Layout(dtype).num_buffers();
  Buffers b(dtype, count, nstate);
  Fill(dtype, &b.weight, count, 1.f, 1);
  Fill(dtype, &b.grad, count, 0.5f, 2);
  const Partition p = b.View(dtype, count);
  std::vector<unsigned char> reply_bytes(reply == Reply::kNone ? 0 : b.weight.size());
  const Partition p_copy = [&] {
    Partition with = p;
    with.weight_copy = reply == Reply::kInUpdate ? reply_bytes.data() : nullptr;
    return with;
  }();
  if (!rule.InitState(p).ok()) {
    state.SkipWithError("InitState failed");
    return;
  }
  const std::vector<unsigned char> initial_weight(b.weight.begin(),
                                                  b.weight.begin() + kCheck * DTypeSize(dtype));
  std::vector<std::vector<float>> initial_state;
  for (const auto& s : b.state) initial_state.emplace_back(s.begin(), s.begin() + kCheck);

  std::vector<TensorNorms> norms_used;
  int64_t t = 0;
  CopyReference copy;
  double update_seconds = 0;
  for (auto _ : state) {
    if (t % CopyReference::kEvery == 0) {
      state.PauseTiming();
      copy.Run();
      state.ResumeTiming();
    }
    const double start = ThreadSeconds();
    ++t;
    const StepArgs args = rule.Step(t, t);
    TensorNorms norms;
    if (rule.needs_tensor_norms()) {
      norms = FinishNorms(*rule.Prepare(p, args));
      norms_used.push_back(norms);
    }
    if (!rule.Apply(p_copy, args, norms).ok()) {
      state.SkipWithError("Apply failed");
      return;
    }
    if (reply == Reply::kCopy) std::memcpy(reply_bytes.data(), b.weight.data(), b.weight.size());
    benchmark::ClobberMemory();
    update_seconds += ThreadSeconds() - start;
  }
  if (!copy.ok()) {
    state.SkipWithError("memcpy reference differs");
    return;
  }

  // Replay the first kCheck elements on the portable kernels.
  Buffers r(dtype, kCheck, nstate);
  std::memcpy(r.weight.data(), initial_weight.data(), initial_weight.size());
  std::memcpy(r.grad.data(), b.grad.data(), kCheck * DTypeSize(dtype));
  for (size_t j = 0; j < nstate; ++j) r.state[j] = initial_state[j];
  const Partition q = r.View(dtype, kCheck);
  const std::string isa = internal::Kernels().isa;
  internal::ForceKernelIsaForTesting(isa == "avx2" ? "sse2" : nullptr);
  for (int64_t k = 1; k <= t; ++k) {
    const StepArgs args = rule.Step(k, k);
    TensorNorms norms;
    if (rule.needs_tensor_norms()) {
      (void)rule.Prepare(q, args);  // moments only; the norms are the whole tensor's
      norms = norms_used[k - 1];
    }
    (void)rule.Apply(q, args, norms);
  }
  internal::ForceKernelIsaForTesting(nullptr);
  if (reply != Reply::kNone && reply_bytes != b.weight) {
    state.SkipWithError("the reply differs from the weights");
    return;
  }
  if (std::memcmp(r.weight.data(), b.weight.data(), kCheck * DTypeSize(dtype)) != 0) {
    state.SkipWithError("replay on the portable kernels differs");
    return;
  }
  const auto weight_bytes = static_cast<int64_t>(count * DTypeSize(dtype));
  state.SetBytesProcessed(state.iterations() * weight_bytes);
  state.counters["of_memcpy"] =
      static_cast<double>(t * weight_bytes) / update_seconds / copy.rate();
  state.SetLabel(isa);
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<unsigned char> dst(kPartitionBytes, 0);
  std::vector<unsigned char> src(kPartitionBytes);
  for (size_t i = 0; i < kPartitionBytes; ++i) src[i] = static_cast<unsigned char>(i * 131);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kPartitionBytes);
    benchmark::ClobberMemory();
  }
  if (std::memcmp(dst.data(), src.data(), kPartitionBytes) != 0) {
    state.SkipWithError("memcpy result differs");
    return;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kPartitionBytes));
}

using P = std::map<std::string, double>;
constexpr DType kF32 = DType::kFloat32;
constexpr DType kF16 = DType::kFloat16;

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, sgd, "sgd", P{{"learning_rate", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, sgd_momentum, "sgd",
                  P{{"learning_rate", 1e-4}, {"momentum", 0.9}, {"wd", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, nag, "nag", P{{"learning_rate", 1e-4}, {"momentum", 0.9}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, signum, "signum", P{{"learning_rate", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, adam, "adam", P{{"learning_rate", 1e-4}, {"wd", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, adam_then_copy, "adam", P{{"learning_rate", 1e-4}, {"wd", 1e-4}},
                  kF32, Reply::kCopy)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, adam_copy_in_update, "adam",
                  P{{"learning_rate", 1e-4}, {"wd", 1e-4}}, kF32, Reply::kInUpdate)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, sgd_momentum_then_copy, "sgd",
                  P{{"learning_rate", 1e-4}, {"momentum", 0.9}, {"wd", 1e-4}}, kF32, Reply::kCopy)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, sgd_momentum_copy_in_update, "sgd",
                  P{{"learning_rate", 1e-4}, {"momentum", 0.9}, {"wd", 1e-4}}, kF32,
                  Reply::kInUpdate)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, adamw, "adamw", P{{"learning_rate", 1e-4}, {"wd", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, adagrad, "adagrad", P{{"learning_rate", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, rmsprop, "rmsprop", P{{"learning_rate", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, rmsprop_centered, "rmsprop",
                  P{{"learning_rate", 1e-4}, {"centered", 1}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, lamb, "lamb", P{{"learning_rate", 1e-4}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, lars, "lars", P{{"learning_rate", 1e-4}, {"momentum", 0.9}}, kF32)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, sgd_momentum_fp16, "sgd",
                  P{{"learning_rate", 1e-4}, {"momentum", 0.9}}, kF16)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Update, adam_fp16, "adam", P{{"learning_rate", 1e-4}}, kF16)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace optimizers
}  // namespace hybridps
