#include "bench/bench_sweep.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "bench/zmq_echo.h"
#include "common/status.h"

namespace hybridps::bench {
namespace {

// The value worker `rank` contributes at element `i` on iterations of parity `parity`:
// 1..4 on even iterations and 5..8 on odd ones, varying with the element's position, so a
// stale, misplaced or missing contribution changes the sum.
int Contribution(int rank, size_t i, int parity) {
  const uint64_t mix = (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull) >> 62;
  return 1 + static_cast<int>((mix + static_cast<uint64_t>(rank)) & 3) + 4 * parity;
}

void Store(DType t, unsigned char* p, int64_t v) {
  const float f = static_cast<float>(v);
  switch (t) {
    case DType::kFloat32:
      std::memcpy(p, &f, 4);
      break;
    case DType::kFloat64: {
      double d = static_cast<double>(v);
      std::memcpy(p, &d, 8);
      break;
    }
    case DType::kFloat16: {
      uint16_t h = FloatToHalf(f);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t h = FloatToBFloat16(f);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::kInt64:
      std::memcpy(p, &v, 8);
      break;
    case DType::kUInt8:
      *p = static_cast<unsigned char>(v);
      break;
  }
}

}  // namespace

Timing Summarize(std::vector<double> us) {
  Timing t;
  if (us.empty()) return t;
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  t.samples = n;
  t.median_us = n % 2 ? us[n / 2] : (us[n / 2 - 1] + us[n / 2]) / 2;
  t.p99_us = us[static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n))) - 1];
  t.min_us = us.front();
  return t;
}

double GBps(size_t bytes, double us) { return us > 0 ? static_cast<double>(bytes) / us / 1e3 : 0; }

// Largest sum of small integers the type holds exactly (and, for uint8, below the
// poison byte 0xff).
int64_t ExactLimit(DType t) {
  switch (t) {
    case DType::kFloat16:
      return 2048;
    case DType::kBFloat16:
      return 256;
    case DType::kUInt8:
      return 254;
    case DType::kFloat32:
      return int64_t{1} << 24;
    default:
      return std::numeric_limits<int32_t>::max();
  }
}

double Load(DType t, const unsigned char* p) {
  float f;
  double d;
  uint16_t h;
  int32_t i32;
  int64_t i64;
  switch (t) {
    case DType::kFloat32:
      std::memcpy(&f, p, 4);
      return f;
    case DType::kFloat64:
      std::memcpy(&d, p, 8);
      return d;
    case DType::kFloat16:
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    case DType::kBFloat16:
      std::memcpy(&h, p, 2);
      return BFloat16ToFloat(h);
    case DType::kInt32:
      std::memcpy(&i32, p, 4);
      return i32;
    case DType::kInt64:
      std::memcpy(&i64, p, 8);
      return static_cast<double>(i64);
    case DType::kUInt8:
      return *p;
  }
  return 0;
}

Patterns MakePatterns(DType t, size_t count, int rank, int num_workers) {
  const size_t es = DTypeSize(t);
  Patterns p;
  for (int parity = 0; parity < 2; ++parity) {
    p.input[parity] = std::make_unique<Buffer>(count * es);
    p.expected[parity] = std::make_unique<Buffer>(count * es);
    for (size_t i = 0; i < count; ++i) {
      int64_t sum = 0;
      for (int r = 0; r < num_workers; ++r) sum += Contribution(r, i, parity);
      Store(t, p.input[parity]->get() + i * es, Contribution(rank, i, parity));
      Store(t, p.expected[parity]->get() + i * es, sum);
    }
  }
  return p;
}

std::vector<size_t> Sizes(const Flags& f) {
  std::vector<size_t> out;
  const size_t es = DTypeSize(f.dtype);
  for (size_t s = f.min_bytes; s <= f.max_bytes; s *= f.factor) {
    if (s >= es) out.push_back(s / es * es);
    if (s > std::numeric_limits<size_t>::max() / f.factor) break;
  }
  return out;
}

int ItersFor(const Flags& f, size_t bytes) {
  return bytes <= f.small_max_bytes ? std::max(f.iters, f.small_iters) : f.iters;
}
int WarmupFor(const Flags& f, size_t bytes) {
  return bytes <= f.small_max_bytes ? std::max(f.warmup, f.small_iters / 10) : f.warmup;
}

// The push_pull figures of one size; checks every iteration's result.
// `samples`: where given, the timed iterations' microseconds are appended there too;
// `first_it`: the number of the first iteration (the input pattern alternates with it).
absl::StatusOr<Timing> MeasurePushPull(const Flags& f, KVStore& kv, size_t bytes,
                                       const Patterns& pat, Buffer& work,
                                       std::vector<double>* samples,
                                       int first_it) {
  const size_t es = DTypeSize(f.dtype), count = bytes / es;
  const size_t k = std::min<size_t>(static_cast<size_t>(f.tensors), count);
  // Tensor j covers elements [first[j], first[j + 1]).
  std::vector<size_t> first(k + 1);
  for (size_t j = 0; j <= k; ++j) first[j] = count / k * j + std::min(j, count % k);
  std::vector<std::string> names(k);
  for (size_t j = 0; j < k; ++j) names[j] = absl::StrCat("bench/", bytes, "/", j);
  auto view = [&](unsigned char* base, size_t j) {
    return TensorView{base + first[j] * es, first[j + 1] - first[j], f.dtype};
  };
  const int iters = ItersFor(f, bytes), warmup = WarmupFor(f, bytes);
  std::vector<double> us;
  std::vector<Handle> handles;
  handles.reserve(k);
  for (int it = 0; it < warmup + iters; ++it) {
    const int parity = (first_it + it) % 2;
    unsigned char* in = pat.input[parity]->get();
    if (f.inplace) {
      std::memcpy(work.get(), in, bytes);
      in = work.get();
    } else {
      std::memset(work.get(), 0xff, bytes);  // poison: NaN or -1, never a valid sum
    }
    handles.clear();
    if (f.barrier) RETURN_IF_ERROR(kv.Barrier());
    const Clock::time_point t0 = Clock::now();
    for (size_t j = 0; j < k; ++j) {
      ASSIGN_OR_RETURN(Handle h, kv.PushPullAsync(names[j], view(in, j), view(work.get(), j)));
      handles.push_back(std::move(h));
    }
    for (const Handle& h : handles) RETURN_IF_ERROR(h.Wait());
    const Clock::time_point t1 = Clock::now();
    if (it >= warmup) us.push_back(Micros(t1 - t0));
    const unsigned char* want = pat.expected[parity]->get();
    if (std::memcmp(work.get(), want, bytes) != 0) {
      size_t i = 0;
      while (std::memcmp(work.get() + i * es, want + i * es, es) == 0) ++i;
      size_t j = 0;
      while (first[j + 1] <= i) ++j;
      return absl::DataLossError(
          absl::StrCat("MISMATCH in push_pull of ", bytes, " bytes (", count, " ",
                       DTypeName(f.dtype), "), iteration ", it, ", tensor '", names[j],
                       "' element ", i - first[j], ": got ", Load(f.dtype, work.get() + i * es),
                       ", expected the exact sum ", Load(f.dtype, want + i * es)));
    }
  }
  if (samples != nullptr) samples->insert(samples->end(), us.begin(), us.end());
  return Summarize(std::move(us));
}

}  // namespace hybridps::bench
