// GPU tensors for the GPU tests: device memory filled and read back through host Buffers
// (tensor_fill.h).
#ifndef HYBRIDPS_TESTS_GPU_DEVICE_BUFFER_H_
#define HYBRIDPS_TESTS_GPU_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/dtype.h"
#include "tests/cluster/tensor_fill.h"

namespace hybridps::testing {

inline int Devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// A tensor in GPU memory, filled and read back through host Buffers (tensor_fill.h).
class DeviceBuffer {
 public:
  DeviceBuffer(DType dtype, size_t count, int device) : host_(dtype, count), device_(device) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&data_, host_.bytes.size()), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  TensorView view() {
    return TensorView{data_, host_.count, host_.dtype, Device::kGPU, device_};
  }
  // Fills with Value(i, rank, round, salt) and waits for the copy to land (the store's
  // stream does not wait for the caller's work).
  void Fill(int rank, int round, int salt) {
    host_.Fill(rank, round, salt);
    ASSERT_EQ(cudaMemcpy(data_, host_.bytes.data(), host_.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // Element i as it is on the GPU now.
  double at(size_t i) {
    if (!fetched_) {
      EXPECT_EQ(cudaMemcpy(host_.bytes.data(), data_, host_.bytes.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      fetched_ = true;
    }
    return host_.at(i);
  }
  void Refetch() { fetched_ = false; }

 private:
  Buffer host_;
  int device_;
  void* data_ = nullptr;
  bool fetched_ = false;
};

inline double SumOver(int n, size_t i, int round, int salt) {
  double want = 0;
  for (int r = 0; r < n; ++r) want += Value(i, r, round, salt);
  return want;
}

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_GPU_DEVICE_BUFFER_H_
