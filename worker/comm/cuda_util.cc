#include "worker/comm/cuda_util.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace hybridps {

absl::Status CudaStatus(cudaError_t err, absl::string_view call) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed: ", cudaGetErrorString(err), " (",
                                          cudaGetErrorName(err), ")"));
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  return count;
}

absl::Status UseDevice(int device) {
  absl::Status s = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  if (s.ok()) return s;
  auto count = CudaDeviceCount();
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot use GPU ", device, ": ", s.message(), "; ",
      count.ok() ? absl::StrCat("this process sees ", *count, " CUDA device(s)")
                 : std::string(count.status().message())));
}

}  // namespace hybridps
