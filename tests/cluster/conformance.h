// The conformance suite's fixture (conformance_test.cc, conformance_mismatch_test.cc):
// one parameter per backend, transport and layout, the cluster it starts, and the staging
// stand-in for GPU tensors. The parameters are instantiated in conformance_test.cc.
#ifndef HYBRIDPS_TESTS_CLUSTER_CONFORMANCE_H_
#define HYBRIDPS_TESTS_CLUSTER_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "tests/cluster/host_collectives.h"
#include "tests/cluster/host_copier.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/forwarding_store.h"
#include "worker/gpu/gpu_staging.h"
#include "worker/ps/local/node_gpu_reduce.h"
#include "worker/ps/ps_store.h"

namespace hybridps::testing {

struct Param {
  std::string backend;
  std::string transport;
  int workers;
  int servers;  // dist_hybrid only
  int local = 1;  // dist_hybrid: local ranks per node (reduced in shared memory first)
  bool staged = false;  // dist_hybrid through GPU staging on the host stand-in
  bool helpers = true;  // staged: threads waiting on a handle run the staging steps
  // Settings other than the defaults, and a word for the test's name.
  std::string variant = {};
  std::function<void(ClusterConfig*)> tweak = nullptr;
  // staged, nodes of several local ranks: push_pulls through the node's GPU reduction
  // (HYBRIDPS_GPU_LOCAL_REDUCE=nccl) on stand-ins for CUDA and NCCL.
  bool node_gpu = false;
};

inline std::string Name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  std::string name = absl::StrCat(p.backend == "dist_allreduce" ? "allreduce" : "hybrid", "_",
                                  p.transport, "_w", p.workers);
  if (p.backend != "dist_allreduce") absl::StrAppend(&name, "_s", p.servers);
  if (p.local > 1) absl::StrAppend(&name, "_l", p.local);
  if (p.staged) absl::StrAppend(&name, p.helpers ? "_staged" : "_staged_nohelp");
  if (p.node_gpu) absl::StrAppend(&name, "_node_nccl");
  if (!p.variant.empty()) absl::StrAppend(&name, "_", p.variant);
  return name;
}

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                DType::kUInt8};

// A worker's store seen through dist_hybrid's GPU staging layer (worker/gpu/gpu_staging.h)
// with the host stand-in for the GPU: every tensor handed in is taken as memory of GPU 0,
// copied to a staging buffer, reduced by the worker's store and copied back. With a node
// reducer (AttachNode), push_pulls take the node's GPU reduction instead, routed as
// PsGpuStore routes them.
class StagedStore : public ForwardingStore {
 public:
  StagedStore(KVStore* inner, absl::Duration timeout, bool helpers)
      : inner_(inner), shared_(std::make_shared<HostCopier::Shared>()) {
    // Copy times that differ by worker, so that the workers' copies end in other orders.
    stager_ = std::make_unique<GpuStager>(
        std::make_unique<HostCopier>(shared_, 1, absl::Microseconds(20) * (inner->rank() + 1),
                                     HostCopier::Faults{}),
        BackendOf(inner), inner->num_workers(), timeout, helpers);
  }
  ~StagedStore() override { Shutdown().IgnoreError(); }

  // The node's GPU reduction over this worker's store (collective: every local rank of
  // the node at once).
  absl::Status AttachNode(const Options& options) {
    auto* ps = PsOf(inner_);
    if (ps == nullptr) return absl::InvalidArgumentError("not a dist_hybrid store");
    ASSIGN_OR_RETURN(node_, NodeGpuReducer::Create(
                                options, ps->layout(),
                                std::make_unique<HostCopier>(shared_, 1, absl::Microseconds(20),
                                                             HostCopier::Faults{}),
                                ps, [](ShmAllreduce* ex, const NodeLayout& layout) {
                                  return MakeHostCollectives(ex, layout);
                                }));
    return absl::OkStatus();
  }

  absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor,
                                        int root_rank, int priority) override {
    return stager_->BroadcastAsync(name, OnGpu(tensor), root_rank, priority);
  }
  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority) override {
    if (node_ && in.count > 0 && in.count == out.count && in.dtype == out.dtype &&
        in.data != nullptr && out.data != nullptr) {
      return node_->PushPullAsync(name, OnGpu(in), OnGpu(out), priority);
    }
    return stager_->PushPullAsync(name, OnGpu(in), OnGpu(out), priority);
  }
  absl::Status Shutdown() override {
    if (node_) node_->Shutdown();
    stager_->Shutdown();
    return absl::OkStatus();  // the cluster shuts the worker's store down
  }

 private:
  KVStore& target() const override { return *inner_; }
  TensorView OnGpu(TensorView t) {
    if (t.data != nullptr && t.count > 0) {
      absl::MutexLock lock(&shared_->mu);
      shared_->memory[static_cast<const char*>(t.data)] = {t.bytes(), 0};
    }
    t.device = Device::kGPU;
    t.device_id = 0;
    return t;
  }

  KVStore* inner_;
  std::shared_ptr<HostCopier::Shared> shared_;
  std::unique_ptr<GpuStager> stager_;
  std::unique_ptr<NodeGpuReducer> node_;
};

// A cluster and, for staged parameters, the staging stores in front of its workers
// (destroyed first).
struct Job {
  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::unique_ptr<StagedStore>> staged;

  KVStore* worker(int i) { return staged.empty() ? cluster->worker(i) : staged[i].get(); }
  // Worker i leaves the job in order (its stores shut down).
  void Leave(int i) {
    if (!staged.empty()) {
      EXPECT_OK(staged[i]->Shutdown());
    }
    EXPECT_OK(cluster->worker(i)->Shutdown());
  }
  void RunOnWorkers(const std::function<void(int, KVStore*)>& fn) {
    cluster->RunOnWorkers([&](int rank, KVStore*) { fn(rank, worker(rank)); });
  }
};

class ConformanceTest : public ::testing::TestWithParam<Param> {
 protected:
  ClusterConfig Config() const {
    ClusterConfig c;
    c.backend = GetParam().backend;
    c.transport = GetParam().transport;
    c.workers = GetParam().workers;
    c.servers = GetParam().servers;
    c.local_size = GetParam().local;
    c.partition_bytes = 1024;  // small tensors still span partitions (dist_hybrid)
    // Death detection is not under test here; on a loaded 2-core machine a thread can
    // stall for a second.
    c.heartbeat_timeout = absl::Seconds(5);
    c.op_timeout = absl::Seconds(60);
    if (GetParam().tweak) GetParam().tweak(&c);
    return c;
  }
  std::unique_ptr<Job> Start(const ClusterConfig& c) {
    auto cl = LocalCluster::Start(c);
    EXPECT_OK(cl);
    if (!cl.ok()) return nullptr;
    auto job = std::make_unique<Job>();
    job->cluster = std::move(*cl);
    for (int w = 0; GetParam().staged && w < job->cluster->num_workers(); ++w) {
      job->staged.push_back(std::make_unique<StagedStore>(job->cluster->worker(w), c.op_timeout,
                                                          GetParam().helpers));
    }
    if (GetParam().node_gpu) {
      Options o = job->cluster->options();
      o.op_timeout = c.op_timeout;
      o.heartbeat_timeout = c.heartbeat_timeout;
      job->RunOnWorkers([&](int rank, KVStore*) {
        absl::Status s = job->staged[rank]->AttachNode(o);
        EXPECT_OK(s);
      });
    }
    return job;
  }
  int n() const { return GetParam().workers; }
};

// The same checks for what needs two workers or more (mismatches between them, a worker
// missing or leaving): instantiated on the layouts of several workers only.
class MultiWorkerTest : public ConformanceTest {};

// Every layout the suites run on (conformance_test.cc).
std::vector<Param> Params();

// The exact sum over ranks of element i of tensor `salt` in `round`.
inline double Sum(size_t i, int n, int round, int salt) {
  double want = 0;
  for (int r = 0; r < n; ++r) want += Value(i, r, round, salt);
  return want;
}

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_CONFORMANCE_H_
