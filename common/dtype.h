// Element types of tensors and the tensor view passed through the public API.
#ifndef HYBRIDPS_COMMON_DTYPE_H_
#define HYBRIDPS_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace hybridps {

// The numeric values travel on the wire (proto field `dtype`): never renumber.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};
inline constexpr int kNumDTypes = 7;

// Bytes per element (0 for a value that is no DType). Inline: every tensor's byte count
// on the per-operation paths calls it.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}
// "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8".
absl::string_view DTypeName(DType t);
// Inverse of DTypeName (also accepts numpy's "uint8" etc.). InvalidArgument if unknown.
absl::StatusOr<DType> ParseDType(absl::string_view name);
// True when `v` is the wire value of a DType.
bool IsValidDType(uint32_t v);

// IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float BFloat16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t FloatToBFloat16(float f);

enum class Device : uint8_t { kCPU = 0, kGPU = 1 };

// A tensor's dimensions as the caller gave them, compared across the workers alongside
// the element count (mismatched shapes of the same size fail as mismatched sizes do).
// ndim 0: not given (the C++ API's default): only the count is compared. More than
// kMaxShapeDims dimensions keep the first kMaxShapeDims - 1 and fold the rest into the
// last, so such shapes are compared on those.
inline constexpr int kMaxShapeDims = 8;
struct TensorShape {
  int ndim = 0;
  int64_t dims[kMaxShapeDims] = {};

  static TensorShape Of(const int64_t* dims, size_t ndim);
  bool known() const { return ndim > 0; }
  // "(17, 1311)"; "" when not known.
  std::string ToString() const;
  // Equal when both are known and the same, or either is not known.
  bool Agrees(const TensorShape& other) const;
  // The product of the dims (1 for none).
  uint64_t elements() const;
};

// OK when `shape` is not given, or has at most kMaxShapeDims dimensions, none negative,
// holding `count` elements; else InvalidArgument saying which.
absl::Status CheckTensorShape(const TensorShape& shape, uint64_t count);

// "(17, 1311) float32" when `shape` is known, else "12 float32 elements".
std::string DescribeTensor(const TensorShape& shape, uint64_t count, DType dtype);

// A non-owning view of a dense tensor. The caller keeps the memory alive until the
// operation that received the view has completed (its handle's Wait returned).
struct TensorView {
  void* data = nullptr;
  size_t count = 0;  // elements
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;
  int device_id = 0;
  TensorShape shape{};  // optional: compared across the workers when given

  size_t bytes() const { return count * DTypeSize(dtype); }
};

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_DTYPE_H_
