// Helpers shared by the optimizer tests and the check tool: owned tensors in any of the
// supported dtypes, with their state, viewed as a Partition.
#ifndef HYBRIDPS_TESTS_OPTIMIZERS_TEST_UTIL_H_
#define HYBRIDPS_TESTS_OPTIMIZERS_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "optimizers/update_rule.h"

namespace hybridps {
namespace optimizers {
namespace testing {

// `v` rounded to `dtype` (float32, float16, bfloat16), as raw bits in a uint32.
inline uint32_t Encode(DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat16:
      return FloatToHalf(v);
    case DType::kBFloat16:
      return FloatToBFloat16(v);
    default: {
      uint32_t u;
      std::memcpy(&u, &v, sizeof u);
      return u;
    }
  }
}

inline float Decode(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfToFloat(static_cast<uint16_t>(bits));
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<uint16_t>(bits));
    default: {
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
  }
}

inline float RoundTo(DType dtype, float v) { return Decode(dtype, Encode(dtype, v)); }

// A tensor of `dtype` holding weights, gradient and the rule's state.
class OwnedTensor {
 public:
  OwnedTensor(DType dtype, size_t count, size_t num_state)
      : dtype_(dtype),
        count_(count),
        weight_(count * DTypeSize(dtype)),
        grad_(count * DTypeSize(dtype)),
        state_(num_state, std::vector<float>(count)) {
    for (auto& s : state_) state_ptrs_.push_back(s.data());
  }

  size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  float weight(size_t i) const { return Get(weight_, i); }
  float grad(size_t i) const { return Get(grad_, i); }
  void set_weight(size_t i, float v) { Set(&weight_, i, v); }
  void set_grad(size_t i, float v) { Set(&grad_, i, v); }
  std::vector<float>& state(size_t j) { return state_[j]; }
  const std::vector<unsigned char>& weight_bytes() const { return weight_; }

  // A view of elements [offset, offset + count).
  Partition View(size_t offset, size_t count) {
    views_.emplace_back();
    std::vector<float*>& ptrs = views_.back();
    for (float* s : state_ptrs_) ptrs.push_back(s + offset);
    Partition p;
    p.weight = weight_.data() + offset * DTypeSize(dtype_);
    p.grad = grad_.data() + offset * DTypeSize(dtype_);
    p.dtype = dtype_;
    p.count = count;
    p.state = std::span<float* const>(ptrs.data(), ptrs.size());
    return p;
  }
  Partition Whole() { return View(0, count_); }

 private:
  float Get(const std::vector<unsigned char>& b, size_t i) const {
    uint32_t bits = 0;
    std::memcpy(&bits, b.data() + i * DTypeSize(dtype_), DTypeSize(dtype_));
    return Decode(dtype_, bits);
  }
  void Set(std::vector<unsigned char>* b, size_t i, float v) {
    const uint32_t bits = Encode(dtype_, v);
    std::memcpy(b->data() + i * DTypeSize(dtype_), &bits, DTypeSize(dtype_));
  }

  DType dtype_;
  size_t count_;
  std::vector<unsigned char> weight_;
  std::vector<unsigned char> grad_;
  std::vector<std::vector<float>> state_;
  std::vector<float*> state_ptrs_;
  std::vector<std::vector<float*>> views_;  // keeps each View's pointer array alive
};

// Gives `a` and `b` (same dtype and count) the same normal(0, 1) weights from `rng`.
inline void SetSameWeights(std::mt19937* rng, OwnedTensor* a, OwnedTensor* b) {
  std::normal_distribution<float> normal(0.f, 1.f);
  for (size_t i = 0; i < a->count(); ++i) {
    const float w = normal(*rng);
    a->set_weight(i, w);
    b->set_weight(i, w);
  }
}

}  // namespace testing
}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_TESTS_OPTIMIZERS_TEST_UTIL_H_
