// dist_hybrid's node GPU reduction (worker/ps/local/node_gpu_reduce.h, HYBRIDPS_GPU_LOCAL_REDUCE=
// nccl) on machines without a GPU: the rounds that order the node's collectives, the
// push of the node's sum by one local rank per partition, the servers' count of one push
// per node, shape mismatches, missing ranks and failing collectives. The GPU is the
// host-memory stand-in of host_copier.h, and NCCL a stand-in over the node's shared
// memory (HostCollectives below) that leaves a non-root rank's reduce output as garbage,
// as NCCL does, so that a missing broadcast shows. NCCL itself runs in tests/gpu.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/partition.h"
#include "common/status.h"
#include "tests/cluster/host_collectives.h"
#include "tests/cluster/host_copier.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/ps/local/node_gpu_reduce.h"
#if HYBRIDPS_WITH_CUDA
#include "worker/ps/ps_gpu.h"
#endif
#include "worker/ps/ps_store.h"

namespace hybridps::testing {
namespace {

// An in-process cluster whose workers each have the node reduction in front of their
// store, with the stand-ins.
class NodeCluster {
 public:
  NodeCluster(const ClusterConfig& config, std::vector<HostCollectives::Faults> faults = {}) {
    auto cl = LocalCluster::Start(config);
    EXPECT_OK(cl);
    if (!cl.ok()) return;
    cluster = std::move(*cl);
    const int n = cluster->num_workers();
    reducers.resize(n);
    for (int w = 0; w < n; ++w) shared.push_back(std::make_shared<HostCopier::Shared>());
    std::vector<std::thread> threads;
    for (int w = 0; w < n; ++w) {
      threads.emplace_back([&, w] {
        PsStore* ps = PsOf(cluster->worker(w));
        Options o = cluster->options();
        o.op_timeout = config.op_timeout;
        o.heartbeat_timeout = config.heartbeat_timeout;
        const HostCollectives::Faults f =
            w < static_cast<int>(faults.size()) ? faults[w] : HostCollectives::Faults{};
        // Worker-dependent copy times, so that the ranks' pushes end in other orders.
        auto copier = std::make_unique<HostCopier>(
            shared[w], 2, absl::Microseconds(50 * (w + 1)), HostCopier::Faults{});
        auto r = NodeGpuReducer::Create(
            o, ps->layout(), std::move(copier), ps,
            [f](ShmAllreduce* ex, const NodeLayout& layout) {
              return MakeHostCollectives(ex, layout, f);
            });
        EXPECT_OK(r);
        if (r.ok()) reducers[w] = std::move(*r);
      });
    }
    for (auto& t : threads) t.join();
  }
  ~NodeCluster() {
    // The reducers first (every local rank leaves together), then the stores.
    std::vector<std::thread> threads;
    for (auto& r : reducers) {
      threads.emplace_back([&r] {
        if (r) r->Shutdown();
      });
    }
    for (auto& t : threads) t.join();
    reducers.clear();
  }
  void Run(const std::function<void(int, NodeGpuReducer*, HostCopier::Shared*)>& fn) {
    cluster->RunOnWorkers(
        [&](int rank, KVStore*) { fn(rank, reducers[rank].get(), shared[rank].get()); });
  }
  PsStore* store(int w) { return PsOf(cluster->worker(w)); }

  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::shared_ptr<HostCopier::Shared>> shared;
  std::vector<std::unique_ptr<NodeGpuReducer>> reducers;
};

// One node of two local ranks, one server.
ClusterConfig OneNodeOfTwo(absl::Duration op_timeout = absl::Seconds(30),
                           absl::Duration heartbeat_timeout = absl::Seconds(20)) {
  ClusterConfig c;
  c.workers = 2;
  c.local_size = 2;
  c.op_timeout = op_timeout;
  c.heartbeat_timeout = heartbeat_timeout;
  return c;
}

// A push_pull of `t` in place under `name`, waited for: the submission's or the
// operation's status.
absl::Status PushPullInPlace(NodeGpuReducer* r, const std::string& name, FakeGpuTensor& t) {
  auto h = r->PushPullAsync(name, t.view(), t.view(), 0);
  return h.ok() ? h->Wait() : h.status();
}

// After a failure: a push_pull of `name` on every worker of `nc` gives the exact sum.
void ExpectTheNodeGoesOn(NodeCluster& nc, const std::string& name) {
  const int n = nc.cluster->num_workers();
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    FakeGpuTensor good(sh, DType::kFloat32, 1000);
    good.buf.Fill(rank, 0, 0);
    absl::Status s = PushPullInPlace(r, name, good);
    ASSERT_OK(s);
    for (size_t e = 0; e < 1000; ++e) {
      double want = 0;
      for (int w = 0; w < n; ++w) want += Value(e, w, 0, 0);
      ASSERT_EQ(good.buf.at(e), want) << e;
    }
  });
}

struct Shape {
  int nodes, local, servers;
};

class NodeGpuReduceTest : public ::testing::TestWithParam<Shape> {};

// Exact sums over every worker, in every dtype and over sizes that split into several
// partitions, leave some local ranks nothing to push, or are smaller than the node; the
// workers issue the tensors in different orders; one push per node and partition.
TEST_P(NodeGpuReduceTest, SumsOverEveryWorkerWithOnePushPerNodeAndPartition) {
  const Shape shape = GetParam();
  ClusterConfig c;
  c.workers = shape.nodes * shape.local;
  c.local_size = shape.local;
  c.servers = shape.servers;
  c.partition_bytes = 16 << 10;
  NodeCluster nc(c);
  ASSERT_NE(nc.cluster, nullptr);
  struct T {
    std::string name;
    DType dtype;
    size_t count;
  };
  const std::vector<T> tensors = {
      {"big", DType::kFloat32, 40000},   {"half", DType::kFloat16, 9001},
      {"bf", DType::kBFloat16, 5000},    {"i64", DType::kInt64, 3},
      {"one", DType::kFloat64, 1},       {"u8", DType::kUInt8, 777},
      {"i32", DType::kInt32, 20000}};
  constexpr int kRounds = 3;
  const int n = c.workers;
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    std::vector<std::unique_ptr<FakeGpuTensor>> in, out;
    for (const T& t : tensors) {
      in.push_back(std::make_unique<FakeGpuTensor>(sh, t.dtype, t.count, 1));
      out.push_back(std::make_unique<FakeGpuTensor>(sh, t.dtype, t.count, 1));
    }
    for (int round = 0; round < kRounds; ++round) {
      std::vector<Handle> handles(tensors.size(), Handle(nullptr));
      for (size_t k = 0; k < tensors.size(); ++k) {
        // Odd ranks issue in reverse; every second tensor in place.
        const size_t i = rank % 2 == 1 ? tensors.size() - 1 - k : k;
        in[i]->buf.Fill(rank, round, static_cast<int>(i));
        FakeGpuTensor* o = i % 2 == 0 ? in[i].get() : out[i].get();
        auto h = r->PushPullAsync(tensors[i].name, in[i]->view(), o->view(), 0);
        ASSERT_OK(h);
        handles[i] = *h;
      }
      for (size_t i = 0; i < tensors.size(); ++i) {
        absl::Status s = handles[i].Wait();
        ASSERT_OK(s);
        const FakeGpuTensor* o = i % 2 == 0 ? in[i].get() : out[i].get();
        for (size_t e = 0; e < tensors[i].count; ++e) {
          double want = 0;
          for (int w = 0; w < n; ++w) want += Value(e, w, round, static_cast<int>(i));
          if (tensors[i].dtype == DType::kUInt8) want = static_cast<uint8_t>(want);
          ASSERT_EQ(o->buf.at(e), want) << tensors[i].name << "[" << e << "] round " << round
                                        << " rank " << rank;
        }
      }
    }
  });
  uint64_t parts = 0;
  for (const T& t : tensors) {
    parts += PartitionTensor(TensorKey(t.name), t.count, t.dtype, c.partition_bytes,
                             c.servers).size();
  }
  for (int node = 0; node < shape.nodes; ++node) {
    uint64_t node_pushes = 0;
    for (int lr = 0; lr < shape.local; ++lr) {
      auto v = nc.store(node * shape.local + lr)->PushesPerServer();
      node_pushes += std::accumulate(v.begin(), v.end(), uint64_t{0});
    }
    EXPECT_EQ(node_pushes, kRounds * parts) << "node " << node;
  }
  uint64_t seen = 0;
  for (int s = 0; s < c.servers; ++s) {
    seen += nc.cluster->server(s)->stats().data_requests.load();
  }
  EXPECT_EQ(seen, static_cast<uint64_t>(shape.nodes) * kRounds * parts);
  for (int w = 0; w < n; ++w) {
    const auto st = nc.reducers[w]->stats();
    EXPECT_EQ(st.reduces, kRounds * tensors.size());
    EXPECT_EQ(st.broadcasts, kRounds * tensors.size());
    // Operations agreed in one round share one NCCL group per step.
    EXPECT_LE(st.groups, 2 * kRounds * tensors.size());
    EXPECT_GE(st.groups, 2u * kRounds);
    // Each rank copies only the partitions it pushes, both ways, with one staging buffer
    // per tensor for all rounds.
    uint64_t mine = 0;
    for (const T& t : tensors) {
      for (const NodePart& p : nc.store(w)->NodePartsOf(t.name, t.count, t.dtype)) {
        if (p.pusher == w % shape.local && p.count > 0) ++mine;
      }
    }
    EXPECT_EQ(st.copies, 2 * kRounds * mine) << "worker " << w;
    EXPECT_EQ(st.host_allocations, tensors.size()) << "worker " << w;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NodeGpuReduceTest,
                         ::testing::Values(Shape{1, 2, 1}, Shape{2, 2, 2}, Shape{1, 3, 2},
                                           Shape{2, 4, 1}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("n", info.param.nodes, "_l", info.param.local,
                                               "_s", info.param.servers);
                         });

// Local ranks with different counts fail the operation on every rank of their node,
// naming both shapes, and fail the servers' rounds so that the other node's workers get
// the error at once, not at the deadline; the job goes on with the next operation.
TEST(NodeGpuReduceFaultTest, ShapeMismatchFailsEveryRankAtOnceNamingTheShapes) {
  ClusterConfig c = OneNodeOfTwo();
  c.workers = 4;
  NodeCluster nc(c);
  ASSERT_NE(nc.cluster, nullptr);
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    FakeGpuTensor bad(sh, DType::kFloat32, rank == 0 ? 100 : 101);
    const absl::Time start = absl::Now();
    auto h = r->PushPullAsync("w", bad.view(), bad.view(), 0);
    ASSERT_OK(h);
    absl::Status s = h->Wait();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "100 float32")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "101 float32")) << s;
    if (rank >= 2) {
      EXPECT_TRUE(absl::StrContains(s.message(), "disagree")) << s;
    }
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << s;
  });
  // Once every rank has its error (a node that moved on at once would make the servers
  // abandon the round another node has not reached yet).
  ExpectTheNodeGoesOn(nc, "w");
}

// A tensor on another GPU, or host memory labelled GPU, is refused at submission, naming
// the tensor; nothing reaches the node.
TEST(NodeGpuReduceFaultTest, DeviceRulesAreCheckedAtSubmission) {
  NodeCluster nc(OneNodeOfTwo());
  ASSERT_NE(nc.cluster, nullptr);
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    FakeGpuTensor t0(sh, DType::kFloat32, 64, 0), t1(sh, DType::kFloat32, 64, 1);
    t0.buf.Fill(rank, 0, 0);
    ASSERT_OK(PushPullInPlace(r, "first", t0));
    auto bad = r->PushPullAsync("other-gpu", t1.view(), t1.view(), 0);
    ASSERT_FALSE(bad.ok());
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "'other-gpu'")) << bad.status();
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "on GPU 0")) << bad.status();
    Buffer host(DType::kFloat32, 64);
    TensorView fake = host.view();
    fake.device = Device::kGPU;
    bad = r->PushPullAsync("host-memory", fake, fake, 0);
    ASSERT_FALSE(bad.ok());
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "'host-memory': the input"))
        << bad.status();
  });
  EXPECT_EQ(nc.reducers[0]->stats().reduces, 1u);
}

// When the servers fail a round (here: the two nodes pushed different sizes), the rank
// that pushed gets the servers' error and its node peers the same error, saying whose
// push it was; the node goes on with the next operation.
TEST(NodeGpuReduceFaultTest, AFailedPushFailsTheOperationOnEveryLocalRank) {
  ClusterConfig c = OneNodeOfTwo();
  c.workers = 4;
  NodeCluster nc(c);
  ASSERT_NE(nc.cluster, nullptr);
  const int pusher = nc.store(0)->NodePartsOf("w", 100, DType::kFloat32)[0].pusher;
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    FakeGpuTensor bad(sh, DType::kFloat32, rank < 2 ? 100 : 101);
    auto h = r->PushPullAsync("w", bad.view(), bad.view(), 0);
    ASSERT_OK(h);
    absl::Status s = h->Wait();
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "mismatched")) << s;
    if (rank % 2 != pusher) {
      EXPECT_TRUE(absl::StrContains(s.message(),
                                    absl::StrCat("(the push of local rank ", pusher, " (worker ",
                                                 rank - rank % 2 + pusher, ") of this node)")))
          << s;
    }
  });
  ExpectTheNodeGoesOn(nc, "v");
}

// A local rank that never submits is named at the deadline, on the rank waiting for it.
TEST(NodeGpuReduceFaultTest, MissingLocalRankIsNamedAtTheDeadline) {
  NodeCluster nc(OneNodeOfTwo(absl::Seconds(2)));
  ASSERT_NE(nc.cluster, nullptr);
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    if (rank != 0) return;
    FakeGpuTensor t(sh, DType::kFloat32, 10);
    const absl::Time start = absl::Now();
    auto h = r->PushPullAsync("lonely", t.view(), t.view(), 0);
    ASSERT_OK(h);
    absl::Status s = h->Wait();
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "local rank 1 (worker 1)")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'lonely'")) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  });
}

// A collective failing at one local rank fails its operation there at once, and at the
// node's other rank within the heartbeat timeout (it stops joining the rounds), naming it.
TEST(NodeGpuReduceFaultTest, FailedCollectiveFailsTheWholeNodeInTime) {
  NodeCluster nc(OneNodeOfTwo(absl::Seconds(30), absl::Seconds(2)),
                 {HostCollectives::Faults{}, HostCollectives::Faults{1}});
  ASSERT_NE(nc.cluster, nullptr);
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    FakeGpuTensor t(sh, DType::kFloat32, 5000);
    t.buf.Fill(rank, 0, 1);
    ASSERT_OK(PushPullInPlace(r, "a", t));
    const absl::Time start = absl::Now();
    auto h = r->PushPullAsync("b", t.view(), t.view(), 0);
    ASSERT_OK(h);
    absl::Status s = h->Wait();
    EXPECT_FALSE(s.ok());
    if (rank == 1) {
      EXPECT_TRUE(absl::StrContains(s.message(), "ncclReduce failed")) << s;
    }
    EXPECT_TRUE(absl::StrContains(s.message(), "'b'")) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(8));
    // Later operations fail at once.
    auto later = r->PushPullAsync("c", t.view(), t.view(), 0);
    EXPECT_FALSE(later.ok() && later->Wait().ok());
  });
}

// A local rank that shuts down leaves at once, once its own work is done; the node's
// other ranks then fail what needs it, naming it, instead of waiting for a deadline.
TEST(NodeGpuReduceFaultTest, ALocalRankThatLeavesIsNamedAtOnce) {
  NodeCluster nc(OneNodeOfTwo());
  ASSERT_NE(nc.cluster, nullptr);
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    FakeGpuTensor t(sh, DType::kFloat32, 100);
    t.buf.Fill(rank, 0, 0);
    ASSERT_OK(PushPullInPlace(r, "together", t));
    const absl::Time start = absl::Now();
    if (rank == 0) {
      r->Shutdown();
      EXPECT_LT(absl::Now() - start, absl::Seconds(2));
      return;
    }
    absl::SleepFor(absl::Milliseconds(100));
    absl::Status s = PushPullInPlace(r, "alone", t);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "local rank 0 (worker 0) of this node left"))
        << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  });
}

// Abort (the store broke: the scheduler named a dead peer) ends the node's rounds at once,
// here (with the cause) and at the other local ranks (naming the rank that stopped; their
// own stores hear the cause from the scheduler too), long before any deadline.
TEST(NodeGpuReduceFaultTest, AbortEndsTheNodesWaitsAtOnce) {
  NodeCluster nc(OneNodeOfTwo());
  ASSERT_NE(nc.cluster, nullptr);
  nc.Run([&](int rank, NodeGpuReducer* r, HostCopier::Shared* sh) {
    ASSERT_NE(r, nullptr);
    FakeGpuTensor t(sh, DType::kFloat32, 10);
    const absl::Time start = absl::Now();
    if (rank == 0) {
      absl::SleepFor(absl::Milliseconds(200));
      r->Abort(absl::UnavailableError("worker 7 (host h, pid 1) died"));
    }
    absl::Status s = PushPullInPlace(r, "x", t);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(absl::StrContains(
        s.message(), rank == 0 ? "worker 7 (host h, pid 1) died" : "local rank 0 of this node"))
        << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  });
}

#if HYBRIDPS_WITH_CUDA
// The stores created next build the node's reduction on the stand-ins (undone by
// SetNodeGpuPartsForTesting({})).
void StandInsForTheStore(std::shared_ptr<HostCopier::Shared> shared, int devices = 2) {
  PsGpuStore::SetNodeGpuPartsForTesting(
      {[shared, devices] {
         return std::make_unique<HostCopier>(shared, devices, absl::Microseconds(20),
                                             HostCopier::Faults{});
       },
       [](ShmAllreduce* ex, const NodeLayout& layout) { return MakeHostCollectives(ex, layout); }});
}

// The store itself (PsGpuStore, what KVStore::Create("dist_hybrid") makes in CUDA builds)
// with HYBRIDPS_GPU_LOCAL_REDUCE=nccl and the stand-ins: GPU push_pulls go through the
// node's reduction, CPU ones through the host path, and the two may not overlap on one
// name (refused, naming it).
TEST(NodeGpuReduceStoreTest, GpuPushPullsTakeTheNodePathAndPathsDoNotOverlapOnAName) {
  auto shared = std::make_shared<HostCopier::Shared>();
  StandInsForTheStore(shared);
  ClusterConfig c = OneNodeOfTwo();
  c.workers = 4;
  c.servers = 2;
  c.worker_options = [](int, Options* o) { o->gpu_local_reduce = "nccl"; };
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
    auto* store = dynamic_cast<PsGpuStore*>(kv);
    ASSERT_NE(store, nullptr);
    FakeGpuTensor g(shared.get(), DType::kFloat32, 30000);
    Buffer cpu(DType::kFloat32, 30000);
    for (int round = 0; round < 2; ++round) {
      g.buf.Fill(rank, round, 1);
      cpu.Fill(rank, round, 2);
      absl::Status s = kv->PushPull("g", g.view(), g.view());
      ASSERT_OK(s);
      s = kv->PushPull("c", cpu.view(), cpu.view());
      ASSERT_OK(s);
      for (size_t e = 0; e < 30000; e += 7) {
        double wg = 0, wc = 0;
        for (int w = 0; w < 4; ++w) {
          wg += Value(e, w, round, 1);
          wc += Value(e, w, round, 2);
        }
        ASSERT_EQ(g.buf.at(e), wg) << e;
        ASSERT_EQ(cpu.at(e), wc) << e;
      }
    }
    EXPECT_EQ(store->staging_stats().gpu_ops, 0u);  // nothing went through host staging
    // Overlap on one name, both ways: local rank 1 of each node comes 300 ms late, so
    // local rank 0's first operation is still in flight when it issues the second.
    const bool early = rank % 2 == 0;
    if (!early) absl::SleepFor(absl::Milliseconds(300));
    auto h = kv->PushPullAsync("x", g.view(), g.view());
    ASSERT_OK(h);
    if (early) {
      auto refused = kv->PushPullAsync("x", cpu.view(), cpu.view());
      ASSERT_FALSE(refused.ok());
      EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
      EXPECT_TRUE(absl::StrContains(refused.status().message(), "'x': a GPU push_pull"))
          << refused.status();
    }
    ASSERT_OK(h->Wait());
    if (!early) absl::SleepFor(absl::Milliseconds(300));
    h = kv->PushPullAsync("y", cpu.view(), cpu.view());
    ASSERT_OK(h);
    if (early) {
      auto refused = kv->PushPullAsync("y", g.view(), g.view());
      ASSERT_FALSE(refused.ok());
      EXPECT_TRUE(absl::StrContains(refused.status().message(), "'y': an operation of it on "
                                                                "the host path"))
          << refused.status();
    }
    ASSERT_OK(h->Wait());
  });
  cluster->reset();
  PsGpuStore::SetNodeGpuPartsForTesting({});
}

// HYBRIDPS_GPU_LOCAL_REDUCE=auto (the default): the node sums on its GPUs when each local
// rank sees a GPU per local rank, and stays on the host path when they would share one.
TEST(NodeGpuReduceStoreTest, AutoReducesOnTheNodesGpusWhenEachRankHasOne) {
  for (int devices : {2, 1}) {
    SCOPED_TRACE(devices);
    auto shared = std::make_shared<HostCopier::Shared>();
    StandInsForTheStore(shared, devices);
    ClusterConfig c = OneNodeOfTwo();
    c.worker_options = [](int, Options* o) { EXPECT_EQ(o->gpu_local_reduce, "auto"); };
    auto cluster = LocalCluster::Start(c);
    ASSERT_OK(cluster);
    (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
      auto* store = dynamic_cast<PsGpuStore*>(kv);
      ASSERT_NE(store, nullptr);
      EXPECT_EQ(store->reduces_on_node_gpus(), devices == 2);
      if (devices == 1) return;  // the host path would stage through a real GPU
      FakeGpuTensor g(shared.get(), DType::kFloat32, 1000);
      g.buf.Fill(rank, 0, 1);
      ASSERT_OK(kv->PushPull("g", g.view(), g.view()));
      for (size_t e = 0; e < 1000; e += 7) {
        ASSERT_EQ(g.buf.at(e), Value(e, 0, 0, 1) + Value(e, 1, 0, 1)) << e;
      }
      EXPECT_EQ(store->staging_stats().gpu_ops, 0u);
    });
    cluster->reset();
    PsGpuStore::SetNodeGpuPartsForTesting({});
  }
}

// When the store breaks (here: the scheduler names a dead server), it ends the node's
// rounds at once: a GPU push_pull waiting in them for a local rank fails with the cause
// within the heartbeat timeout, not at its deadline.
TEST(NodeGpuReduceStoreTest, ADeadServerEndsTheNodesRoundsAtOnce) {
  auto shared = std::make_shared<HostCopier::Shared>();
  StandInsForTheStore(shared);
  ClusterConfig c = OneNodeOfTwo(absl::Seconds(30), absl::Seconds(1));
  c.worker_options = [](int, Options* o) { o->gpu_local_reduce = "nccl"; };
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == 1) {  // never submits; kills the server instead
      absl::SleepFor(absl::Milliseconds(200));
      (*cluster)->KillServer(0);
      return;
    }
    FakeGpuTensor g(shared.get(), DType::kFloat32, 1000);
    const absl::Time start = absl::Now();
    absl::Status s = kv->PushPull("z", g.view(), g.view());
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(absl::StrContains(s.message(), "server 0")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'z'")) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << s;
  });
  cluster->reset();
  PsGpuStore::SetNodeGpuPartsForTesting({});
}
#endif

}  // namespace
}  // namespace hybridps::testing
