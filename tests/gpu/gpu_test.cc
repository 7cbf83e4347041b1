// dist_allreduce on GPU tensors (NCCL). Needs a GPU: every test skips, saying so, where
// cudaGetDeviceCount reports fewer devices than it needs. The jobs run in this process
// (scheduler and workers as threads, LocalCluster), worker r on GPU r, so the 1-rank
// variants need one GPU and the 2-rank ones two: NCCL refuses two ranks of one
// communicator on one GPU of one host, and NCCL_HOSTID, which lets the multi-process
// tests (test_multiproc.py, --shared-gpu) run two ranks on one GPU, is read once per
// process.
//
// Run on an H100 on 2026-11-25: the 1-rank variants pass; the 2-rank ones skip there.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/gpu/device_buffer.h"
#include "tests/status_matchers.h"
#include "worker/allreduce/allreduce_store.h"

namespace hybridps::testing {
namespace {

class GpuTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  void SetUp() override {
    const int devices = Devices();
    if (devices < n()) {
      GTEST_SKIP() << "needs " << n() << " GPU(s), cudaGetDeviceCount reports " << devices
                   << ": not run (multiproc_gpu runs two ranks on one GPU)";
    }
    ClusterConfig c;
    c.backend = "dist_allreduce";
    c.workers = n();
    c.op_timeout = absl::Seconds(60);  // the first collective also creates the communicator
    auto cl = LocalCluster::Start(c);
    ASSERT_OK(cl);
    cluster_ = std::move(*cl);
  }
  AllreduceStore::Stats Stats(int w) {
    return dynamic_cast<AllreduceStore*>(cluster_->worker(w))->stats();
  }
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_P(GpuTest, SumsAreExactOverRoundsInPlaceAndOutOfPlace) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    for (DType dtype : {DType::kInt32, DType::kFloat32}) {
      DeviceBuffer in(dtype, 1001, rank), out(dtype, 1001, rank);
      for (int round = 0; round < 4; ++round) {
        in.Fill(rank, round, 0);
        const bool in_place = round % 2 == 0;
        absl::Status s = kv->PushPull(absl::StrCat("g.", DTypeName(dtype)), in.view(),
                                      in_place ? in.view() : out.view());
        ASSERT_OK(s);
        DeviceBuffer& got = in_place ? in : out;
        got.Refetch();
        for (size_t i = 0; i < 1001; ++i) {
          ASSERT_EQ(got.at(i), SumOver(n(), i, round, 0))
              << DTypeName(dtype) << " round " << round << " element " << i;
        }
      }
    }
  });
  EXPECT_GT(Stats(0).nccl_tensors, 0u);
}

TEST_P(GpuTest, EveryDTypeSumsExactly) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    int salt = 0;
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                        DType::kInt32, DType::kInt64, DType::kUInt8}) {
      DeviceBuffer b(dtype, 257, rank);
      b.Fill(rank, 0, ++salt);
      absl::Status s = kv->PushPull(absl::StrCat("t.", DTypeName(dtype)), b.view(), b.view());
      ASSERT_OK(s);
      for (size_t i = 0; i < 257; ++i) {
        ASSERT_EQ(b.at(i), SumOver(n(), i, 0, salt)) << DTypeName(dtype) << " element " << i;
      }
    }
  });
}

TEST_P(GpuTest, BroadcastFromEveryRoot) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int root = 0; root < n(); ++root) {
      DeviceBuffer b(DType::kFloat32, 333, rank);
      b.Fill(rank, 1, root);
      absl::Status s = kv->Broadcast("w", b.view(), root);
      ASSERT_OK(s);
      for (size_t i = 0; i < 333; ++i) ASSERT_EQ(b.at(i), Value(i, root, 1, root));
    }
  });
}

// Many small tensors in flight: one NCCL group per fusion bucket; sizes 0 and 1 too.
TEST_P(GpuTest, ManySmallTensorsShareNcclGroups) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<std::unique_ptr<DeviceBuffer>> bufs;
    std::vector<Handle> handles;
    for (int i = 0; i < 24; ++i) {
      const size_t count = i == 0 ? 0 : i == 1 ? 1 : 1000 + i;
      bufs.push_back(std::make_unique<DeviceBuffer>(DType::kFloat32, count, rank));
      bufs.back()->Fill(rank, 0, i);
    }
    for (int i = 0; i < 24; ++i) {  // all at once: they are ready in the same round
      auto h = kv->PushPullAsync(absl::StrCat("s", i), bufs[i]->view(), bufs[i]->view(), i % 3);
      ASSERT_OK(h);
      handles.push_back(*h);
    }
    for (auto& h : handles) ASSERT_OK(h.Wait());
    for (int i = 2; i < 24; ++i) {
      for (size_t k = 0; k < 1000; k += 37) ASSERT_EQ(bufs[i]->at(k), SumOver(n(), k, 0, i));
    }
  });
  AllreduceStore::Stats s = Stats(0);
  EXPECT_EQ(s.nccl_tensors, 24u);
  EXPECT_LT(s.nccl_groups, 24u);  // fused: fewer launches than tensors
}

// CPU tensors (Gloo) and GPU tensors (NCCL) in one store, in flight together, in a
// different submission order on every rank.
TEST_P(GpuTest, CpuAndGpuTensorsMixInOneStore) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<std::unique_ptr<DeviceBuffer>> gpu;
    std::vector<Buffer> cpu;
    for (int i = 0; i < 6; ++i) {
      gpu.push_back(std::make_unique<DeviceBuffer>(DType::kInt32, 50000, rank));
      gpu.back()->Fill(rank, 0, i);
      cpu.emplace_back(DType::kInt32, 50000);
      cpu.back().Fill(rank, 0, 100 + i);
    }
    std::vector<Handle> handles;
    for (int j = 0; j < 6; ++j) {
      const int i = rank % 2 == 0 ? j : 5 - j;
      auto g = kv->PushPullAsync(absl::StrCat("gpu", i), gpu[i]->view(), gpu[i]->view());
      auto c = kv->PushPullAsync(absl::StrCat("cpu", i), cpu[i].view(), cpu[i].view());
      ASSERT_TRUE(g.ok() && c.ok()) << g.status() << c.status();
      handles.push_back(*g);
      handles.push_back(*c);
    }
    for (auto& h : handles) ASSERT_OK(h.Wait());
    for (int i = 0; i < 6; ++i) {
      for (size_t k = 0; k < 50000; k += 997) {
        ASSERT_EQ(gpu[i]->at(k), SumOver(n(), k, 0, i));
        ASSERT_EQ(cpu[i].at(k), SumOver(n(), k, 0, 100 + i));
      }
    }
  });
  AllreduceStore::Stats s = Stats(0);
  EXPECT_EQ(s.nccl_tensors, 6u);
  EXPECT_GT(s.allreduces + s.eager, 0u);
}

TEST_P(GpuTest, MismatchedSizesAndDevicesAreNamedErrors) {
  if (n() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  std::vector<absl::Status> size(n()), device(n());
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    DeviceBuffer b(DType::kFloat32, 10 + 2 * rank, rank);
    size[rank] = kv->PushPull("bad", b.view(), b.view());
    // Rank 0 on the GPU, the others on the CPU.
    Buffer host(DType::kFloat32, 10);
    DeviceBuffer g(DType::kFloat32, 10, rank);
    device[rank] = kv->PushPull("where", rank == 0 ? g.view() : host.view(),
                                rank == 0 ? g.view() : host.view());
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(size[r].code(), absl::StatusCode::kInvalidArgument) << size[r];
    EXPECT_TRUE(absl::StrContains(size[r].message(), "'bad'")) << size[r];
    EXPECT_TRUE(absl::StrContains(size[r].message(), "10 float32 elements on GPU")) << size[r];
    EXPECT_EQ(device[r].code(), absl::StatusCode::kInvalidArgument) << device[r];
    EXPECT_TRUE(absl::StrContains(device[r].message(), "'where'")) << device[r];
  }
}

TEST_P(GpuTest, TensorsThisWorkerCannotReduceAreRefusedAtSubmission) {
  if (n() > 1) GTEST_SKIP() << "local checks: one rank is enough";
  KVStore* kv = cluster_->worker(0);
  float host[4] = {};
  TensorView fake{host, 4, DType::kFloat32, Device::kGPU, 0};  // host memory
  auto h = kv->PushPullAsync("fake", fake, fake);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::StrContains(h.status().message(), "not memory of GPU 0")) << h.status();
  DeviceBuffer b(DType::kFloat32, 4, 0);
  TensorView elsewhere = b.view();
  elsewhere.device_id = Devices();  // no such device
  h = kv->PushPullAsync("elsewhere", elsewhere, elsewhere);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::StrContains(h.status().message(), "'elsewhere'")) << h.status();
  Buffer cpu(DType::kFloat32, 4);
  h = kv->PushPullAsync("mixed", b.view(), cpu.view());
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return absl::StrCat("w", p.param);
                         });

}  // namespace
}  // namespace hybridps::testing
