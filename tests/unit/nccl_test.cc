// What of the NCCL path runs without a GPU (built only with HYBRIDPS_WITH_NCCL): the
// dtype mapping, the error statuses, and a clear error — not a crash — when CUDA has no
// such device.
#include "tests/status_matchers.h"
#include "worker/comm/nccl_comm.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hybridps {
namespace {

TEST(NcclTest, EveryDTypeMapsToTheNcclTypeOfTheSameElement) {
  EXPECT_EQ(NcclDataType(DType::kFloat32), ncclFloat32);
  EXPECT_EQ(NcclDataType(DType::kFloat64), ncclFloat64);
  EXPECT_EQ(NcclDataType(DType::kFloat16), ncclFloat16);
  EXPECT_EQ(NcclDataType(DType::kBFloat16), ncclBfloat16);
  EXPECT_EQ(NcclDataType(DType::kInt32), ncclInt32);
  EXPECT_EQ(NcclDataType(DType::kInt64), ncclInt64);
  EXPECT_EQ(NcclDataType(DType::kUInt8), ncclUint8);
}

TEST(NcclTest, ErrorsNameTheCallAndTheLibrarysReason) {
  EXPECT_OK(CudaStatus(cudaSuccess, "cudaSetDevice(0)"));
  absl::Status c = CudaStatus(cudaErrorInvalidDevice, "cudaSetDevice(3)");
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.message(), "cudaSetDevice(3) failed: ")) << c;
  EXPECT_TRUE(absl::StrContains(c.message(), "cudaErrorInvalidDevice")) << c;
  EXPECT_OK(NcclStatus(ncclSuccess, "ncclAllReduce"));
  absl::Status n = NcclStatus(ncclInvalidArgument, "ncclAllReduce");
  EXPECT_FALSE(n.ok());
  EXPECT_TRUE(absl::StrContains(n.message(), "ncclAllReduce failed: ")) << n;
  EXPECT_TRUE(absl::StrContains(n.message(), ncclGetErrorString(ncclInvalidArgument))) << n;
  EXPECT_EQ(n.code(), absl::StatusCode::kInternal);
  // A peer or the network: the store then waits for the scheduler to name the dead peer.
  EXPECT_EQ(NcclStatus(ncclRemoteError, "ncclGroupEnd").code(), absl::StatusCode::kUnavailable);
}

// Runs everywhere: without a GPU (here, CI) device 0 does not exist; with GPUs, the
// device one past the last does not.
TEST(NcclTest, AMissingDeviceIsAClearErrorNotACrash) {
  auto count = CudaDeviceCount();
  const int missing = count.ok() ? *count : 0;
  absl::Status s = UseDevice(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("cannot use GPU ", missing))) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("cudaSetDevice(", missing, ") failed")))
      << s;
  // Creating a communicator there fails the same way, before any NCCL call.
  auto comm = NcclComm::Create(0, 1, missing, std::string(NCCL_UNIQUE_ID_BYTES, '\0'),
                               absl::Now() + absl::Seconds(5), nullptr);
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::StrContains(comm.status().message(), "cannot use GPU")) << comm.status();
  auto bad_id = NcclComm::Create(0, 1, 0, "short", absl::Now() + absl::Seconds(5), nullptr);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridps
