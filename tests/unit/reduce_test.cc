#include "common/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"

namespace hybridps {
namespace reduce_internal {
bool ForceIsaForTesting(const char* isa);  // defined in common/reduce.cc
}  // namespace reduce_internal

namespace {

using Bytes = std::vector<unsigned char>;

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                DType::kInt32,   DType::kInt64,   DType::kUInt8};
constexpr size_t kSizes[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 1000, 4099, 1 << 20};
constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xa5;

std::string PortableIsa() {
#if defined(__x86_64__)
  return "sse2";
#else
  return "generic";
#endif
}

template <typename T>
T Load(const unsigned char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof v);
  return v;
}

template <typename T>
void Store(unsigned char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof v);
}

// One addition per element, the plainest way.
template <typename T>
void RefAdd(unsigned char* d, const unsigned char* a, const unsigned char* b, size_t n) {
  for (size_t i = 0; i < n; ++i) Store<T>(d, i, static_cast<T>(Load<T>(a, i) + Load<T>(b, i)));
}

void Reference(DType t, unsigned char* d, const unsigned char* a, const unsigned char* b,
               size_t n) {
  switch (t) {
    case DType::kFloat32:
      return RefAdd<float>(d, a, b, n);
    case DType::kFloat64:
      return RefAdd<double>(d, a, b, n);
    case DType::kInt32:
      return RefAdd<uint32_t>(d, a, b, n);
    case DType::kInt64:
      return RefAdd<uint64_t>(d, a, b, n);
    case DType::kUInt8:
      return RefAdd<uint8_t>(d, a, b, n);
    case DType::kFloat16:
      for (size_t i = 0; i < n; ++i) {
        const float s = HalfToFloat(Load<uint16_t>(a, i)) + HalfToFloat(Load<uint16_t>(b, i));
        Store<uint16_t>(d, i, FloatToHalf(s));
      }
      return;
    case DType::kBFloat16:
      for (size_t i = 0; i < n; ++i) {
        const float s =
            BFloat16ToFloat(Load<uint16_t>(a, i)) + BFloat16ToFloat(Load<uint16_t>(b, i));
        Store<uint16_t>(d, i, FloatToBFloat16(s));
      }
      return;
  }
}

bool IsNaNAt(DType t, const unsigned char* p, size_t i) {
  switch (t) {
    case DType::kFloat32:
      return std::isnan(Load<float>(p, i));
    case DType::kFloat64:
      return std::isnan(Load<double>(p, i));
    case DType::kFloat16:
      return std::isnan(HalfToFloat(Load<uint16_t>(p, i)));
    case DType::kBFloat16:
      return std::isnan(BFloat16ToFloat(Load<uint16_t>(p, i)));
    default:
      return false;
  }
}

// Exact equality, except that any NaN matches any NaN (payload choice is the CPU's).
::testing::AssertionResult SameElements(DType t, const unsigned char* got,
                                        const unsigned char* want, size_t n) {
  const size_t es = DTypeSize(t);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got + i * es, want + i * es, es) == 0) continue;
    if (IsNaNAt(t, got, i) && IsNaNAt(t, want, i)) continue;
    uint64_t g = 0;
    uint64_t w = 0;
    std::memcpy(&g, got + i * es, es);
    std::memcpy(&w, want + i * es, es);
    return ::testing::AssertionFailure() << "element " << i << " of " << n << ": got bits 0x"
                                         << std::hex << g << ", want 0x" << w;
  }
  return ::testing::AssertionSuccess();
}

// A copy of `content` placed `offset` bytes into fresh storage, followed by guard bytes.
class Placed {
 public:
  Placed(const Bytes& content, size_t offset)
      : storage_(offset + content.size() + kGuard, kGuardByte), offset_(offset) {
    if (!content.empty()) std::memcpy(data(), content.data(), content.size());
    size_ = content.size();
  }
  unsigned char* data() { return storage_.data() + offset_; }
  bool GuardIntact() const {
    for (size_t i = offset_ + size_; i < storage_.size(); ++i) {
      if (storage_[i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  Bytes storage_;
  size_t offset_;
  size_t size_ = 0;
};

// Random elements: raw bit patterns (infinities, NaNs, subnormals for the float types)
// mixed with moderate values whose sums need real rounding.
Bytes RandomData(DType t, size_t n, std::mt19937_64& rng) {
  Bytes out(n * DTypeSize(t));
  std::uniform_real_distribution<double> moderate(-8.0, 8.0);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t raw = rng();
    const bool use_raw = (raw & 3) == 0;
    const double v = moderate(rng);
    switch (t) {
      case DType::kFloat32:
        use_raw ? Store<uint32_t>(out.data(), i, raw >> 32)
                : Store<float>(out.data(), i, static_cast<float>(v));
        break;
      case DType::kFloat64:
        use_raw ? Store<uint64_t>(out.data(), i, raw) : Store<double>(out.data(), i, v);
        break;
      case DType::kFloat16:
        Store<uint16_t>(
            out.data(), i,
            use_raw ? static_cast<uint16_t>(raw >> 48) : FloatToHalf(static_cast<float>(v)));
        break;
      case DType::kBFloat16:
        Store<uint16_t>(
            out.data(), i,
            use_raw ? static_cast<uint16_t>(raw >> 48) : FloatToBFloat16(static_cast<float>(v)));
        break;
      case DType::kInt32:
        Store<uint32_t>(out.data(), i, static_cast<uint32_t>(raw >> 17));
        break;
      case DType::kInt64:
        Store<uint64_t>(out.data(), i, raw);
        break;
      case DType::kUInt8:
        Store<uint8_t>(out.data(), i, static_cast<uint8_t>(raw >> 40));
        break;
    }
  }
  return out;
}

bool Unchanged(const unsigned char* p, const Bytes& original) {
  return original.empty() || std::memcmp(p, original.data(), original.size()) == 0;
}

// Runs every calling pattern of SumInto and Sum2 on a and b (n elements of t), with the
// buffers `offset` bytes past their allocations, and compares each with the reference.
void CheckAllForms(DType t, const Bytes& a, const Bytes& b, size_t n, size_t offset) {
  Bytes want(a.size());
  Reference(t, want.data(), a.data(), b.data(), n);
  Bytes want_doubled(a.size());
  Reference(t, want_doubled.data(), a.data(), a.data(), n);
  {
    Placed pa(a, offset), pb(b, offset), pd(Bytes(a.size(), 0), offset);
    Sum2(t, pd.data(), pa.data(), pb.data(), n);
    EXPECT_TRUE(SameElements(t, pd.data(), want.data(), n)) << "Sum2 distinct";
    EXPECT_TRUE(Unchanged(pa.data(), a)) << "Sum2 modified a";
    EXPECT_TRUE(Unchanged(pb.data(), b)) << "Sum2 modified b";
    EXPECT_TRUE(pd.GuardIntact()) << "Sum2 wrote past the end";
  }
  {
    Placed pa(a, offset), pb(b, offset);
    Sum2(t, pa.data(), pa.data(), pb.data(), n);
    EXPECT_TRUE(SameElements(t, pa.data(), want.data(), n)) << "Sum2 dst==a";
    EXPECT_TRUE(pa.GuardIntact());
  }
  {
    Placed pa(a, offset), pb(b, offset);
    Sum2(t, pb.data(), pa.data(), pb.data(), n);
    EXPECT_TRUE(SameElements(t, pb.data(), want.data(), n)) << "Sum2 dst==b";
  }
  {
    Placed pa(a, offset);
    Sum2(t, pa.data(), pa.data(), pa.data(), n);
    EXPECT_TRUE(SameElements(t, pa.data(), want_doubled.data(), n)) << "Sum2 all alias";
  }
  {
    Placed pa(a, offset), pb(b, offset);
    SumInto(t, pa.data(), pb.data(), n);
    EXPECT_TRUE(SameElements(t, pa.data(), want.data(), n)) << "SumInto";
    EXPECT_TRUE(Unchanged(pb.data(), b)) << "SumInto modified src";
    EXPECT_TRUE(pa.GuardIntact()) << "SumInto wrote past the end";
  }
  {
    Placed pa(a, offset);
    SumInto(t, pa.data(), pa.data(), n);
    EXPECT_TRUE(SameElements(t, pa.data(), want_doubled.data(), n)) << "SumInto dst==src";
  }
}

// Routes the kernels to the ISA named by the parameter for the duration of a test.
template <typename Param>
class ForcedIsaTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!reduce_internal::ForceIsaForTesting(isa().c_str())) {
      GTEST_SKIP() << isa() << " is not supported by this CPU";
    }
    ASSERT_EQ(std::string(ReduceKernelIsa()), isa());
  }
  void TearDown() override { reduce_internal::ForceIsaForTesting(nullptr); }

  const std::string& isa() const {
    if constexpr (std::is_same_v<Param, std::string>) {
      return this->GetParam();
    } else {
      return std::get<0>(this->GetParam());
    }
  }
};

// Parameterised over ISA x dtype.
class ReduceTest : public ForcedIsaTest<std::tuple<std::string, DType>> {
 protected:
  DType dtype() const { return std::get<1>(GetParam()); }
};

// Parameterised over ISA; each test picks its dtypes.
using ReduceIsaTest = ForcedIsaTest<std::string>;

TEST_P(ReduceTest, MatchesReferenceOnRandomData) {
  std::mt19937_64 rng(20240611 + static_cast<int>(dtype()));
  const size_t es = DTypeSize(dtype());
  for (size_t n : kSizes) {
    const Bytes a = RandomData(dtype(), n, rng);
    const Bytes b = RandomData(dtype(), n, rng);
    for (size_t offset : {size_t{0}, es}) {
      SCOPED_TRACE(testing::Message() << "count " << n << ", offset " << offset);
      CheckAllForms(dtype(), a, b, n, offset);
    }
  }
}

TEST_P(ReduceTest, ToleratesByteMisalignment) {
  std::mt19937_64 rng(7);
  for (size_t n : {size_t{33}, size_t{4099}}) {
    SCOPED_TRACE(testing::Message() << "count " << n);
    const Bytes a = RandomData(dtype(), n, rng);
    const Bytes b = RandomData(dtype(), n, rng);
    CheckAllForms(dtype(), a, b, n, 1);
  }
}

TEST_P(ReduceTest, ZeroCountTouchesNothing) {
  Sum2(dtype(), nullptr, nullptr, nullptr, 0);
  SumInto(dtype(), nullptr, nullptr, 0);
}

// Every 16-bit pattern against a permutation of all of them: covers subnormal sums,
// overflow to infinity, inf - inf and NaN inputs in both the vector body and the tail.
TEST_P(ReduceIsaTest, AllSixteenBitPatterns) {
  constexpr size_t kN = 65536 + 5;
  Bytes a(2 * kN), b(2 * kN);
  for (size_t i = 0; i < kN; ++i) {
    Store<uint16_t>(a.data(), i, static_cast<uint16_t>(i));
    Store<uint16_t>(b.data(), i, static_cast<uint16_t>(i * 40503u + 12345u));
  }
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    CheckAllForms(t, a, b, kN, 0);
  }
}

// Sums a[i % size] + b[i % size] over 101 elements (vector body and tail) in place.
template <typename T>
void ExpectWrap(DType t, std::initializer_list<T> a, std::initializer_list<T> b,
                std::initializer_list<T> sum) {
  constexpr size_t kN = 101;
  Bytes x(kN * sizeof(T)), y(kN * sizeof(T));
  for (size_t i = 0; i < kN; ++i) {
    Store<T>(x.data(), i, std::data(a)[i % a.size()]);
    Store<T>(y.data(), i, std::data(b)[i % b.size()]);
  }
  SumInto(t, x.data(), y.data(), kN);
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_EQ(Load<T>(x.data(), i), std::data(sum)[i % sum.size()]) << "element " << i;
  }
}

TEST_P(ReduceIsaTest, IntegersWrapAround) {
  using I32 = std::numeric_limits<int32_t>;
  using I64 = std::numeric_limits<int64_t>;
  ExpectWrap<int32_t>(DType::kInt32, {I32::max(), I32::min(), -1, I32::max()},
                      {1, -1, 1, I32::max()}, {I32::min(), I32::max(), 0, -2});
  ExpectWrap<int64_t>(DType::kInt64, {I64::max(), I64::min(), -1, I64::min()},
                      {1, -1, 1, I64::min()}, {I64::min(), I64::max(), 0, 0});
  ExpectWrap<uint8_t>(DType::kUInt8, {255, 200, 128, 0}, {1, 100, 128, 0}, {0, 44, 0, 0});
}

// `values` (cycled to n elements) encoded as float32, float16 or bfloat16.
Bytes EncodeFloats(DType t, const std::vector<float>& values, size_t n) {
  Bytes out(n * DTypeSize(t));
  for (size_t i = 0; i < n; ++i) {
    const float v = values[i % values.size()];
    if (t == DType::kFloat32) Store<float>(out.data(), i, v);
    if (t == DType::kFloat16) Store<uint16_t>(out.data(), i, FloatToHalf(v));
    if (t == DType::kBFloat16) Store<uint16_t>(out.data(), i, FloatToBFloat16(v));
  }
  return out;
}

float DecodeFloat(DType t, const Bytes& data, size_t i) {
  if (t == DType::kFloat16) return HalfToFloat(Load<uint16_t>(data.data(), i));
  if (t == DType::kBFloat16) return BFloat16ToFloat(Load<uint16_t>(data.data(), i));
  return Load<float>(data.data(), i);
}

TEST_P(ReduceIsaTest, FloatSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    struct Case {
      float a, b, f32, f16, bf16;  // operands, then the sum in each type
    };
    // Ties: 2048 + 1 and 2050 + 1 in float16 (ulp 2), 256 + 1 and 258 + 1 in bfloat16
    // (ulp 2; 2050 is not a bfloat16 and reads as 2048). 65504 is 65536 in bfloat16.
    const std::vector<Case> cases = {
        {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f},
        {inf, -inf, nan, nan, nan},
        {nan, 1, nan, nan, nan},
        {1, nan, nan, nan, nan},
        {2048, 1, 2049, 2048, 2048},
        {2050, 1, 2051, 2052, 2048},
        {256, 1, 257, 257, 256},
        {258, 1, 259, 259, 260},
        {65504, 65504, 131008, inf, 131072},
        {3e38f, 3e38f, inf, inf, inf},
        {-1e-30f, 1e-30f, 0, 0, 0},
    };
    std::vector<float> a, b;
    for (const Case& c : cases) {
      a.push_back(c.a);
      b.push_back(c.b);
    }
    constexpr size_t kN = 97;  // several vectors and a tail
    Bytes x = EncodeFloats(t, a, kN);
    const Bytes y = EncodeFloats(t, b, kN);
    CheckAllForms(t, x, y, kN, 0);
    SumInto(t, x.data(), y.data(), kN);
    for (size_t i = 0; i < kN; ++i) {
      const Case& c = cases[i % cases.size()];
      const float want = t == DType::kFloat16 ? c.f16 : t == DType::kBFloat16 ? c.bf16 : c.f32;
      const float got = DecodeFloat(t, x, i);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "element " << i << ": " << got;
      } else {
        EXPECT_EQ(got, want) << "element " << i;
        EXPECT_EQ(std::signbit(got), std::signbit(want)) << "element " << i;
      }
    }
  }
}

std::vector<std::string> AllIsas() { return {PortableIsa(), "avx2"}; }

INSTANTIATE_TEST_SUITE_P(AllKernels, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(AllIsas()),
                                            ::testing::ValuesIn(kAllDTypes)),
                         [](const ::testing::TestParamInfo<ReduceTest::ParamType>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(DTypeName(std::get<1>(info.param)));
                         });

INSTANTIATE_TEST_SUITE_P(AllKernels, ReduceIsaTest, ::testing::ValuesIn(AllIsas()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(ReduceDispatchTest, ReportsDetectedIsa) {
  const std::string isa = ReduceKernelIsa();
  EXPECT_TRUE(isa == "avx2" || isa == PortableIsa()) << isa;
  EXPECT_FALSE(reduce_internal::ForceIsaForTesting("avx512-nonexistent"));
  EXPECT_EQ(std::string(ReduceKernelIsa()), isa);
}

}  // namespace
}  // namespace hybridps
