#include "common/compression.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hybridps {
namespace {

constexpr uint8_t kPositive = 0x3;  // 11
constexpr uint8_t kNegative = 0x2;  // 10

}  // namespace

absl::Status CheckGradientCompression(const GradientCompression& c) {
  if (c.type == Compression::kNone) return absl::OkStatus();
  if (c.type != Compression::kTwoBit) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown gradient compression ", static_cast<uint32_t>(c.type)));
  }
  if (!std::isfinite(c.threshold) || c.threshold <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the 2bit compression's threshold must be a positive number, not ", c.threshold));
  }
  return absl::OkStatus();
}

size_t TwoBitBytes(size_t count) { return (count + 15) / 16 * 4; }

void TwoBitQuantize(const float* grad, size_t count, float threshold, float* residual,
                    char* out) {
  const size_t bytes = TwoBitBytes(count);
  std::memset(out, 0, bytes);
  auto* packed = reinterpret_cast<uint8_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    const float r = residual[i] + grad[i];
    const int shift = 6 - 2 * static_cast<int>(i & 3);
    if (r >= threshold) {
      packed[i >> 2] |= kPositive << shift;
      residual[i] = r - threshold;
    } else if (r <= -threshold) {
      packed[i >> 2] |= kNegative << shift;
      residual[i] = r + threshold;
    } else {
      residual[i] = r;
    }
  }
}

absl::Status TwoBitDequantize(absl::string_view packed, size_t count, float threshold,
                              float* out) {
  if (packed.size() != TwoBitBytes(count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a 2bit-compressed partition of ", count, " elements takes ", TwoBitBytes(count),
        " bytes, not ", packed.size()));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(packed.data());
  for (size_t i = 0; i < count; ++i) {
    const uint8_t code = (bytes[i >> 2] >> (6 - 2 * (i & 3))) & 0x3;
    if (code == kPositive) {
      out[i] = threshold;
    } else if (code == kNegative) {
      out[i] = -threshold;
    } else if (code == 0) {
      out[i] = 0.0f;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("a 2bit-compressed partition uses the unknown code 01 at element ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace hybridps
