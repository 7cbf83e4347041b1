// A build with CUDA on a host without the CUDA runtime or NCCL (worker/comm/cuda_loader.cc):
// every call returns an error that names the library it could not load and how to point
// at one, and nothing crashes. Its own binary: the libraries are looked up once per
// process, so no other test may have touched CUDA first.
#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "worker/comm/cuda_util.h"
#include "worker/comm/nccl_comm.h"

namespace hybridps {
namespace {

TEST(CudaLoaderTest, AHostWithoutTheLibrariesGetsErrorsNamingThem) {
  ASSERT_EQ(setenv("HYBRIDPS_CUDART_LIBRARY", "/nonexistent/libcudart.so.13", 1), 0);
  ASSERT_EQ(setenv("HYBRIDPS_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1), 0);
  absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_FALSE(count.ok());
  EXPECT_TRUE(absl::StrContains(count.status().message(),
                                "hybridps could not load the CUDA runtime "
                                "(/nonexistent/libcudart.so.13: "))
      << count.status();
  EXPECT_TRUE(absl::StrContains(count.status().message(), "no usable CUDA runtime; install "
                                "it, or set HYBRIDPS_CUDART_LIBRARY to its path"))
      << count.status();
  EXPECT_FALSE(UseDevice(0).ok());
  ncclUniqueId id;
  absl::Status nccl = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId");
  EXPECT_TRUE(absl::StrContains(nccl.message(), "hybridps could not load the NCCL "
                                "(/nonexistent/libnccl.so.2: "))
      << nccl;
  EXPECT_TRUE(absl::StrContains(nccl.message(), "HYBRIDPS_NCCL_LIBRARY")) << nccl;
}

}  // namespace
}  // namespace hybridps
