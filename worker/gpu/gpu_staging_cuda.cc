// The CUDA runtime behind dist_hybrid's GPU staging (gpu_staging.h). Built only with
// CUDA (HYBRIDPS_WITH_CUDA). Plain C++ on the runtime API: no kernels. Tested on a GPU by
// tests/gpu (scripts/device-checks).
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/comm/cuda_util.h"
#include "worker/gpu/gpu_staging.h"

namespace hybridps {
namespace {

const char* MemoryTypeName(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered: return "ordinary host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "memory of unknown type";
}

// Makes `device` current for its scope and then restores the calling thread's own: the
// copier runs on the stager's thread and on user threads waiting on a handle.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (device >= 0 && cudaGetDevice(&prev_) == cudaSuccess && prev_ != device &&
        cudaSetDevice(device) == cudaSuccess) {
      restore_ = true;
    }
  }
  ~DeviceScope() {
    if (restore_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
  bool restore_ = false;
};

class CudaCopier : public DeviceCopier {
 public:
  ~CudaCopier() override {
    // Copies that never finished (a broken stager) keep their events; destroying them and
    // the streams does not wait for the GPU.
    for (auto& [ticket, event] : events_) cudaEventDestroy(event);
    for (cudaEvent_t event : spare_) cudaEventDestroy(event);
    for (cudaStream_t stream : streams_) {
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  }

  absl::StatusOr<int> DeviceCount() override {
    ASSIGN_OR_RETURN(int count, CudaDeviceCount());
    if (count == 0) return absl::FailedPreconditionError("cudaGetDeviceCount reports 0 devices");
    return count;
  }

  absl::Status CheckPointer(const void* data, int device) override {
    cudaPointerAttributes attr{};
    RETURN_IF_ERROR(
        CudaStatus(cudaPointerGetAttributes(&attr, data), "cudaPointerGetAttributes"));
    const bool on_device =
        attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
    if (on_device && attr.device == device) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "its data is not memory of GPU ", device, ": CUDA says it is ",
        MemoryTypeName(attr.type), on_device ? absl::StrCat(" of GPU ", attr.device) : ""));
  }

  absl::Status Bind(int device) override {
    DeviceScope scope(device);
    RETURN_IF_ERROR(UseDevice(device));  // a CUDA error names the device
    device_ = device;
    for (cudaStream_t& stream : streams_) {
      RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocHost(size_t bytes) override {
    DeviceScope scope(device_);
    void* data = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&data, bytes, cudaHostAllocPortable),
                               absl::StrCat("cudaHostAlloc(", bytes, " bytes)")));
    return data;
  }

  void FreeHost(void* data) override {
    DeviceScope scope(device_);
    absl::Status s = CudaStatus(cudaFreeHost(data), "cudaFreeHost");
    if (!s.ok()) HPS_LOG(WARNING) << "GPU staging: " << s.message();
  }

  absl::StatusOr<uint64_t> Start(Direction direction, void* dst, const void* src,
                                 size_t bytes) override {
    DeviceScope scope(device_);
    const bool to_host = direction == Direction::kToHost;
    cudaStream_t stream = streams_[to_host ? 0 : 1];
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(dst, src, bytes,
                        to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream),
        to_host ? "cudaMemcpyAsync (device to host)" : "cudaMemcpyAsync (host to device)"));
    cudaEvent_t event;
    if (spare_.empty()) {
      RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                 "cudaEventCreateWithFlags"));
    } else {
      event = spare_.back();
      spare_.pop_back();
    }
    absl::Status s = CudaStatus(cudaEventRecord(event, stream), "cudaEventRecord");
    if (!s.ok()) {
      cudaEventDestroy(event);
      return s;
    }
    const uint64_t ticket = next_ticket_++;
    events_[ticket] = event;
    return ticket;
  }

  absl::StatusOr<bool> Poll(uint64_t ticket) override {
    auto it = events_.find(ticket);
    if (it == events_.end()) {
      return absl::InternalError(absl::StrCat("GPU staging: unknown copy ticket ", ticket));
    }
    DeviceScope scope(device_);
    const cudaError_t err = cudaEventQuery(it->second);
    if (err == cudaErrorNotReady) return false;
    cudaEvent_t event = it->second;
    events_.erase(it);
    if (err == cudaSuccess) {
      spare_.push_back(event);
      return true;
    }
    cudaEventDestroy(event);
    return CudaStatus(err, "cudaEventQuery (the copy)");
  }

 private:
  int device_ = -1;  // Bind's
  cudaStream_t streams_[2] = {nullptr, nullptr};  // to the host, to the device
  absl::flat_hash_map<uint64_t, cudaEvent_t> events_;  // copies in flight, by ticket
  std::vector<cudaEvent_t> spare_;
  uint64_t next_ticket_ = 1;
};

}  // namespace

std::unique_ptr<DeviceCopier> NewCudaCopier() { return std::make_unique<CudaCopier>(); }

}  // namespace hybridps
