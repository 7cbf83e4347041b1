// The CUDA runtime helpers shared by the GPU paths (dist_allreduce's NCCL, dist_hybrid's
// host staging): statuses that name the failed call, the device count, the current
// device. Built only with CUDA (HYBRIDPS_WITH_CUDA).
#ifndef HYBRIDPS_WORKER_COMM_CUDA_UTIL_H_
#define HYBRIDPS_WORKER_COMM_CUDA_UTIL_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridps {

// "cudaSetDevice(1) failed: invalid device ordinal (cudaErrorInvalidDevice)"; OK for
// cudaSuccess.
absl::Status CudaStatus(cudaError_t err, absl::string_view call);
// How many CUDA devices this process sees; an error saying why when CUDA cannot tell (no
// driver, no device).
absl::StatusOr<int> CudaDeviceCount();
// Makes `device` the calling thread's current device; an error naming the device and
// the CUDA error otherwise (no device, no driver, a bad ordinal).
absl::Status UseDevice(int device);

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_COMM_CUDA_UTIL_H_
