#include "optimizers/kernels.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/isa_dispatch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hybridps {
namespace optimizers {
namespace internal {
namespace {

// ---- One float lane: the portable kernels and the tails of the vector ones ---------------

struct Scalar {
  static constexpr size_t kWidth = 1;
  float v;
  static Scalar Load(const float* p) { return {*p}; }
  static Scalar Set1(float x) { return {x}; }
  void Store(float* p) const { *p = v; }
};
inline Scalar operator+(Scalar a, Scalar b) { return {a.v + b.v}; }
inline Scalar operator-(Scalar a, Scalar b) { return {a.v - b.v}; }
inline Scalar operator*(Scalar a, Scalar b) { return {a.v * b.v}; }
inline Scalar operator/(Scalar a, Scalar b) { return {a.v / b.v}; }
inline Scalar Sqrt(Scalar a) { return {std::sqrt(a.v)}; }
// mshadow_op::clip: x > c ? c : (x < -c ? -c : x); a NaN x stays NaN.
inline Scalar Clip(Scalar x, Scalar c, Scalar neg_c) {
  const float r = c.v < x.v ? c.v : x.v;
  return {neg_c.v > r ? neg_c.v : r};
}
inline Scalar Sign(Scalar x) { return {static_cast<float>((x.v > 0) - (x.v < 0))}; }
// float(m / (sqrt(v) + eps) + add), evaluated in double (MXNet's multi_lamb).
inline Scalar LambQuotient(Scalar m, Scalar v, Scalar eps, Scalar add) {
  const double q = static_cast<double>(m.v) / (std::sqrt(static_cast<double>(v.v)) + eps.v);
  return {static_cast<float>(q + add.v)};
}

// Sums of squares into lane i % 8, in double (a float's square is exact in double).
class ScalarSq {
 public:
  explicit ScalarSq(double* loc) : loc_(loc) {}
  void Add(size_t i, Scalar x) {
    const double d = x.v;
    loc_[i % 8] += d * d;
  }
  void Flush() {}

 private:
  double* loc_;  // the caller's 8 lanes, outliving this object
};

void WidenF16Scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}
void NarrowF16Scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}
void WidenBF16Scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(src[i]);
}
void NarrowBF16Scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16(src[i]);
}

}  // namespace

// ---- Portable kernels -------------------------------------------------------------------

namespace portable {
namespace {
using Vec = Scalar;
using VecSq = ScalarSq;
#include "optimizers/kernels_body.inc"
}  // namespace
}  // namespace portable

// ---- AVX2 + F16C kernels (no FMA: results equal the portable ones bit for bit) -----------

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

namespace avx2 {
namespace {

struct Vec {
  static constexpr size_t kWidth = 8;
  __m256 v;
  static Vec Load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static Vec Set1(float x) { return {_mm256_set1_ps(x)}; }
  void Store(float* p) const { _mm256_storeu_ps(p, v); }
};
inline Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec operator/(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vec Sqrt(Vec a) { return {_mm256_sqrt_ps(a.v)}; }
// MINPS/MAXPS return their second operand when either is NaN: a NaN x passes through.
inline Vec Clip(Vec x, Vec c, Vec neg_c) {
  return {_mm256_max_ps(neg_c.v, _mm256_min_ps(c.v, x.v))};
}
inline Vec Sign(Vec x) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(x.v, zero, _CMP_GT_OQ), one);
  const __m256 neg = _mm256_and_ps(_mm256_cmp_ps(x.v, zero, _CMP_LT_OQ), one);
  return {_mm256_sub_ps(pos, neg)};
}

// LambQuotient on 8 lanes, as two halves of 4 doubles.
inline __m128 LambQuotientHalf(__m128 m, __m128 v, __m128 eps, __m128 add) {
  const __m256d q = _mm256_div_pd(
      _mm256_cvtps_pd(m), _mm256_add_pd(_mm256_sqrt_pd(_mm256_cvtps_pd(v)), _mm256_cvtps_pd(eps)));
  return _mm256_cvtpd_ps(_mm256_add_pd(q, _mm256_cvtps_pd(add)));
}
inline Vec LambQuotient(Vec m, Vec v, Vec eps, Vec add) {
  const __m128 lo = LambQuotientHalf(_mm256_castps256_ps128(m.v), _mm256_castps256_ps128(v.v),
                                     _mm256_castps256_ps128(eps.v), _mm256_castps256_ps128(add.v));
  const __m128 hi =
      LambQuotientHalf(_mm256_extractf128_ps(m.v, 1), _mm256_extractf128_ps(v.v, 1),
                       _mm256_extractf128_ps(eps.v, 1), _mm256_extractf128_ps(add.v, 1));
  return {_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1)};
}

// Lanes 0..7 of the register accumulators are lanes 0..7 of ScalarSq (i % 8 == 0 here).
class VecSq {
 public:
  explicit VecSq(double* loc) : loc_(loc), lo_(_mm256_setzero_pd()), hi_(_mm256_setzero_pd()) {}
  void Add(size_t, Vec x) {
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x.v));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x.v, 1));
    lo_ = _mm256_add_pd(lo_, _mm256_mul_pd(a, a));
    hi_ = _mm256_add_pd(hi_, _mm256_mul_pd(b, b));
  }
  // Called once, while the caller's lanes are still zero.
  void Flush() {
    _mm256_storeu_pd(loc_, lo_);
    _mm256_storeu_pd(loc_ + 4, hi_);
  }

 private:
  double* loc_;  // the caller's 8 lanes, outliving this object
  __m256d lo_;
  __m256d hi_;
};

#include "optimizers/kernels_body.inc"

void WidenF16(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  WidenF16Scalar(src + i, dst + i, n - i);
}

void NarrowF16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  NarrowF16Scalar(src + i, dst + i, n - i);
}

void WidenBF16(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(x));
  }
  WidenBF16Scalar(src + i, dst + i, n - i);
}

// FloatToBFloat16 on 8 lanes: round to nearest even; NaNs become quiet NaNs.
void NarrowBF16(const float* src, uint16_t* dst, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x0040);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    // Pack the 32-bit lanes (all < 2^16) to 16 bits; packus works per 128-bit half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  NarrowBF16Scalar(src + i, dst + i, n - i);
}

}  // namespace
}  // namespace avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // defined(__x86_64__)

// ---- Dispatch ---------------------------------------------------------------------------

namespace {

#if defined(__x86_64__)
constexpr char kPortableIsa[] = "sse2";
#else
constexpr char kPortableIsa[] = "generic";
#endif

constexpr KernelTable MakePortableTable() {
  KernelTable t{};
  t.isa = kPortableIsa;
  for (size_t i = 0; i < static_cast<size_t>(KernelId::kNumKernels); ++i) {
    t.update[i] = portable::kUpdateKernels[i];
  }
  t.sum_sq = portable::SumSq;
  t.widen_f16 = WidenF16Scalar;
  t.narrow_f16 = NarrowF16Scalar;
  t.widen_bf16 = WidenBF16Scalar;
  t.narrow_bf16 = NarrowBF16Scalar;
  return t;
}
constexpr KernelTable kPortableTable = MakePortableTable();

#if defined(__x86_64__)
constexpr KernelTable MakeAvx2Table() {
  KernelTable t{};
  t.isa = "avx2";
  for (size_t i = 0; i < static_cast<size_t>(KernelId::kNumKernels); ++i) {
    t.update[i] = avx2::kUpdateKernels[i];
  }
  t.sum_sq = avx2::SumSq;
  t.widen_f16 = avx2::WidenF16;
  t.narrow_f16 = avx2::NarrowF16;
  t.widen_bf16 = avx2::WidenBF16;
  t.narrow_bf16 = avx2::NarrowBF16;
  return t;
}
constexpr KernelTable kAvx2Table = MakeAvx2Table();

#endif

#if defined(__x86_64__)
IsaDispatch<KernelTable> g_tables(&kPortableTable, &kAvx2Table);
#else
IsaDispatch<KernelTable> g_tables(&kPortableTable, nullptr);
#endif

}  // namespace

const KernelTable& Kernels() { return g_tables.Get(); }

bool ForceKernelIsaForTesting(const char* isa) { return g_tables.Force(isa); }

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps
