#include "common/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                DType::kInt32,   DType::kInt64,   DType::kUInt8};

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool IsHalfNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool IsBFloat16NaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Value of a half computed independently of HalfToFloat.
double HalfValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f) return sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(man, -24);
  return sign * std::ldexp(1024 + man, exp - 25);
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kInt32), 4u);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8u);
  EXPECT_EQ(DTypeSize(DType::kUInt8), 1u);
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(DType::kFloat64), "float64");
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kInt32), "int32");
  EXPECT_EQ(DTypeName(DType::kInt64), "int64");
  EXPECT_EQ(DTypeName(DType::kUInt8), "uint8");
}

TEST(DTypeTest, ParseRoundTripsEveryName) {
  for (DType t : kAllDTypes) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(t));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, t);
  }
}

TEST(DTypeTest, ParseAcceptsAliasesAndCase) {
  EXPECT_EQ(ParseDType("FLOAT32").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("fp16").value(), DType::kFloat16);
  EXPECT_EQ(ParseDType("half").value(), DType::kFloat16);
  EXPECT_EQ(ParseDType("bf16").value(), DType::kBFloat16);
  EXPECT_EQ(ParseDType("double").value(), DType::kFloat64);
}

TEST(DTypeTest, ParseRejectsUnknownNames) {
  for (const char* bad : {"", "float", "int8", "float32 ", "uint16", "complex64"}) {
    absl::StatusOr<DType> parsed = ParseDType(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(parsed.status().message()).find(std::string("\"") + bad + "\""),
              std::string::npos)
        << parsed.status();
  }
}

TEST(DTypeTest, ParseErrorEscapesBinaryInput) {
  absl::StatusOr<DType> parsed = ParseDType(absl::string_view("a\0b\n", 4));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(std::string(parsed.status().message()).find("a\\000b\\n"), std::string::npos)
      << parsed.status();
}

TEST(DTypeTest, IsValidDType) {
  for (DType t : kAllDTypes) EXPECT_TRUE(IsValidDType(static_cast<uint32_t>(t)));
  EXPECT_FALSE(IsValidDType(kNumDTypes));
  EXPECT_FALSE(IsValidDType(255));
  EXPECT_FALSE(IsValidDType(0xffffffffu));
}

TEST(DTypeTest, TensorViewBytes) {
  TensorView v;
  v.count = 10;
  v.dtype = DType::kBFloat16;
  EXPECT_EQ(v.bytes(), 20u);
}

TEST(HalfTest, AllBitPatternsRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    const uint16_t back = FloatToHalf(f);
    if (IsHalfNaN(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << i;
      EXPECT_TRUE(IsHalfNaN(back)) << std::hex << i;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << i;
      EXPECT_EQ(back, h | 0x200) << "payload kept, made quiet: " << std::hex << i;
    } else {
      EXPECT_EQ(static_cast<double>(f), HalfValue(h)) << std::hex << i;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
      EXPECT_EQ(back, h) << std::hex << i;
    }
  }
}

// For every pair of adjacent finite halves, the midpoint rounds to the even one and the
// floats just either side of it round to the nearer one.
TEST(HalfTest, RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = HalfToFloat(static_cast<uint16_t>(h));
    const float hi = h == 0x7bff ? 65536.0f : HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (lo + hi) / 2;  // exact: 12 significant bits
    const uint32_t even = (h & 1) ? h + 1 : h;
    for (uint32_t sign : {0u, 0x8000u}) {
      const float s = sign ? -1.0f : 1.0f;
      EXPECT_EQ(FloatToHalf(s * mid), sign | even) << std::hex << h;
      EXPECT_EQ(FloatToHalf(s * std::nextafter(mid, 0.0f)), sign | h) << std::hex << h;
      EXPECT_EQ(FloatToHalf(s * std::nextafter(mid, 1e30f)), sign | (h + 1)) << std::hex << h;
      EXPECT_EQ(FloatToHalf(s * lo), sign | h) << std::hex << h;
    }
  }
}

TEST(HalfTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // tie to even (zero)
  EXPECT_EQ(FloatToHalf(0x3p-25f), 0x0002);  // tie to even
  EXPECT_EQ(FloatToHalf(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);
  EXPECT_EQ(FloatToHalf(std::nextafter(0x1p-14f, 0.0f)), 0x0400);  // up into normals
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);  // tie to even
  EXPECT_EQ(FloatToHalf(1.0f + 0x3p-11f), 0x3c02);  // tie to even
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(std::nanf(""))));
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(FromBits(0x7f800001))));  // payload below half's
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(FromBits(0xff800001))));
  EXPECT_EQ(FloatToHalf(FromBits(0xff800001)) & 0x8000, 0x8000);
  EXPECT_EQ(HalfToFloat(0x7c00), inf);
  EXPECT_EQ(HalfToFloat(0xfc00), -inf);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03ff), 0x3ffp-24f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
}

TEST(BFloat16Test, AllBitPatternsRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = BFloat16ToFloat(b);
    const uint16_t back = FloatToBFloat16(f);
    if (IsBFloat16NaN(b)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << i;
      EXPECT_EQ(back, b | 0x40) << std::hex << i;
    } else {
      EXPECT_EQ(back, b) << std::hex << i;
    }
  }
}

TEST(BFloat16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f807fff)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FromBits(0xbf818000)), 0xbf82);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3fffffff)), 0x4000);  // carry into exponent
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008000)), 0x0000);  // subnormal tie
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000)), 0x0002);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
}

TEST(BFloat16Test, OverflowAndSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(FloatToBFloat16(inf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-inf), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::nanf("")), 0x7fc0);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f800001)), 0x7fc0);  // signalling, low payload
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7fffffff)), 0x7fff);  // no carry out of NaN
  EXPECT_EQ(FloatToBFloat16(FromBits(0xffbfffff)), 0xffff);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bits(BFloat16ToFloat(0x8000)), 0x80000000u);
}

}  // namespace
}  // namespace hybridps
