// Throughput of SumInto on 64 MiB buffers, beside memcpy of the same bytes.
//
// bytes_per_second = (bytes of dst = 64 MiB) * iterations / time. SumInto moves three
// times that through memory (reads dst and src, writes dst); memcpy moves twice that
// (reads src, writes dst). The label names the ISA the kernels dispatched to.
// Each benchmark checks its result after timing and fails with an error if it is wrong.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/dtype.h"
#include "common/reduce.h"

namespace hybridps {
namespace {

constexpr size_t kBufferBytes = size_t{64} << 20;

// `value` encoded as one element of t (float types only).
std::vector<unsigned char> Encode(DType t, float value) {
  std::vector<unsigned char> out(DTypeSize(t));
  uint16_t h = 0;
  switch (t) {
    case DType::kFloat16:
      h = FloatToHalf(value);
      std::memcpy(out.data(), &h, sizeof h);
      break;
    case DType::kBFloat16:
      h = FloatToBFloat16(value);
      std::memcpy(out.data(), &h, sizeof h);
      break;
    default:
      std::memcpy(out.data(), &value, sizeof value);
  }
  return out;
}

float Decode(DType t, const unsigned char* p) {
  uint16_t h;
  float f;
  switch (t) {
    case DType::kFloat16:
      std::memcpy(&h, p, sizeof h);
      return HalfToFloat(h);
    case DType::kBFloat16:
      std::memcpy(&h, p, sizeof h);
      return BFloat16ToFloat(h);
    default:
      std::memcpy(&f, p, sizeof f);
      return f;
  }
}

// Value after adding 1 to 0 `steps` times, rounding to t after each step.
float Expected(DType t, int64_t steps) {
  float v = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const std::vector<unsigned char> e = Encode(t, v + 1.0f);
    v = Decode(t, e.data());
  }
  return v;
}

void BM_SumInto(benchmark::State& state, DType t) {
  const size_t es = DTypeSize(t);
  const size_t count = kBufferBytes / es;
  std::vector<unsigned char> dst(kBufferBytes, 0);  // zero in every float type
  std::vector<unsigned char> src(kBufferBytes);
  const std::vector<unsigned char> one = Encode(t, 1.0f);
  for (size_t i = 0; i < count; ++i) std::memcpy(src.data() + i * es, one.data(), es);

  for (auto _ : state) {
    SumInto(t, dst.data(), src.data(), count);
    benchmark::ClobberMemory();
  }

  const float want = Expected(t, state.iterations());
  for (size_t i = 0; i < count; ++i) {
    if (Decode(t, dst.data() + i * es) != want) {
      state.SkipWithError(("wrong sum at element " + std::to_string(i)).c_str());
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBufferBytes));
  state.SetLabel(ReduceKernelIsa());
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<unsigned char> dst(kBufferBytes, 0);
  std::vector<unsigned char> src(kBufferBytes);
  for (size_t i = 0; i < kBufferBytes; ++i) src[i] = static_cast<unsigned char>(i * 131);

  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBufferBytes);
    benchmark::ClobberMemory();
  }

  if (std::memcmp(dst.data(), src.data(), kBufferBytes) != 0) {
    state.SkipWithError("memcpy result differs");
    return;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBufferBytes));
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SumInto, float32, DType::kFloat32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SumInto, float16, DType::kFloat16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SumInto, bfloat16, DType::kBFloat16)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hybridps
