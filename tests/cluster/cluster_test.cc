// The parameter server as threads of one process: exact sums over many rounds, many keys
// at once, mixed priorities, tiny partitions that make small tensors span servers.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/options.h"
#include "common/partition.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/ps/ps_store.h"

namespace hybridps::testing {
namespace {

struct Param {
  std::string transport;
  int workers;
  int servers;
};

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(info.param.transport, "_w", info.param.workers, "_s",
                      info.param.servers);
}

class ClusterTest : public ::testing::TestWithParam<Param> {
 protected:
  std::unique_ptr<LocalCluster> StartCluster(size_t partition_bytes) {
    ClusterConfig c;
    c.transport = GetParam().transport;
    c.workers = GetParam().workers;
    c.servers = GetParam().servers;
    c.partition_bytes = partition_bytes;
    auto cl = LocalCluster::Start(c);
    EXPECT_OK(cl);
    return cl.ok() ? std::move(*cl) : nullptr;
  }
};

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                DType::kUInt8};

TEST_P(ClusterTest, ExactSumsManyKeysRoundsAndPriorities) {
  auto cluster = StartCluster(/*partition_bytes=*/256);
  ASSERT_NE(cluster, nullptr);
  const int n = cluster->num_workers();
  const std::vector<size_t> sizes = {0, 1, 7, 64, 65, 1000, 4099};
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    struct T {
      std::string name;
      Buffer in, out;
      bool inplace;
    };
    std::vector<T> tensors;
    int salt = 0;
    for (DType dt : kAllDTypes) {
      for (size_t size : sizes) {
        const bool inplace = (salt % 2) == 0;
        tensors.push_back(T{absl::StrCat(DTypeName(dt), "/", size), Buffer(dt, size),
                            Buffer(dt, size), inplace});
        ++salt;
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
          double want = 0;
          for (int r = 0; r < n; ++r) want += Value(i, r, round, static_cast<int>(t));
          ASSERT_EQ(result.at(i), want) << x.name << " element " << i << " round " << round;
        }
        if (!x.inplace) {  // The input is left as it was.
          for (size_t i = 0; i < x.in.count; ++i) {
            ASSERT_EQ(x.in.at(i), Value(i, rank, round, static_cast<int>(t))) << x.name;
          }
        }
      }
    }
  });
}

TEST_P(ClusterTest, LargeTensorsWithDefaultPartitions) {
  auto cluster = StartCluster(4 << 20);
  ASSERT_NE(cluster, nullptr);
  const int n = cluster->num_workers();
  // 10 MiB + 3 elements: three partitions of the default 4 MiB, spread over the servers.
  const size_t count = (10 << 20) / 4 + 3;
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer a(DType::kFloat32, count);
    for (int round = 0; round < 2; ++round) {
      a.Fill(rank, round, 1);
      ASSERT_OK(kv->PushPull("big", a.view(), a.view()));
      for (size_t i = 0; i < count; i += 997) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += Value(i, r, round, 1);
        ASSERT_EQ(a.at(i), want) << i;
      }
    }
    auto* ps = PsOf(kv);
    ASSERT_NE(ps, nullptr);
    uint64_t total = 0;
    for (uint64_t c : ps->PushesPerServer()) total += c;
    const auto parts = PartitionTensor(TensorKey("big"), count, DType::kFloat32, 4 << 20,
                                       GetParam().servers);
    EXPECT_GE(parts.size(), 3u);
    // One push per wire chunk (of the default size) per round.
    const size_t chunks =
        SplitIntoChunks(parts, DType::kFloat32, Options{}.wire_chunk_bytes).size();
    EXPECT_GT(chunks, parts.size());
    EXPECT_EQ(total, 2u * chunks);
  });
}

TEST_P(ClusterTest, BroadcastFromEveryRoot) {
  auto cluster = StartCluster(256);
  ASSERT_NE(cluster, nullptr);
  const int n = cluster->num_workers();
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int root = 0; root < n; ++root) {
      Buffer w(DType::kFloat32, 1000), b(DType::kInt64, 3);
      w.Fill(rank, 0, 0);
      b.Fill(rank, 0, 9);
      auto h1 = kv->BroadcastAsync("w", w.view(), root, 1);
      auto h2 = kv->BroadcastAsync("b", b.view(), root, 0);
      ASSERT_TRUE(h1.ok() && h2.ok());
      ASSERT_OK(h1->Wait());
      ASSERT_OK(h2->Wait());
      for (size_t i = 0; i < w.count; ++i) ASSERT_EQ(w.at(i), Value(i, root, 0, 0));
      for (size_t i = 0; i < b.count; ++i) ASSERT_EQ(b.at(i), Value(i, root, 0, 9));
    }
    // A broadcast and push_pulls on the same name keep their order.
    Buffer x(DType::kFloat32, 100);
    x.Fill(rank, 0, 3);
    ASSERT_OK(kv->Broadcast("mixed", x.view(), n - 1));
    ASSERT_OK(kv->PushPull("mixed", x.view(), x.view()));
    for (size_t i = 0; i < x.count; ++i) ASSERT_EQ(x.at(i), n * Value(i, n - 1, 0, 3));
    ASSERT_OK(kv->Barrier());
  });
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, ClusterTest,
    ::testing::Values(Param{"inproc", 1, 1}, Param{"inproc", 1, 3}, Param{"inproc", 2, 1},
                      Param{"inproc", 2, 2}, Param{"inproc", 2, 3}, Param{"inproc", 4, 1},
                      Param{"inproc", 4, 2}, Param{"inproc", 4, 3}, Param{"tcp", 1, 1},
                      Param{"tcp", 2, 2}, Param{"tcp", 4, 3}, Param{"tcp", 2, 3},
                      Param{"ipc", 2, 2}),
    Name);

// Operations submitted in a burst while earlier work is in flight leave in priority
// order, not in the order the I/O thread happened to see them (every worker's first
// window must hold the same partitions, or the servers' rounds wait).
TEST(Pipeline, ABurstWhileBusyLeavesInPriorityOrder) {
  ClusterConfig c;
  c.workers = 1;
  c.servers = 1;
  c.server_threads = 1;  // one engine: replies in request order
  c.transport = "tcp";
  // A long gap: a burst split by a descheduled submitter would not be gathered whole.
  c.burst_gather = absl::Milliseconds(50);
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  KVStore* kv = (*cluster)->worker(0);
  Buffer big(DType::kFloat32, 4 << 20);
  big.Fill(0, 0, 99);
  auto busy = kv->PushPullAsync("big", big.view(), big.view(), /*priority=*/-100);
  ASSERT_OK(busy);
  constexpr int kBurst = 16;
  std::vector<Buffer> bufs;
  for (int i = 0; i < kBurst; ++i) bufs.emplace_back(DType::kFloat32, 4096);
  absl::Mutex mu;
  std::vector<int> completed;  // priorities, in completion order
  std::vector<Handle> handles;
  for (int i = 0; i < kBurst; ++i) {  // lowest priority first, as a backward pass would
    bufs[i].Fill(0, 0, i);
    auto h = kv->PushPullAsync(absl::StrCat("s", i), bufs[i].view(), bufs[i].view(), i);
    ASSERT_OK(h);
    h->OnComplete([&mu, &completed, i](const absl::Status&) {
      absl::MutexLock lock(&mu);
      completed.push_back(i);
    });
    handles.push_back(*h);
  }
  ASSERT_OK(busy->Wait());
  for (auto& h : handles) ASSERT_OK(h.Wait());
  std::vector<int> want;
  for (int i = kBurst; i-- > 0;) want.push_back(i);
  absl::MutexLock lock(&mu);
  // Wait returns once an operation is complete; its callbacks run just after.
  mu.AwaitWithTimeout(absl::Condition(
                          +[](std::vector<int>* v) { return v->size() == kBurst; }, &completed),
                      absl::Seconds(10));
  EXPECT_EQ(completed, want);
}

}  // namespace
}  // namespace hybridps::testing

namespace hybridps::testing {
namespace {

// Two workers push_pull the same `tensors` float32 tensors of `count` elements, all at
// priority 0, worker 0 issuing them first to last and worker 1 last to first; every sum
// must be exact.
void PushPullInOppositeOrders(LocalCluster* cluster, int tensors, size_t count) {
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<Buffer> bufs;
    for (int i = 0; i < tensors; ++i) bufs.emplace_back(DType::kFloat32, count);
    std::vector<std::pair<int, Handle>> handles;
    for (int j = 0; j < tensors; ++j) {
      const int i = rank == 0 ? j : tensors - 1 - j;
      bufs[i].Fill(rank, 0, i);
      auto h = kv->PushPullAsync(absl::StrCat("t", i), bufs[i].view(), bufs[i].view(),
                                 /*priority=*/0);
      ASSERT_OK(h);
      handles.emplace_back(i, *h);
    }
    for (auto& [i, h] : handles) {
      ASSERT_OK(h.Wait());
      for (size_t k = 0; k < count; k += 101) {
        ASSERT_EQ(bufs[i].at(k), Value(k, 0, 0, i) + Value(k, 1, 0, i));
      }
    }
  });
}

// Credit is released when a payload has left, not when its round completes: with room for
// one partition, two workers that issue the same tensors in opposite orders must not
// deadlock (each holding the credit for a tensor the other has not sent yet).
TEST(Pipeline, OppositeIssueOrdersUnderTightCreditsDoNotDeadlock) {
  ClusterConfig c;
  c.workers = 2;
  c.servers = 2;
  c.transport = "tcp";  // zero-copy sends: credit is tracked (inproc copies)
  c.credit_bytes = 4096;
  c.op_timeout = absl::Seconds(10);
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  PushPullInOppositeOrders(cluster->get(), /*tensors=*/24, /*count=*/1024);
}

}  // namespace
}  // namespace hybridps::testing

namespace hybridps::testing {
namespace {

// Two workers over tcp with the given wire chunks and server window, and no safety net:
// only the window decides what a worker sends (a deadlock would last until op_timeout).
ClusterConfig WindowOnly(int servers, size_t chunk_bytes, size_t window_bytes) {
  ClusterConfig c;
  c.workers = 2;
  c.servers = servers;
  c.transport = "tcp";
  c.wire_chunk_bytes = chunk_bytes;
  c.server_window_bytes = window_bytes;
  c.server_window_patience = absl::Hours(1);
  return c;
}

// One push_pull of `count` floats named "grad" by a worker of two; checks the sum.
void PushPullGradAndCheck(KVStore* kv, int rank, size_t count) {
  Buffer buf(DType::kFloat32, count);
  buf.Fill(rank, 0, 7);
  auto h = kv->PushPullAsync("grad", buf.view(), buf.view(), 0);
  ASSERT_OK(h);
  ASSERT_OK(h->Wait());
  for (size_t k = 0; k < count; k += 1021) {
    ASSERT_EQ(buf.at(k), Value(k, 0, 0, 7) + Value(k, 1, 0, 7)) << "element " << k;
  }
}

// A worker whose peer has not pushed yet gets no answers from the server, so it stops at
// the server's window instead of piling the whole tensor onto that server's link.
TEST(ServerWindow, BoundsWhatAWorkerPushesAheadOfTheOthers) {
  const ClusterConfig c = WindowOnly(/*servers=*/1, 64 << 10, 512 << 10);
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  constexpr size_t kCount = (4 << 20) / sizeof(float);
  (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == 1) absl::SleepFor(absl::Milliseconds(300));  // worker 0 runs ahead
    PushPullGradAndCheck(kv, rank, kCount);
  });
  auto* ps = PsOf((*cluster)->worker(0));
  ASSERT_NE(ps, nullptr);
  EXPECT_LE(ps->MaxUnansweredBytes(), c.server_window_bytes);
  EXPECT_GE(ps->MaxUnansweredBytes(), c.wire_chunk_bytes);
}

// Windows of one chunk-group per server, and two workers that issue the same tensors in
// opposite orders: each fills its windows with tensors the other has not sent yet. The
// order every worker shares lets the earliest of them through, so nothing waits.
TEST(ServerWindow, OppositeIssueOrdersUnderTightWindowsDoNotDeadlock) {
  ClusterConfig c = WindowOnly(/*servers=*/2, 16 << 10, 64 << 10);
  c.op_timeout = absl::Seconds(20);
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  PushPullInOppositeOrders(cluster->get(), /*tensors=*/24, /*count=*/(64 << 10) / 4);
}

// Worker 0 pushes tensors the others will push last, filling its window at the server,
// then tensors everyone pushes first. Pushes that come later in the shared order must not
// count against the earlier ones: those go out under a window of their own at once
// instead of one at a time as answers trickle in.
TEST(ServerWindow, PushesSentAheadOfTheSharedOrderDoNotHoldUpEarlierOnes) {
  ClusterConfig c = WindowOnly(/*servers=*/1, 16 << 10, 64 << 10);
  c.burst_gather = absl::ZeroDuration();      // submissions leave in the order made
  c.op_timeout = absl::Seconds(20);
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  constexpr int kEarly = 4, kLate = 4;  // tensors of one window each; early: 0..3
  constexpr size_t kCount = (64 << 10) / sizeof(float);
  (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<Buffer> bufs;
    for (int i = 0; i < kEarly + kLate; ++i) {
      bufs.emplace_back(DType::kFloat32, kCount);
      bufs.back().Fill(rank, 0, i);
    }
    std::vector<std::pair<int, Handle>> handles;
    auto submit = [&](int i, int priority) {
      auto h = kv->PushPullAsync(absl::StrCat("t", i), bufs[i].view(), bufs[i].view(),
                                 priority);
      ASSERT_OK(h);
      handles.emplace_back(i, *h);
    };
    // Priorities: tensor i has kEarly + kLate - i, so the shared order is 0, 1, 2, ...
    if (rank == 0) {
      for (int i = kEarly; i < kEarly + kLate; ++i) submit(i, kEarly + kLate - i);
      absl::SleepFor(absl::Milliseconds(50));  // its window now holds late tensors
      for (int i = 0; i < kEarly; ++i) submit(i, kEarly + kLate - i);
    } else {
      absl::SleepFor(absl::Milliseconds(300));  // worker 0 sends all it may meanwhile
      for (int i = 0; i < kEarly + kLate; ++i) submit(i, kEarly + kLate - i);
    }
    for (auto& [i, h] : handles) {
      ASSERT_OK(h.Wait());
      for (size_t k = 0; k < kCount; k += 97) {
        ASSERT_EQ(bufs[i].at(k), Value(k, 0, 0, i) + Value(k, 1, 0, i)) << "tensor " << i;
      }
    }
  });
  auto* ps = PsOf((*cluster)->worker(0));
  ASSERT_NE(ps, nullptr);
  // Before worker 1 pushed anything: one window of late tensors and one of early ones
  // (one chunk of early ones only, if the late ones counted against them).
  EXPECT_EQ(ps->MaxUnansweredBytes(), 2 * c.server_window_bytes);
}

// Mixed placement over tcp (as below: the extra server owns half the bytes and gets 2
// connections, a colocated server a quarter and one): the window is per connection, so
// worker 0, running ahead, may leave twice the window unanswered at the extra server.
// Worker 1 pushes only once worker 0 got there, or after a deadline (then the check
// fails); with max_server_lanes = 1 every server has one window.
TEST(ServerWindow, GrowsWithAServersConnections) {
  for (int max_lanes : {4, 1}) {
    ClusterConfig c = WindowOnly(/*servers=*/3, 64 << 10, 256 << 10);
    c.partition_bytes = 64 << 10;  // pieces of one chunk: the windows fill exactly
    c.deployment = "mixed";
    c.extra_servers = 1;
    c.max_server_lanes = max_lanes;
    auto cluster = LocalCluster::Start(c);
    ASSERT_OK(cluster);
    const size_t expected = (max_lanes > 1 ? 2 : 1) * c.server_window_bytes;
    constexpr size_t kCount = (4 << 20) / sizeof(float);
    PsStore* ps0 = PsOf((*cluster)->worker(0));
    ASSERT_NE(ps0, nullptr);
    (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
      if (rank == 1) {
        const absl::Time deadline = absl::Now() + absl::Seconds(20);
        while (ps0->MaxUnansweredBytes() < expected && absl::Now() < deadline) {
          absl::SleepFor(absl::Milliseconds(5));
        }
      }
      PushPullGradAndCheck(kv, rank, kCount);
    });
    EXPECT_EQ(ps0->MaxUnansweredBytes(), expected) << "max_server_lanes " << max_lanes;
  }
}

// Mixed placement over tcp: 2 worker hosts with a server each and one extra server, which
// owns half the bytes (a colocated one a quarter), so every worker opens 2 connections to
// it. Exact sums over rounds, and both of its connections carry pushes; with
// max_server_lanes = 1 there is one connection per server.
TEST(ServerLanes, TheExtraServerOfAMixedPlacementGetsTwoConnections) {
  for (int max_lanes : {4, 1}) {
    ClusterConfig c;
    c.workers = 2;
    c.servers = 3;
    c.transport = "tcp";
    c.deployment = "mixed";
    c.extra_servers = 1;
    c.max_server_lanes = max_lanes;
    auto cluster = LocalCluster::Start(c);
    ASSERT_OK(cluster);
    constexpr size_t kBig = (3 << 20) / sizeof(float), kSmall = 1000;
    constexpr int kRounds = 3, kSmallTensors = 24;
    (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<Buffer> bufs;
        bufs.emplace_back(DType::kFloat32, kBig);
        for (int i = 0; i < kSmallTensors; ++i) bufs.emplace_back(DType::kFloat32, kSmall);
        std::vector<Handle> handles;
        for (size_t i = 0; i < bufs.size(); ++i) {
          bufs[i].Fill(rank, round, static_cast<int>(i));
          auto h = kv->PushPullAsync(absl::StrCat("lane", i), bufs[i].view(), bufs[i].view(),
                                     -static_cast<int>(i));
          ASSERT_OK(h);
          handles.push_back(*h);
        }
        for (size_t i = 0; i < bufs.size(); ++i) {
          ASSERT_OK(handles[i].Wait());
          for (size_t k = 0; k < bufs[i].count; k += 13) {
            ASSERT_EQ(bufs[i].at(k), Value(k, 0, round, static_cast<int>(i)) +
                                         Value(k, 1, round, static_cast<int>(i)))
                << "tensor " << i << " element " << k << " round " << round;
          }
        }
      }
    });
    for (int w = 0; w < 2; ++w) {
      auto* ps = PsOf((*cluster)->worker(w));
      ASSERT_NE(ps, nullptr);
      const auto lanes = ps->PushesPerLane();
      ASSERT_EQ(lanes.size(), 3u);
      EXPECT_EQ(lanes[0].size(), 1u);
      EXPECT_EQ(lanes[1].size(), 1u);
      ASSERT_EQ(lanes[2].size(), max_lanes > 1 ? 2u : 1u) << "worker " << w;
      for (uint64_t pushes : lanes[2]) EXPECT_GT(pushes, 0u) << "worker " << w;
    }
  }
}

}  // namespace
}  // namespace hybridps::testing
