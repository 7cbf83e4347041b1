#include "common/reduce.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/string_view.h"
#include "common/isa_dispatch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hybridps {
namespace reduce_internal {

// Test hook (declared by tests/unit/reduce_test.cc): routes every later call to the
// kernels of `isa` ("avx2" or the portable ReduceKernelIsa() name); nullptr restores
// run-time detection. Returns false, changing nothing, when this CPU cannot run `isa`.
bool ForceIsaForTesting(const char* isa);

}  // namespace reduce_internal

namespace {

// Every kernel computes dst[i] = a[i] + b[i] on byte pointers of any alignment; dst may
// equal a and/or b but must not overlap them partially.
using Sum2Fn = void (*)(void* dst, const void* a, const void* b, size_t count);

struct KernelTable {
  const char* isa;
  Sum2Fn sum2[kNumDTypes];  // indexed by the DType value
};

#if defined(__x86_64__)
constexpr char kPortableIsa[] = "sse2";
#else
constexpr char kPortableIsa[] = "generic";
#endif

// ---- Portable kernels. Fixed-size blocks staged through local arrays let the compiler
// vectorise without alias checks, and keep exact aliasing (dst == a) correct.

template <typename T>  // float, double or an unsigned integer (wrapping sums)
void PortableSum2(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kBlock = 64 / sizeof(T);
  auto* d = static_cast<char*>(dst);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  const size_t bytes = count * sizeof(T);
  size_t i = 0;
  for (; i + kBlock * sizeof(T) <= bytes; i += kBlock * sizeof(T)) {
    T xs[kBlock];
    T ys[kBlock];
    std::memcpy(xs, x + i, sizeof xs);
    std::memcpy(ys, y + i, sizeof ys);
    for (size_t j = 0; j < kBlock; ++j) xs[j] = static_cast<T>(xs[j] + ys[j]);
    std::memcpy(d + i, xs, sizeof xs);
  }
  for (; i < bytes; i += sizeof(T)) {
    T p;
    T q;
    std::memcpy(&p, x + i, sizeof p);
    std::memcpy(&q, y + i, sizeof q);
    p = static_cast<T>(p + q);
    std::memcpy(d + i, &p, sizeof p);
  }
}

struct HalfCodec {
  static float Widen(uint16_t h) { return HalfToFloat(h); }
  static uint16_t Narrow(float f) { return FloatToHalf(f); }
};

struct BFloat16Codec {
  static float Widen(uint16_t b) { return BFloat16ToFloat(b); }
  // FloatToBFloat16 for a float that is the sum of two bfloat16 values. Such a sum has
  // its low 16 bits zero whenever it is a NaN (input NaNs propagate made quiet, invalid
  // operations give the default NaN), so the bias cannot carry into a NaN's upper half
  // and no NaN special case is needed; branch-free, so it vectorises.
  static uint16_t Narrow(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
};

template <typename Codec>
void Portable16Sum2(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kBlock = 32;
  auto* d = static_cast<char*>(dst);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    uint16_t xs[kBlock];
    uint16_t ys[kBlock];
    std::memcpy(xs, x + 2 * i, sizeof xs);
    std::memcpy(ys, y + 2 * i, sizeof ys);
    for (size_t j = 0; j < kBlock; ++j) {
      xs[j] = Codec::Narrow(Codec::Widen(xs[j]) + Codec::Widen(ys[j]));
    }
    std::memcpy(d + 2 * i, xs, sizeof xs);
  }
  for (; i < count; ++i) {
    uint16_t p;
    uint16_t q;
    std::memcpy(&p, x + 2 * i, sizeof p);
    std::memcpy(&q, y + 2 * i, sizeof q);
    p = Codec::Narrow(Codec::Widen(p) + Codec::Widen(q));
    std::memcpy(d + 2 * i, &p, sizeof p);
  }
}

constexpr KernelTable kPortableTable = {
    kPortableIsa,
    {PortableSum2<float>, PortableSum2<double>, Portable16Sum2<HalfCodec>,
     Portable16Sum2<BFloat16Codec>, PortableSum2<uint32_t>, PortableSum2<uint64_t>,
     PortableSum2<uint8_t>}};

// ---- AVX2 + F16C kernels. Each Op adds one vector (kBytes bytes); the driver unrolls
// twice and hands the remainder (fewer than kBytes bytes) to the portable kernel.

#if defined(__x86_64__)
#define HPS_AVX2 __attribute__((target("avx2,f16c")))

template <typename T>
HPS_AVX2 inline __m256i LoadI(const T* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
HPS_AVX2 inline void StoreI(char* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

struct F32Op {
  static constexpr size_t kBytes = 32;
  static constexpr size_t kElemSize = 4;
  HPS_AVX2 static void Add(char* d, const char* a, const char* b) {
    const __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(a));
    const __m256 y = _mm256_loadu_ps(reinterpret_cast<const float*>(b));
    _mm256_storeu_ps(reinterpret_cast<float*>(d), _mm256_add_ps(x, y));
  }
};

struct F64Op {
  static constexpr size_t kBytes = 32;
  static constexpr size_t kElemSize = 8;
  HPS_AVX2 static void Add(char* d, const char* a, const char* b) {
    const __m256d x = _mm256_loadu_pd(reinterpret_cast<const double*>(a));
    const __m256d y = _mm256_loadu_pd(reinterpret_cast<const double*>(b));
    _mm256_storeu_pd(reinterpret_cast<double*>(d), _mm256_add_pd(x, y));
  }
};

struct I32Op {
  static constexpr size_t kBytes = 32;
  static constexpr size_t kElemSize = 4;
  HPS_AVX2 static void Add(char* d, const char* a, const char* b) {
    StoreI(d, _mm256_add_epi32(LoadI(a), LoadI(b)));
  }
};

struct I64Op {
  static constexpr size_t kBytes = 32;
  static constexpr size_t kElemSize = 8;
  HPS_AVX2 static void Add(char* d, const char* a, const char* b) {
    StoreI(d, _mm256_add_epi64(LoadI(a), LoadI(b)));
  }
};

struct U8Op {
  static constexpr size_t kBytes = 32;
  static constexpr size_t kElemSize = 1;
  HPS_AVX2 static void Add(char* d, const char* a, const char* b) {
    StoreI(d, _mm256_add_epi8(LoadI(a), LoadI(b)));
  }
};

struct F16Op {
  static constexpr size_t kBytes = 16;
  static constexpr size_t kElemSize = 2;
  HPS_AVX2 static void Add(char* d, const char* a, const char* b) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    const __m128i s =
        _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), s);
  }
};

struct BF16Op {
  static constexpr size_t kBytes = 32;
  static constexpr size_t kElemSize = 2;
  // BFloat16Codec::Narrow on float lanes that hold sums of two bfloat16 values (no NaN
  // case needed, see there); the bfloat16 lands in the upper half of each 32-bit lane.
  HPS_AVX2 static __m256i RoundSum(__m256 s) {
    const __m256i x = _mm256_castps_si256(s);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  }
  HPS_AVX2 static void Add(char* d, const char* a, const char* b) {
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i va = LoadI(a);
    const __m256i vb = LoadI(b);
    // Even elements sit in the low halves of the 32-bit lanes, odd ones in the high.
    const __m256 even = _mm256_add_ps(_mm256_castsi256_ps(_mm256_slli_epi32(va, 16)),
                                      _mm256_castsi256_ps(_mm256_slli_epi32(vb, 16)));
    const __m256 odd = _mm256_add_ps(_mm256_castsi256_ps(_mm256_and_si256(va, hi_mask)),
                                     _mm256_castsi256_ps(_mm256_and_si256(vb, hi_mask)));
    StoreI(d, _mm256_blend_epi16(_mm256_srli_epi32(RoundSum(even), 16), RoundSum(odd), 0xaa));
  }
};

template <typename Op, Sum2Fn kTail>
HPS_AVX2 void Avx2Sum2(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kStep = Op::kBytes;
  auto* d = static_cast<char*>(dst);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  const size_t bytes = count * Op::kElemSize;
  size_t i = 0;
  for (; i + 2 * kStep <= bytes; i += 2 * kStep) {
    Op::Add(d + i, x + i, y + i);
    Op::Add(d + i + kStep, x + i + kStep, y + i + kStep);
  }
  if (i + kStep <= bytes) {
    Op::Add(d + i, x + i, y + i);
    i += kStep;
  }
  kTail(d + i, x + i, y + i, (bytes - i) / Op::kElemSize);
}

constexpr KernelTable kAvx2Table = {
    "avx2",
    {Avx2Sum2<F32Op, PortableSum2<float>>, Avx2Sum2<F64Op, PortableSum2<double>>,
     Avx2Sum2<F16Op, Portable16Sum2<HalfCodec>>, Avx2Sum2<BF16Op, Portable16Sum2<BFloat16Codec>>,
     Avx2Sum2<I32Op, PortableSum2<uint32_t>>, Avx2Sum2<I64Op, PortableSum2<uint64_t>>,
     Avx2Sum2<U8Op, PortableSum2<uint8_t>>}};

#endif  // defined(__x86_64__)

#if defined(__x86_64__)
IsaDispatch<KernelTable> g_tables(&kPortableTable, &kAvx2Table);
#else
IsaDispatch<KernelTable> g_tables(&kPortableTable, nullptr);
#endif

const KernelTable& Table() { return g_tables.Get(); }

Sum2Fn Kernel(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  if (index >= static_cast<size_t>(kNumDTypes)) {
    std::fprintf(stderr, "hybridps: reduce called with invalid dtype %zu\n", index);
    std::abort();
  }
  return Table().sum2[index];
}

}  // namespace

void SumInto(DType dtype, void* dst, const void* src, size_t count) {
  Kernel(dtype)(dst, dst, src, count);
}

void Sum2(DType dtype, void* dst, const void* a, const void* b, size_t count) {
  Kernel(dtype)(dst, a, b, count);
}

const char* ReduceKernelIsa() { return Table().isa; }

bool reduce_internal::ForceIsaForTesting(const char* isa) { return g_tables.Force(isa); }

}  // namespace hybridps
