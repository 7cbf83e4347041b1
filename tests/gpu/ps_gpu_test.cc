// dist_hybrid on GPU tensors (host staging, worker/gpu/gpu_staging.h) with the real CUDA
// runtime. Needs one GPU: every test skips, saying so, where cudaGetDeviceCount reports
// none. The jobs run in this process (LocalCluster: scheduler, servers and workers as
// threads over inproc://); every worker uses GPU 0 (staging involves no NCCL, so several
// workers may share a GPU).
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
#include "worker/ps/ps_gpu.h"

namespace hybridps::testing {
namespace {

struct Shape {
  int workers;
  int servers;
  int local_size;
};

class PsGpuTest : public ::testing::TestWithParam<Shape> {
 protected:
  int n() const { return GetParam().workers; }
  void SetUp() override {
    const int devices = Devices();
    if (devices < 1) {
      GTEST_SKIP() << "needs a GPU, cudaGetDeviceCount reports " << devices << ": not run";
    }
    ClusterConfig c;
    c.workers = GetParam().workers;
    c.servers = GetParam().servers;
    c.local_size = GetParam().local_size;
    c.partition_bytes = 64 << 10;  // several partitions per tensor
    // Host staging: every rank's tensors are on GPU 0 (NCCL's node reduction: tests/multiproc).
    c.worker_options = [](int, Options* o) { o->gpu_local_reduce = "host"; };
    auto cl = LocalCluster::Start(c);
    ASSERT_OK(cl);
    cluster_ = std::move(*cl);
  }
  GpuStager::Stats Stats(int w) {
    auto* s = dynamic_cast<PsGpuStore*>(cluster_->worker(w));
    EXPECT_NE(s, nullptr) << "a CUDA build's dist_hybrid store is a PsGpuStore";
    return s ? s->staging_stats() : GpuStager::Stats{};
  }
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_P(PsGpuTest, EveryDTypeSumsExactlyInPlaceAndOutOfPlaceOverRounds) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    int salt = 0;
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                        DType::kInt32, DType::kInt64, DType::kUInt8}) {
      ++salt;
      DeviceBuffer in(dtype, 50001, 0), out(dtype, 50001, 0);
      for (int round = 0; round < 3; ++round) {
        in.Fill(rank, round, salt);
        const bool in_place = round != 1;
        absl::Status s = kv->PushPull(absl::StrCat("t.", DTypeName(dtype)), in.view(),
                                      in_place ? in.view() : out.view());
        ASSERT_OK(s);
        DeviceBuffer& got = in_place ? in : out;
        got.Refetch();
        for (size_t i = 0; i < 50001; ++i) {
          ASSERT_EQ(got.at(i), SumOver(n(), i, round, salt))
              << DTypeName(dtype) << " round " << round << " element " << i;
        }
      }
    }
  });
  GpuStager::Stats st = Stats(0);
  EXPECT_EQ(st.gpu_ops, 21u);
  EXPECT_EQ(st.host_allocations, 7u);  // one pinned buffer per name, reused
}

// Three push_pulls of one GPU tensor in place without waiting in between: each reads what
// the one before copied back (n^2 times the sum in the end); another name passes them.
TEST_P(PsGpuTest, InPlaceOperationsInARowReadTheEarlierResult) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    DeviceBuffer x(DType::kInt64, 300000, 0), other(DType::kFloat32, 300000, 0);
    x.Fill(rank, 0, 5);
    other.Fill(rank, 0, 6);
    std::vector<Handle> hs;
    for (int k = 0; k < 3; ++k) {
      auto h = kv->PushPullAsync("x", x.view(), x.view(), 0);
      ASSERT_OK(h);
      hs.push_back(*h);
    }
    absl::Status s = kv->PushPull("other", other.view(), other.view());
    ASSERT_OK(s);
    for (Handle& h : hs) ASSERT_OK(h.Wait());
    for (size_t i = 0; i < 300000; i += 7) {
      ASSERT_EQ(x.at(i), n() * n() * SumOver(n(), i, 0, 5)) << "element " << i;
      ASSERT_EQ(other.at(i), SumOver(n(), i, 0, 6)) << "element " << i;
    }
  });
  EXPECT_EQ(Stats(0).held_ops, 2u);
}

TEST_P(PsGpuTest, BroadcastFromEveryRoot) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int root = 0; root < n(); ++root) {
      DeviceBuffer b(DType::kFloat32, 100000, 0);
      b.Fill(rank, 1, root);
      absl::Status s = kv->Broadcast("w", b.view(), root);
      ASSERT_OK(s);
      for (size_t i = 0; i < 100000; ++i) ASSERT_EQ(b.at(i), Value(i, root, 1, root));
    }
  });
}

// CPU and GPU tensors in one store, also on one name, many in flight at once.
TEST_P(PsGpuTest, MixedCpuAndGpuTensorsInFlightTogether) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    constexpr int kTensors = 12;
    std::vector<std::unique_ptr<DeviceBuffer>> gpu;
    std::vector<std::unique_ptr<Buffer>> cpu;
    for (int k = 0; k < kTensors; ++k) {
      gpu.push_back(std::make_unique<DeviceBuffer>(DType::kInt32, 1000 + 5000 * k, 0));
      cpu.push_back(std::make_unique<Buffer>(DType::kInt32, 1000 + 5000 * k));
    }
    for (int round = 0; round < 2; ++round) {
      std::vector<Handle> hs;
      for (int k = 0; k < kTensors; ++k) {
        gpu[k]->Fill(rank, round, k);
        cpu[k]->Fill(rank, round + 10, k);
        // Names alternate: "g<k>" GPU only; "c<k>" a GPU round then a CPU round.
        auto h = kv->PushPullAsync(absl::StrCat("g", k), gpu[k]->view(), gpu[k]->view(), k);
        ASSERT_OK(h);
        hs.push_back(*h);
        auto c = kv->PushPullAsync(absl::StrCat("c", k), cpu[k]->view(), cpu[k]->view());
        ASSERT_OK(c);
        hs.push_back(*c);
      }
      for (Handle& h : hs) ASSERT_OK(h.Wait());
      for (int k = 0; k < kTensors; ++k) {
        gpu[k]->Refetch();
        for (size_t i = 0; i < cpu[k]->count; i += 7) {
          ASSERT_EQ(gpu[k]->at(i), SumOver(n(), i, round, k)) << "g" << k << " element " << i;
          ASSERT_EQ(cpu[k]->at(i), SumOver(n(), i, round + 10, k)) << "c" << k;
        }
      }
    }
  });
}

TEST_P(PsGpuTest, ServerOptimizerSgdOnGpuTensors) {
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    ServerOptimizer opt;
    opt.spec.rule = "sgd";
    opt.spec.params["learning_rate"] = 0.5;
    absl::Status s = kv->SetOptimizer(opt);
    ASSERT_OK(s);
    DeviceBuffer w(DType::kFloat32, 30000, 0), g(DType::kFloat32, 30000, 0);
    w.Fill(0, 0, 1);
    ASSERT_OK(kv->Broadcast("w", w.view(), 0));
    std::vector<double> want(30000);
    for (size_t i = 0; i < want.size(); ++i) want[i] = Value(i, 0, 0, 1);
    for (int step = 0; step < 3; ++step) {
      g.Fill(rank, step, 2);
      s = kv->PushPull("w", g.view(), w.view());
      ASSERT_OK(s);
      w.Refetch();
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] -= 0.5 * SumOver(n(), i, step, 2);
        ASSERT_EQ(w.at(i), want[i]) << "step " << step << " element " << i;
      }
    }
  });
}

// What the CUDA runtime tells the submission checks: a host pointer labelled GPU, a
// device the process does not have, mixed devices.
TEST_P(PsGpuTest, RefusalsAtSubmissionNameTheTensor) {
  if (n() != 1) GTEST_SKIP() << "one shape is enough";
  KVStore* kv = cluster_->worker(0);
  DeviceBuffer d(DType::kFloat32, 10, 0);
  std::vector<float> host(10);
  TensorView fake{host.data(), 10, DType::kFloat32, Device::kGPU, 0};
  auto h = kv->PushPullAsync("host", fake, fake);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << h.status();
  EXPECT_TRUE(absl::StrContains(h.status().message(), "not memory of GPU 0")) << h.status();
  TensorView cpu{host.data(), 10, DType::kFloat32};
  h = kv->PushPullAsync("mixed", d.view(), cpu);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::StrContains(h.status().message(), "'mixed'")) << h.status();
  TensorView far = d.view();
  far.device_id = Devices();  // one past the last device
  h = kv->PushPullAsync("far", far, far);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::StrContains(h.status().message(), "'far'")) << h.status();
  ASSERT_OK(kv->PushPull("ok", d.view(), d.view()));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PsGpuTest,
    ::testing::Values(Shape{1, 1, 1}, Shape{3, 2, 1}, Shape{4, 2, 2}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      return absl::StrCat("w", info.param.workers, "s", info.param.servers, "l",
                          info.param.local_size);
    });

}  // namespace
}  // namespace hybridps::testing
