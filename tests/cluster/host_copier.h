// A host-memory stand-in for the CUDA runtime behind dist_hybrid's GPU staging layer
// (worker/gpu/gpu_staging.h), for tests on machines without a GPU: "GPU memory" is host
// memory labelled Device::kGPU; copies are memcpy that report completion after a delay;
// faults are injected there. Used by gpu_staging_test.cc and the conformance suite, with
// BackendOf (a worker's store as the layer's CPU path).
#ifndef HYBRIDPS_TESTS_CLUSTER_HOST_COPIER_H_
#define HYBRIDPS_TESTS_CLUSTER_HOST_COPIER_H_

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "tests/cluster/tensor_fill.h"
#include "worker/gpu/gpu_staging.h"
#include "worker/kvstore.h"

namespace hybridps::testing {

// The stand-in GPU: `devices` devices whose memory is the host buffers registered with
// Register; copies happen at once but report completion `delay` later.
class HostCopier : public DeviceCopier {
 public:
  struct Faults {
    int fail_start = -1;   // the n-th copy (0-based) fails to start
    int fail_poll = -1;    // the n-th copy fails when polled
    int hang = -1;         // the n-th copy never completes
    bool no_device = false;
  };
  struct Shared {  // what a test looks at while the copier belongs to a stager
    absl::Mutex mu;
    std::map<const char*, std::pair<size_t, int>> memory  // start -> bytes, device
        ABSL_GUARDED_BY(mu);
    std::atomic<int> copies{0};
    std::atomic<int> allocs{0};
    std::atomic<int> frees{0};
    std::atomic<int> bound_device{-1};
  };

  HostCopier(std::shared_ptr<Shared> shared, int devices, absl::Duration delay,
             Faults faults)
      : shared_(std::move(shared)), devices_(devices), delay_(delay), faults_(faults) {}

  absl::StatusOr<int> DeviceCount() override {
    if (faults_.no_device) {
      return absl::InternalError(
          "cudaGetDeviceCount failed: no CUDA-capable device is detected (cudaErrorNoDevice)");
    }
    return devices_;
  }
  absl::Status CheckPointer(const void* data, int device) override {
    absl::MutexLock lock(&shared_->mu);
    const char* p = static_cast<const char*>(data);
    auto it = shared_->memory.upper_bound(p);
    if (it != shared_->memory.begin()) {
      --it;
      if (p < it->first + it->second.first && it->second.second == device) {
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("its data is not memory of GPU ", device, ": CUDA says it is host memory"));
  }
  absl::Status Bind(int device) override {
    shared_->bound_device = device;
    return absl::OkStatus();
  }
  absl::StatusOr<void*> AllocHost(size_t bytes) override {
    ++shared_->allocs;
    return static_cast<void*>(new char[bytes]);
  }
  void FreeHost(void* data) override {
    ++shared_->frees;
    delete[] static_cast<char*>(data);
  }
  absl::StatusOr<uint64_t> Start(Direction direction, void* dst, const void* src,
                                 size_t bytes) override {
    const int n = shared_->copies++;
    if (n == faults_.fail_start) {
      return absl::InternalError(absl::StrCat(
          "cudaMemcpyAsync (",
          direction == Direction::kToHost ? "device to host" : "host to device",
          ") failed: an illegal memory access was encountered (cudaErrorIllegalAddress)"));
    }
    std::memcpy(dst, src, bytes);
    done_at_[n] = n == faults_.hang ? absl::InfiniteFuture() : absl::Now() + delay_;
    return static_cast<uint64_t>(n);
  }
  absl::StatusOr<bool> Poll(uint64_t ticket) override {
    const int n = static_cast<int>(ticket);
    if (n == faults_.fail_poll) {
      return absl::InternalError(
          "cudaEventQuery (the copy) failed: unspecified launch failure (cudaErrorLaunchFailure)");
    }
    return absl::Now() >= done_at_.at(n);
  }

 private:
  std::shared_ptr<Shared> shared_;
  int devices_;
  absl::Duration delay_;
  Faults faults_;
  std::map<int, absl::Time> done_at_;
};

// A tensor in the stand-in GPU's memory.
struct FakeGpuTensor {
  FakeGpuTensor(HostCopier::Shared* shared, DType dtype, size_t count, int device = 0)
      : buf(dtype, count), device(device) {
    absl::MutexLock lock(&shared->mu);
    shared->memory[buf.bytes.data()] = {buf.bytes.size(), device};
  }
  TensorView view() {
    TensorView v = buf.view();
    v.device = Device::kGPU;
    v.device_id = device;
    return v;
  }
  Buffer buf;
  int device;
};

// The staging layer's backend: the CPU operations of `kv` (a worker's store).
inline GpuStager::Backend BackendOf(KVStore* kv) {
  GpuStager::Backend backend;
  backend.push_pull = [kv](absl::string_view name, TensorView in, TensorView out,
                           int priority) { return kv->PushPullAsync(name, in, out, priority); };
  backend.broadcast = [kv](absl::string_view name, TensorView t, int root, int priority) {
    return kv->BroadcastAsync(name, t, root, priority);
  };
  return backend;
}

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_HOST_COPIER_H_
