#include "common/dtype.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace hybridps {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct NameEntry {
  absl::string_view name;
  DType dtype;
};

// Canonical names first (DTypeName returns these), then accepted aliases.
constexpr NameEntry kNames[] = {
    {"float32", DType::kFloat32},   {"float64", DType::kFloat64}, {"float16", DType::kFloat16},
    {"bfloat16", DType::kBFloat16}, {"int32", DType::kInt32},     {"int64", DType::kInt64},
    {"uint8", DType::kUInt8},       {"fp32", DType::kFloat32},    {"fp64", DType::kFloat64},
    {"double", DType::kFloat64},    {"fp16", DType::kFloat16},    {"half", DType::kFloat16},
    {"bf16", DType::kBFloat16},
};

}  // namespace

absl::string_view DTypeName(DType t) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kNames[i].dtype == t) return kNames[i].name;
  }
  return "invalid";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  // Debian's abseil has its own absl::string_view, distinct from absl::string_view.
  const absl::string_view view(name.data(), name.size());
  const std::string lower = absl::AsciiStrToLower(view);
  for (const NameEntry& e : kNames) {
    if (e.name == lower) return e.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", absl::CEscape(view), "\""));
}

TensorShape TensorShape::Of(const int64_t* dims, size_t ndim) {
  TensorShape s;
  s.ndim = static_cast<int>(std::min<size_t>(ndim, kMaxShapeDims));
  for (size_t i = 0; i < ndim; ++i) {
    const size_t at = std::min<size_t>(i, kMaxShapeDims - 1);
    // Folded in unsigned arithmetic: a product that overflows is refused by
    // CheckTensorShape's element count, never undefined.
    s.dims[at] = i > at ? static_cast<int64_t>(static_cast<uint64_t>(s.dims[at]) *
                                               static_cast<uint64_t>(dims[i]))
                        : dims[i];
  }
  return s;
}

std::string TensorShape::ToString() const {
  if (!known()) return "";
  std::string out = "(";
  for (int i = 0; i < ndim; ++i) absl::StrAppend(&out, i ? ", " : "", dims[i]);
  return absl::StrCat(out, ndim == 1 ? ",)" : ")");
}

bool TensorShape::Agrees(const TensorShape& other) const {
  if (!known() || !other.known()) return true;
  return ndim == other.ndim && std::equal(dims, dims + ndim, other.dims);
}

uint64_t TensorShape::elements() const {
  uint64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= static_cast<uint64_t>(dims[i]);
  return n;
}

absl::Status CheckTensorShape(const TensorShape& shape, uint64_t count) {
  if (shape.ndim == 0) return absl::OkStatus();
  if (shape.ndim < 0 || shape.ndim > kMaxShapeDims) {
    return absl::InvalidArgumentError(absl::StrCat("a shape of ", shape.ndim,
                                                   " dimensions (at most ", kMaxShapeDims,
                                                   ")"));
  }
  uint64_t n = 1;
  bool overflow = false;
  for (int i = 0; i < shape.ndim; ++i) {
    if (shape.dims[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", shape.ToString(), " has a negative dimension"));
    }
    overflow = overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(shape.dims[i]), &n);
  }
  if (overflow || n != count) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", shape.ToString(), " does not hold ",
                                                   count, " elements"));
  }
  return absl::OkStatus();
}

std::string DescribeTensor(const TensorShape& shape, uint64_t count, DType dtype) {
  if (shape.known()) return absl::StrCat(shape.ToString(), " ", DTypeName(dtype));
  return absl::StrCat(count, " ", DTypeName(dtype), " elements");
}

bool IsValidDType(uint32_t v) { return v < static_cast<uint32_t>(kNumDTypes); }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24 is exact in float32.
    return BitsToFloat(sign | FloatBits(static_cast<float>(man) * 0x1p-24f));
  }
  if (exp == 0x1f) {
    // Infinity, or NaN made quiet with its payload kept (as VCVTPH2PS does).
    return BitsToFloat(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
  }
  return BitsToFloat(sign | ((exp + (127 - 15)) << 23) | (man << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    // Quiet NaN with the top payload bits kept (as VCVTPS2PH does).
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {
    // >= 65520 (max half + half an ulp) rounds to infinity.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {
    // Below 2^-14: result is subnormal or zero, in units of 2^-24.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - (abs >> 23);  // 14..24
    uint32_t r = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);  // r == 0x400 is the smallest normal
  }
  uint32_t r = (abs - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  }
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

}  // namespace hybridps
