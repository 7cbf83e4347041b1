#include "optimizers/mxnet_float.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

namespace hybridps {
namespace optimizers {
namespace internal {

std::string PythonFloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest round-trip digits d[.ddd]e±XX, then CPython's float_repr_style 'short' layout.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string s(buf, r.ptr);
  std::string out;
  size_t p = 0;
  if (s[p] == '-') {
    out += '-';
    ++p;
  }
  const size_t e = s.find('e');
  std::string digits;
  for (size_t i = p; i < e; ++i) {
    if (s[i] != '.') digits += s[i];
  }
  const int exp10 = std::atoi(s.c_str() + e + 1);
  const int decpt = exp10 + 1;  // digits represent 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    const std::string xs = std::to_string(x < 0 ? -x : x);
    if (xs.size() < 2) out += '0';
    out += xs;
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(decpt - n, '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

namespace {

// The shortest round-trip decimal digits of finite v != 0 (no sign) and the position of
// the decimal point: |v| = 0.DIGITS * 10^decpt. Returns the digit count.
int ShortestDigits(double v, char* digits, int* decpt) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  int n = 0;
  const char* c = buf;
  for (; c < r.ptr && *c != 'e'; ++c) {
    if (*c != '.') digits[n++] = *c;
  }
  int exp10 = 0;
  std::from_chars(c + 1 + (c[1] == '+'), r.ptr, exp10);
  *decpt = exp10 + 1;
  return n;
}

}  // namespace

// dmlc::ParseFloat<float, true> applied to PythonFloatRepr(v), without building the
// string: the digits before the decimal point, those after it (at most 19 used), and the
// exponent are what the repr would show. Outside float's exponent range dmlc::stof
// throws, so MXNet rejects the value; we return the plain conversion there.
float MxnetKwargFloat(double v) {
  if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
  if (std::isinf(v)) {
    return v > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  }
  const bool positive = !std::signbit(v);
  if (v == 0) return positive ? 0.f : -0.f;
  char digits[32];
  int decpt = 0;
  const int n = ShortestDigits(v, digits, &decpt);
  // Split as repr would: integer digits, fraction digits, exponent.
  uint64_t predec = 0;
  uint64_t frac = 0;
  uint64_t pow10 = 1;
  bool has_frac = false;
  int expon = 0;  // signed decimal exponent written after 'e'
  auto add_frac = [&](char d, int* count) {
    if (*count < 19) {  // dmlc's kStrtofMaxDigits
      frac = frac * 10 + static_cast<uint64_t>(d - '0');
      pow10 *= 10;
    }
    ++*count;
  };
  int count = 0;
  if (decpt <= -4 || decpt > 16) {  // d[.ddd]e±XX
    predec = static_cast<uint64_t>(digits[0] - '0');
    has_frac = n > 1;
    for (int i = 1; i < n; ++i) add_frac(digits[i], &count);
    expon = decpt - 1;
  } else if (decpt <= 0) {  // 0.000ddd
    has_frac = true;
    for (int i = 0; i < -decpt; ++i) add_frac('0', &count);
    for (int i = 0; i < n; ++i) add_frac(digits[i], &count);
  } else {  // ddd.ddd, or ddd000.0
    for (int i = 0; i < decpt; ++i) {
      predec = predec * 10 + static_cast<uint64_t>(i < n ? digits[i] - '0' : 0);
    }
    has_frac = true;
    if (decpt >= n) {
      add_frac('0', &count);
    } else {
      for (int i = decpt; i < n; ++i) add_frac(digits[i], &count);
    }
  }
  float value = static_cast<float>(predec);
  if (has_frac) value += static_cast<float>(static_cast<double>(frac) / static_cast<double>(pow10));
  if (expon != 0 || decpt <= -4 || decpt > 16) {
    const bool negative_exp = expon < 0;
    unsigned e = static_cast<unsigned>(negative_exp ? -expon : expon);
    if (e > 38 || (e == 38 && (negative_exp ? value < 1.175494351f : value > 3.402823466f))) {
      return static_cast<float>(v);
    }
    float scale = 1.0f;
    while (e >= 8) {
      scale *= 1E8f;
      e -= 8;
    }
    while (e > 0) {
      scale *= 10.0f;
      e -= 1;
    }
    value = negative_exp ? value / scale : value * scale;
  }
  return positive ? value : -value;
}

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps
