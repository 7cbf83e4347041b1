// One conformance suite for every KVStore backend: the same tests, unchanged, against
// dist_hybrid (parameter server) and dist_allreduce (Gloo), over several transports and
// 1-4 workers, all in one process; and against dist_hybrid's GPU staging layer on a
// host-memory stand-in for the GPU ("staged": every tensor is taken as GPU memory). Exact
// sums over rounds in every dtype, sizes 0, 1, odd and large (and empty without data),
// many tensors in flight with mixed priorities and per-rank issue orders, in-place and
// out-of-place, broadcast from every root, and the failures users hit:
// mismatched operations (a named error on every rank) and a rank that never submits (a
// named error at the deadline).
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
#include "worker/gpu/gpu_staging.h"
#include "worker/ps/local/node_gpu_reduce.h"
#include "worker/ps/ps_store.h"
#if HYBRIDPS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hybridps::testing {
namespace {

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

std::string Name(const ::testing::TestParamInfo<Param>& info) {
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

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                DType::kUInt8};

::testing::AssertionResult Mentions(absl::string_view text, absl::string_view what) {
  if (absl::StrContains(text, what)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << what << "' not in: " << text;
}

// A worker's store seen through dist_hybrid's GPU staging layer (worker/gpu/gpu_staging.h)
// with the host stand-in for the GPU: every tensor handed in is taken as memory of GPU 0,
// copied to a staging buffer, reduced by the worker's store and copied back. With a node
// reducer (AttachNode), push_pulls take the node's GPU reduction instead, routed as
// PsGpuStore routes them.
class StagedStore : public KVStore {
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

  absl::string_view type() const override { return inner_->type(); }
  int rank() const override { return inner_->rank(); }
  int num_workers() const override { return inner_->num_workers(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_size() const override { return inner_->local_size(); }
  int cross_rank() const override { return inner_->cross_rank(); }
  int cross_size() const override { return inner_->cross_size(); }
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
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status SetGradientCompression(const GradientCompression& c,
                                      absl::string_view prefix = "") override {
    return inner_->SetGradientCompression(c, prefix);
  }
  bool IsCapable(Capability capability) const override {
    return inner_->IsCapable(capability);
  }
  absl::Status Shutdown() override {
    if (node_) node_->Shutdown();
    stager_->Shutdown();
    return absl::OkStatus();  // the cluster shuts the worker's store down
  }

 private:
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

// The exact sum over ranks of element i of tensor `salt` in `round`.
double Sum(size_t i, int n, int round, int salt) {
  double want = 0;
  for (int r = 0; r < n; ++r) want += Value(i, r, round, salt);
  return want;
}

TEST_P(ConformanceTest, ExactSumsOverRoundsInEveryDTypeAndSize) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  const std::vector<size_t> sizes = {0, 1, 7, 65, 1000, 4099, 100003};
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    struct T {
      std::string name;
      Buffer in, out;
      bool inplace;
    };
    std::vector<T> tensors;
    for (DType dt : kAllDTypes) {
      for (size_t size : sizes) {
        const bool inplace = tensors.size() % 2 == 0;
        tensors.push_back(T{absl::StrCat(DTypeName(dt), "/", size), Buffer(dt, size),
                            Buffer(dt, size), inplace});
      }
    }
    for (int round = 0; round < 3; ++round) {
      std::vector<Handle> handles;
      for (size_t t = 0; t < tensors.size(); ++t) {
        T& x = tensors[t];
        x.in.Fill(rank, round, static_cast<int>(t));
        auto h = kv->PushPullAsync(x.name, x.in.view(), x.inplace ? x.in.view() : x.out.view(),
                                   /*priority=*/static_cast<int>(t % 5) - 2);
        ASSERT_OK(h);
        handles.push_back(*h);
      }
      for (auto& h : handles) ASSERT_OK(h.Wait());
      for (size_t t = 0; t < tensors.size(); ++t) {
        T& x = tensors[t];
        const Buffer& result = x.inplace ? x.in : x.out;
        for (size_t i = 0; i < x.in.count; ++i) {
          ASSERT_EQ(result.at(i), Sum(i, n(), round, static_cast<int>(t)))
              << x.name << " element " << i << " round " << round;
        }
        for (size_t i = 0; !x.inplace && i < x.in.count; ++i) {  // the input is untouched
          ASSERT_EQ(x.in.at(i), Value(i, rank, round, static_cast<int>(t))) << x.name;
        }
      }
    }
  });
}

TEST_P(ConformanceTest, LargeTensorsInPlaceAndOutOfPlace) {
  ClusterConfig c = Config();
  c.partition_bytes = 4 << 20;
  auto cluster = Start(c);
  ASSERT_NE(cluster, nullptr);
  const size_t count = (10 << 20) / 4 + 3;  // 10 MiB and an odd tail
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer a(DType::kFloat32, count), out(DType::kFloat32, count);
    for (int round = 0; round < 2; ++round) {
      a.Fill(rank, round, 1);
      const bool inplace = round == 0;
      ASSERT_TRUE(kv->PushPull("big", a.view(), inplace ? a.view() : out.view()).ok());
      const Buffer& result = inplace ? a : out;
      for (size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(result.at(i), Sum(i, n(), round, 1)) << i;
      }
      ASSERT_EQ(result.at(count - 1), Sum(count - 1, n(), round, 1));
    }
  });
}

// Each rank issues the same tensors in its own order, with mixed priorities; some names
// get two operations in a row (they must run in issue order).
TEST_P(ConformanceTest, ManyTensorsInFlightInPerRankOrders) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  constexpr int kTensors = 60;
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<Buffer> bufs;
    for (int i = 0; i < kTensors; ++i) {
      const size_t size = static_cast<size_t>((i * 7919) % 5000 + (i % 3 == 0 ? 20000 : 0));
      bufs.emplace_back(i % 2 ? DType::kFloat32 : DType::kInt32, size);
    }
    std::vector<int> order(kTensors);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(1000 + rank));
    std::vector<std::pair<int, Handle>> handles, again;
    for (int i : order) {
      bufs[i].Fill(rank, 0, i);
      auto h = kv->PushPullAsync(absl::StrCat("t", i), bufs[i].view(), bufs[i].view(),
                                 /*priority=*/(i * 31) % 7 - 3);
      ASSERT_OK(h);
      handles.emplace_back(i, *h);
      if (i % 10 == 0) {
        // A second push_pull of the same tensor, in place, with a higher priority: it must
        // still run after the first (the result is then n times the sum).
        auto h2 = kv->PushPullAsync(absl::StrCat("t", i), bufs[i].view(), bufs[i].view(), 5);
        ASSERT_OK(h2);
        again.emplace_back(i, *h2);
      }
    }
    for (auto& [i, h] : handles) ASSERT_OK(h.Wait()) << "t" << i;
    for (auto& [i, h] : again) ASSERT_OK(h.Wait()) << "t" << i;
    for (int i = 0; i < kTensors; ++i) {
      const double times = i % 10 == 0 ? n() : 1;
      for (size_t k = 0; k < bufs[i].count; k += 13) {
        ASSERT_EQ(bufs[i].at(k), times * Sum(k, n(), 0, i)) << "t" << i << " element " << k;
      }
    }
    ASSERT_OK(kv->Barrier());
  });
}

TEST_P(ConformanceTest, BroadcastFromEveryRootInEveryDType) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int root = 0; root < n(); ++root) {
      std::vector<Buffer> bufs;
      std::vector<Handle> handles;
      int salt = 0;
      for (DType dt : kAllDTypes) {
        for (size_t size : {size_t{0}, size_t{1}, size_t{333}, size_t{70001}}) {
          bufs.emplace_back(dt, size);
        }
      }
      for (Buffer& b : bufs) {
        b.Fill(rank, root, salt);
        auto h = kv->BroadcastAsync(absl::StrCat("w", salt), b.view(), root, salt % 3);
        ASSERT_OK(h);
        handles.push_back(*h);
        ++salt;
      }
      for (auto& h : handles) ASSERT_OK(h.Wait());
      for (size_t t = 0; t < bufs.size(); ++t) {
        for (size_t i = 0; i < bufs[t].count; i += 7) {
          ASSERT_EQ(bufs[t].at(i), Value(i, root, root, static_cast<int>(t)))
              << "root " << root << " tensor " << t << " element " << i;
        }
      }
    }
    // A broadcast and a push_pull on one name keep their order (the node's GPU reduction
    // refuses them in flight together instead: node_gpu_reduce_test.cc).
    if (GetParam().node_gpu) return;
    Buffer x(DType::kFloat32, 100);
    x.Fill(rank, 0, 3);
    auto hb = kv->BroadcastAsync("mixed", x.view(), n() - 1);
    auto hp = kv->PushPullAsync("mixed", x.view(), x.view());
    ASSERT_TRUE(hb.ok() && hp.ok());
    ASSERT_OK(hb->Wait());
    ASSERT_OK(hp->Wait());
    for (size_t i = 0; i < x.count; ++i) ASSERT_EQ(x.at(i), n() * Value(i, n() - 1, 0, 3));
    EXPECT_FALSE(kv->IsCapable(Capability::kOptimizer) && GetParam().backend == "dist_allreduce");
  });
}

// An empty tensor may come without a data pointer; it still takes part in every round.
TEST_P(ConformanceTest, EmptyTensorsWithoutDataTakePart) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    const TensorView none{nullptr, 0, DType::kFloat32};
    for (int round = 0; round < 2; ++round) {
      for (int root = 0; root < n(); ++root) {
        absl::Status s = kv->Broadcast("empty", none, root);
        ASSERT_OK(s) << "broadcast from " << root;
      }
      absl::Status s = kv->PushPull("empty", none, none);
      ASSERT_OK(s) << "push_pull: " << s;
    }
    // The name still works with data afterwards.
    Buffer b(DType::kFloat32, 5);
    b.Fill(rank, 0, 9);
    ASSERT_OK(kv->PushPull("after-empty", b.view(), b.view()));
    for (size_t i = 0; i < b.count; ++i) ASSERT_EQ(b.at(i), Sum(i, n(), 0, 9));
  });
}

// Arguments one worker can tell are wrong fail at once, on that worker, with an
// InvalidArgument naming the tensor and what is wrong; the job goes on.
TEST_P(ConformanceTest, BadArgumentsFailAtSubmissionNamingTheTensor) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer a(DType::kFloat32, 10), b(DType::kFloat32, 12), c(DType::kInt32, 10);
    auto refused = [&](const char* what, absl::StatusOr<Handle> h,
                       std::vector<std::string> words) {
      ASSERT_FALSE(h.ok()) << what << ": accepted";
      EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << what << ": "
                                                                       << h.status();
      words.push_back("'bad-");
      for (const std::string& w : words) EXPECT_TRUE(Mentions(h.status().message(), w)) << what;
    };
    refused("root -1", kv->BroadcastAsync("bad-root", a.view(), -1), {"-1"});
    refused("root n", kv->BroadcastAsync("bad-root", a.view(), n()), {absl::StrCat(n())});
    refused("counts", kv->PushPullAsync("bad-count", a.view(), b.view()), {"10", "12"});
    refused("dtypes", kv->PushPullAsync("bad-dtype", a.view(), c.view()),
            {"float32", "int32"});
    refused("no data", kv->PushPullAsync("bad-data", TensorView{nullptr, 4, DType::kFloat32},
                                         a.view()), {"4"});
    TensorView misshapen = a.view();  // a shape that does not hold the view's count
    const int64_t dims[] = {2, 3};
    misshapen.shape = TensorShape::Of(dims, 2);
    refused("shape", kv->PushPullAsync("bad-shape", misshapen, misshapen),
            {"(2, 3)", absl::StrCat(a.count)});
    refused("broadcast shape", kv->BroadcastAsync("bad-shape", misshapen, 0), {"(2, 3)"});
    misshapen.shape.ndim = kMaxShapeDims + 1;
    refused("dimensions", kv->PushPullAsync("bad-shape", misshapen, misshapen),
            {"dimensions"});
    // Nothing of it reached the job: the names still work.
    a.Fill(rank, 0, 3);
    absl::Status s = kv->PushPull("bad-count", a.view(), a.view());
    ASSERT_OK(s);
    for (size_t i = 0; i < a.count; ++i) ASSERT_EQ(a.at(i), Sum(i, n(), 0, 3));
  });
}

TEST_P(ConformanceTest, MismatchedSizesFailEveryRankNamingTheTensorAndSizes) {
  if (n() < 2) GTEST_SKIP() << "needs two workers";
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::Status> status(n());
  std::vector<absl::Duration> took(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer b(DType::kFloat32, rank == 0 ? 10 : 1000);
    b.Fill(rank, 0, 0);
    const absl::Time start = absl::Now();
    status[rank] = kv->PushPull("bad", b.view(), b.view());
    took[rank] = absl::Now() - start;
  });
  for (int rank = 0; rank < n(); ++rank) {
    const absl::Status& s = status[rank];
    ASSERT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Mentions(s.message(), "'bad'"));
    EXPECT_TRUE(Mentions(s.message(), "10 "));
    EXPECT_TRUE(Mentions(s.message(), "1000"));
    EXPECT_LT(took[rank], absl::Seconds(5)) << s;
  }
  // The job keeps working, on other names and on this one.
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (const char* name : {"good", "bad"}) {
      Buffer b(DType::kFloat32, 500);
      b.Fill(rank, 2, 4);
      absl::Status s = kv->PushPull(name, b.view(), b.view());
      ASSERT_OK(s) << name;
      for (size_t i = 0; i < b.count; ++i) ASSERT_EQ(b.at(i), Sum(i, n(), 2, 4)) << name;
    }
  });
}

// Push_pulls of one size whose shapes differ fail on every rank naming both shapes, every
// time (20 times; every other time the disagreeing rank arrives late).
TEST_P(ConformanceTest, MismatchedShapesOfOneSizeFailEveryRankNamingBoth) {
  if (n() < 2) GTEST_SKIP() << "needs two workers";
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  const int odd = n() - 1;
  for (int rep = 0; rep < 20; ++rep) {
    const std::string name = absl::StrCat("bad-shape-", rep);
    std::vector<absl::Status> status(n());
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      Buffer b(DType::kFloat32, rank == odd ? std::vector<int64_t>{17, 23, 57}
                                            : std::vector<int64_t>{17, 1311});
      b.Fill(rank, 0, 1);
      if (rank == odd && rep % 2 == 1) absl::SleepFor(absl::Milliseconds(5));
      status[rank] = kv->PushPull(name, b.view(), b.view());
    });
    for (int rank = 0; rank < n(); ++rank) {
      const absl::Status& s = status[rank];
      ASSERT_FALSE(s.ok()) << "repeat " << rep << ": worker " << rank << " succeeded";
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_TRUE(Mentions(s.message(), absl::StrCat("'", name, "'"))) << s;
      EXPECT_TRUE(Mentions(s.message(), "(17, 1311)")) << s;
      EXPECT_TRUE(Mentions(s.message(), "(17, 23, 57)")) << s;
    }
    if (::testing::Test::HasFailure()) return;
  }
  // Agreeing shapes, and a rank that gives none, still sum.
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer b = rank == 0 ? Buffer(DType::kFloat32, 6) : Buffer(DType::kFloat32, {2, 3});
    b.Fill(rank, 0, 2);
    ASSERT_OK(kv->PushPull("good-shape", b.view(), b.view()));
    for (size_t i = 0; i < b.count; ++i) ASSERT_EQ(b.at(i), Sum(i, n(), 0, 2));
  });
}

// MXNet's 2bit gradient compression: on dist_hybrid every pushed element becomes a
// multiple of the threshold (one per node: a node pushes its local ranks' sum), and what
// was not sent is carried to the next push, so over K rounds the outputs add up to K times
// the true sum within one threshold per node; tensors of other names are sent as they
// are. Stores without servers refuse it by name.
TEST_P(ConformanceTest, TwoBitCompressionSendsMultiplesOfTheThresholdAndLosesNothing) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  constexpr float kThreshold = 1.0f;
  constexpr int kRounds = 12;
  constexpr size_t kCount = 3000;  // several partitions in most configurations
  const int nodes = n() / GetParam().local;
  auto value = [](size_t i, int rank) {  // in [-0.2, 0.2]: a node's sum stays below 1
    return 0.05f * static_cast<float>(static_cast<int>((i * 7 + rank * 3) % 9) - 4);
  };
  std::vector<std::vector<double>> totals(n(), std::vector<double>(kCount, 0.0));
  std::vector<absl::Status> set(n());
  std::vector<std::string> stray(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    set[rank] = kv->SetGradientCompression({Compression::kTwoBit, kThreshold}, "compressed");
    if (!set[rank].ok()) return;
    Buffer b(DType::kFloat32, kCount);
    for (int round = 0; round < kRounds; ++round) {
      for (size_t i = 0; i < kCount; ++i) SetElement(DType::kFloat32, b.bytes.data(), i,
                                                     value(i, rank));
      ASSERT_OK(kv->PushPull("compressed", b.view(), b.view()));
      for (size_t i = 0; i < kCount; ++i) {
        const double q = b.at(i) / kThreshold;
        if (stray[rank].empty() && (q != std::round(q) || std::abs(q) > nodes)) {
          stray[rank] = absl::StrCat("round ", round, " element ", i, ": ", b.at(i));
        }
        totals[rank][i] += b.at(i);
      }
    }
    // Tensors of other names are sent as they are.
    Buffer plain(DType::kFloat32, 100);
    for (size_t i = 0; i < plain.count; ++i) {
      SetElement(DType::kFloat32, plain.bytes.data(), i, value(i, rank));
    }
    ASSERT_OK(kv->PushPull("plain", plain.view(), plain.view()));
    for (size_t i = 0; i < plain.count; ++i) {
      float sum = 0;
      for (int r = 0; r < n(); ++r) sum += value(i, r);
      ASSERT_NEAR(plain.at(i), sum, 1e-6) << "worker " << rank << " element " << i;
    }
  });
  if (GetParam().backend == "dist_allreduce") {
    for (const absl::Status& s : set) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
      EXPECT_TRUE(Mentions(s.message(), "dist_hybrid")) << s;
    }
    return;
  }
  for (int rank = 0; rank < n(); ++rank) {
    ASSERT_OK(set[rank]);
    EXPECT_EQ(stray[rank], "") << "worker " << rank << " got a value that was not sent";
    for (size_t i = 0; i < kCount; ++i) {
      double sum = 0;
      for (int r = 0; r < n(); ++r) sum += value(i, r);
      ASSERT_LE(std::abs(totals[rank][i] - kRounds * sum), nodes * kThreshold + 1e-4)
          << "worker " << rank << " element " << i;
    }
  }
  // A threshold that is not positive is refused, changing nothing.
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    absl::Status s = kv->SetGradientCompression({Compression::kTwoBit, -1.0f});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  });
}

TEST_P(ConformanceTest, MismatchedDTypesFailEveryRankNamingBoth) {
  if (n() < 2) GTEST_SKIP() << "needs two workers";
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::Status> status(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer b(rank == n() - 1 ? DType::kInt32 : DType::kFloat32, 100);
    status[rank] = kv->PushPull("bad", b.view(), b.view());
  });
  for (int rank = 0; rank < n(); ++rank) {
    const absl::Status& s = status[rank];
    ASSERT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Mentions(s.message(), "'bad'"));
    EXPECT_TRUE(Mentions(s.message(), "float32"));
    EXPECT_TRUE(Mentions(s.message(), "int32"));
  }
}

// Broadcasts whose ranks disagree on dtype (after a good broadcast of the same name), on
// size or on the root fail on every rank with an error naming the tensor and what
// differs, never hand out the root's bytes. Each case runs 20 times; every other time the
// disagreeing rank arrives late, after the root's part of the round could have ended.
TEST_P(ConformanceTest, MismatchedBroadcastsFailEveryRankNamingWhatDiffers) {
  if (n() < 2) GTEST_SKIP() << "needs two workers";
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  constexpr int kRepeats = 20;
  const int odd = n() - 1;  // the rank that disagrees
  struct Case {
    const char* what;
    std::function<std::pair<Buffer, int>(int rank)> make;  // the rank's tensor and root
    std::vector<std::string> words;                        // in every rank's error
  };
  const std::vector<Case> cases = {
      {"dtype",
       [&](int rank) {
         return std::pair{Buffer(rank == odd ? DType::kFloat32 : DType::kInt32, 100), 0};
       },
       {"int32", "float32"}},
      {"size",
       [&](int rank) { return std::pair{Buffer(DType::kFloat32, rank == odd ? 150 : 100), 0}; },
       {"100", "150"}},
      {"multi-partition size",
       [&](int rank) { return std::pair{Buffer(DType::kFloat32, rank == odd ? 10 : 1000), 0}; },
       {"10 ", "1000"}},
      {"root",
       [&](int rank) { return std::pair{Buffer(DType::kFloat32, 100), rank == odd ? odd : 0}; },
       {"root"}},
      {"shape",
       [&](int rank) {
         return std::pair{Buffer(DType::kFloat32, rank == odd ? std::vector<int64_t>{3, 2}
                                                              : std::vector<int64_t>{2, 3}),
                          0};
       },
       {"(2, 3)", "(3, 2)"}},
  };
  for (const Case& c : cases) {
    for (int rep = 0; rep < kRepeats; ++rep) {
      const std::string name = absl::StrCat("bad-bcast-", c.what, "-", rep);
      std::vector<absl::Status> status(n());
      std::vector<std::vector<double>> got(n());
      cluster->RunOnWorkers([&](int rank, KVStore* kv) {
        auto [b, root] = c.make(rank);
        if (c.what == std::string("dtype")) {  // a good broadcast of the name first
          Buffer warm(DType::kInt32, 100);
          warm.Fill(rank, 0, 7);
          ASSERT_OK(kv->Broadcast(name, warm.view(), 0));
        }
        b.Fill(rank, 1, 8);
        if (rank == odd && rep % 2 == 1) absl::SleepFor(absl::Milliseconds(5));
        status[rank] = kv->Broadcast(name, b.view(), root);
        for (size_t i = 0; i < b.count; ++i) got[rank].push_back(b.at(i));
      });
      for (int rank = 0; rank < n(); ++rank) {
        const absl::Status& s = status[rank];
        ASSERT_FALSE(s.ok()) << c.what << " repeat " << rep << ": worker " << rank
                             << " succeeded with "
                             << (got[rank].empty() ? 0.0 : got[rank][0]) << " at element 0";
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
            << c.what << " repeat " << rep << ": " << s;
        EXPECT_TRUE(Mentions(s.message(), absl::StrCat("'", name, "'")));
        for (const std::string& w : c.words) {
          EXPECT_TRUE(Mentions(s.message(), w)) << c.what << " repeat " << rep;
        }
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
  // The job keeps working, on these names too.
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (const char* name : {"bad-bcast-root-0", "bad-bcast-size-1", "good-after"}) {
      Buffer b(DType::kFloat32, 100);
      b.Fill(rank, 2, 4);
      absl::Status s = kv->Broadcast(name, b.view(), 0);
      ASSERT_OK(s) << name;
      for (size_t i = 0; i < b.count; ++i) ASSERT_EQ(b.at(i), Value(i, 0, 2, 4)) << name;
    }
  });
}

TEST_P(ConformanceTest, RankThatNeverSubmitsFailsTheOthersAtTheDeadline) {
  if (n() < 2) GTEST_SKIP() << "needs two workers";
  ClusterConfig c = Config();
  c.op_timeout = absl::Milliseconds(1500);
  c.stall_warning = absl::Milliseconds(500);
  auto cluster = Start(c);
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::Status> status(n());
  std::vector<absl::Duration> took(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == n() - 1) return;  // the last rank never submits
    Buffer b(DType::kFloat32, 10);
    const absl::Time start = absl::Now();
    status[rank] = kv->PushPull("lonely", b.view(), b.view());
    took[rank] = absl::Now() - start;
  });
  for (int rank = 0; rank + 1 < n(); ++rank) {
    const absl::Status& s = status[rank];
    ASSERT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(Mentions(s.message(), "'lonely'"));
    EXPECT_GE(took[rank], absl::Milliseconds(1400)) << s;  // not before the deadline
    EXPECT_LT(took[rank], absl::Milliseconds(3500)) << s;
    if (GetParam().backend == "dist_allreduce") {
      EXPECT_TRUE(Mentions(s.message(), absl::StrCat("rank ", n() - 1, " never submitted")));
    }
  }
}

// A worker that leaves the job (its store shut down, as when its process ends early):
// the others' operations that need it fail soon, naming it, instead of waiting for the
// deadline.
TEST_P(ConformanceTest, WorkerThatLeavesFailsTheOthersNamingIt) {
  if (n() < 2) GTEST_SKIP() << "needs two workers";
  auto cluster = Start(Config());  // op_timeout 60 s
  ASSERT_NE(cluster, nullptr);
  const int gone = n() - 1;
  cluster->Leave(gone);
  std::vector<absl::Status> status(n());
  std::vector<absl::Duration> took(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == gone) return;
    Buffer b(DType::kFloat32, 1000);
    b.Fill(rank, 0, 1);
    const absl::Time start = absl::Now();
    status[rank] = kv->PushPull("after-leave", b.view(), b.view());
    took[rank] = absl::Now() - start;
    // Nor can a barrier complete without it.
    const absl::Time barrier_start = absl::Now();
    absl::Status barrier = kv->Barrier();
    EXPECT_FALSE(barrier.ok()) << "worker " << rank;
    EXPECT_LT(absl::Now() - barrier_start, absl::Seconds(10)) << barrier;
    EXPECT_TRUE(Mentions(barrier.message(), absl::StrCat(" ", gone))) << barrier;
  });
  for (int rank = 0; rank < gone; ++rank) {
    const absl::Status& s = status[rank];
    EXPECT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_LT(took[rank], absl::Seconds(10)) << s;
    // "worker 2 (host h, pid p) left the job" / "rank 2 left the job"
    EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("worker ", gone)) ||
                absl::StrContains(s.message(), absl::StrCat("rank ", gone)))
        << s;
    EXPECT_TRUE(Mentions(s.message(), "'after-leave'"));
    std::printf("  worker %d after %s: %s\n", rank, absl::FormatDuration(took[rank]).c_str(),
                s.ToString().c_str());
  }
}

// Where GPU tensors cannot be reduced: dist_hybrid (CPU only), dist_allreduce built
// without CUDA/NCCL (Unimplemented), and dist_allreduce with NCCL but no GPU on rank 0
// (FailedPrecondition). With a GPU, dist_allreduce takes them: tests/gpu.
TEST_P(ConformanceTest, GpuTensorsAreAClearError) {
  if (GetParam().staged) GTEST_SKIP() << "the staged stores take every tensor as GPU memory";
  // dist_allreduce with NCCL: no GPU on rank 0 means no communicator. dist_hybrid with
  // CUDA: no device to stage from. Without CUDA: no GPU support at all.
  bool nccl = false, staging = false;
#if HYBRIDPS_WITH_NCCL
  nccl = GetParam().backend == "dist_allreduce";
#endif
#if HYBRIDPS_WITH_CUDA
  staging = GetParam().backend == "dist_hybrid";
  int devices = 0;
  if ((nccl || staging) && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    GTEST_SKIP() << "a GPU is visible: " << GetParam().backend
                 << " handles GPU tensors (tests/gpu)";
  }
#endif
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  float x[4] = {};
  TensorView gpu{x, 4, DType::kFloat32, Device::kGPU, 0};
  auto h = cluster->worker(0)->PushPullAsync("gpu", gpu, gpu);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), nccl || staging ? absl::StatusCode::kFailedPrecondition
                                               : absl::StatusCode::kUnimplemented)
      << h.status();
  EXPECT_TRUE(Mentions(h.status().message(), "'gpu'"));
  if (nccl) {
    EXPECT_TRUE(Mentions(h.status().message(), "rank 0 has no GPU"));
  }
  if (staging) {
    EXPECT_TRUE(Mentions(h.status().message(), "cudaGetDeviceCount"));
  }
}

std::vector<Param> Params() {
  std::vector<Param> p = {{"dist_hybrid", "inproc", 1, 1}, {"dist_hybrid", "inproc", 2, 2},
                          {"dist_hybrid", "inproc", 3, 2}, {"dist_hybrid", "inproc", 4, 3},
                          {"dist_hybrid", "tcp", 2, 2},    {"dist_hybrid", "tcp", 4, 2}};
  // Nodes of several local ranks: 1-3 nodes of 2-4 local ranks.
  for (auto [transport, workers, servers, local] :
       {std::tuple{"inproc", 2, 1, 2}, std::tuple{"inproc", 4, 2, 2},
        std::tuple{"tcp", 6, 2, 2}, std::tuple{"inproc", 3, 1, 3},
        std::tuple{"ipc", 6, 2, 3}, std::tuple{"inproc", 4, 1, 4},
        std::tuple{"tcp", 8, 2, 4}}) {
    p.push_back({"dist_hybrid", transport, workers, servers, local});
  }
#if HYBRIDPS_HAVE_GLOO
  for (int w = 1; w <= 4; ++w) p.push_back({"dist_allreduce", "inproc", w, 0});
  p.push_back({"dist_allreduce", "tcp", 2, 0});
  p.push_back({"dist_allreduce", "tcp", 3, 0});
  // No fusion, and only the executor thread runs the rounds (HYBRIDPS_CALLER_ROUNDS=0).
  p.push_back({"dist_allreduce", "inproc", 3, 0, 1, false, true, "nofusion_noCaller",
               [](ClusterConfig* c) {
                 c->fusion_bytes = 0;
                 c->caller_rounds = 0;
               }});
  // Every worker on one host (one node): CPU allreduces in shared memory; and two nodes
  // of two, where they go through Gloo.
  for (auto [transport, workers, local] :
       {std::tuple{"inproc", 2, 2}, std::tuple{"inproc", 3, 3}, std::tuple{"tcp", 4, 4},
        std::tuple{"inproc", 4, 2}}) {
    p.push_back({"dist_allreduce", transport, workers, 0, local});
  }
  // Hierarchical (HYBRIDPS_HIERARCHICAL_ALLREDUCE): 2 nodes of 2 and of 3 local ranks sum
  // in shared memory, their local ranks 0 over Gloo.
  for (auto [transport, workers, local] : {std::tuple{"inproc", 4, 2}, std::tuple{"tcp", 6, 3}}) {
    p.push_back({"dist_allreduce", transport, workers, 0, local, false, true, "hier",
                 [](ClusterConfig* c) {
                   c->worker_options = [](int, Options* o) { o->hierarchical_allreduce = 1; };
                 }});
  }
  // Two-shots (HYBRIDPS_TWO_SHOT_BYTES) from 4 KiB up, the eager path below.
  p.push_back({"dist_allreduce", "tcp", 2, 0, 1, false, true, "twoshot",
               [](ClusterConfig* c) {
                 c->worker_options = [](int, Options* o) {
                   o->eager_bytes = 4096;
                   o->two_shot_bytes = 8 << 20;
                 };
               }});
#endif
  // Every tensor of a node on the reducer thread (HYBRIDPS_LOCAL_INLINE_BYTES=0), and
  // every one on the I/O thread, with wire chunks of 4 KiB.
  p.push_back({"dist_hybrid", "inproc", 4, 2, 2, false, true, "threaded",
               [](ClusterConfig* c) { c->local_inline_bytes = 0; }});
  p.push_back({"dist_hybrid", "tcp", 6, 2, 3, false, true, "inline_chunks4k",
               [](ClusterConfig* c) {
                 c->local_inline_bytes = size_t{1} << 30;
                 c->wire_chunk_bytes = 4096;
               }});
  // Through the GPU staging layer (stand-in GPU): one worker, several, nodes of 2 and 3.
  for (auto [transport, workers, servers, local] :
       {std::tuple{"inproc", 1, 1, 1}, std::tuple{"inproc", 3, 2, 1},
        std::tuple{"tcp", 4, 2, 1}, std::tuple{"inproc", 4, 2, 2},
        std::tuple{"ipc", 6, 2, 3}}) {
    p.push_back({"dist_hybrid", transport, workers, servers, local, /*staged=*/true});
  }
  // Push_pulls through the node's GPU reduction (HYBRIDPS_GPU_LOCAL_REDUCE=nccl), on
  // stand-ins for CUDA and NCCL: nodes of 2 and of 3.
  p.push_back({"dist_hybrid", "inproc", 4, 2, 2, /*staged=*/true, true, "", nullptr, true});
  p.push_back({"dist_hybrid", "tcp", 6, 2, 3, /*staged=*/true, true, "", nullptr, true});
  // Only the stager's own thread runs the staging steps (HYBRIDPS_CALLER_ROUNDS=0).
  p.push_back({"dist_hybrid", "inproc", 3, 2, 1, /*staged=*/true, /*helpers=*/false});
  p.push_back({"dist_hybrid", "inproc", 4, 2, 2, /*staged=*/true, /*helpers=*/false});
  return p;
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest, ::testing::ValuesIn(Params()), Name);

}  // namespace
}  // namespace hybridps::testing
