// Test data whose sums are exact in every dtype: small integers.
#ifndef HYBRIDPS_TESTS_CLUSTER_TENSOR_FILL_H_
#define HYBRIDPS_TESTS_CLUSTER_TENSOR_FILL_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtype.h"

namespace hybridps::testing {

inline void SetElement(DType t, void* data, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(data)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(v)); break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    case DType::kInt32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); break;
  }
}

inline double GetElement(DType t, const void* data, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(data)[i];
    case DType::kFloat64: return static_cast<const double*>(data)[i];
    case DType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(data)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kUInt8: return static_cast<const uint8_t*>(data)[i];
  }
  return 0;
}

// Worker `rank`'s value of element i in round `round` of tensor `salt`: 0..12.
inline double Value(size_t i, int rank, int round, int salt) {
  return static_cast<double>((i * 7 + static_cast<size_t>(rank) * 3 +
                              static_cast<size_t>(round) * 5 + static_cast<size_t>(salt)) % 13);
}

// A tensor buffer of `count` elements of `t`.
struct Buffer {
  Buffer(DType t, size_t count) : dtype(t), count(count), bytes(count * DTypeSize(t) + 1) {}
  // A buffer that gives its shape with every operation.
  Buffer(DType t, std::vector<int64_t> dims)
      : Buffer(t, TensorShape::Of(dims.data(), dims.size()).elements()) {
    shape = TensorShape::Of(dims.data(), dims.size());
  }
  TensorView view() { return TensorView{bytes.data(), count, dtype, Device::kCPU, 0, shape}; }
  void Fill(int rank, int round, int salt) {
    for (size_t i = 0; i < count; ++i) SetElement(dtype, bytes.data(), i, Value(i, rank, round, salt));
  }
  double at(size_t i) const { return GetElement(dtype, bytes.data(), i); }
  DType dtype;
  size_t count;
  std::vector<char> bytes;
  TensorShape shape;  // not given unless made with dims
};

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_TENSOR_FILL_H_
