// What only dist_allreduce has: fusion, eager small tensors, ranks that leave. (What
// every backend must do is in conformance_test.cc; two-shots and direct allreduces are in
// allreduce_two_shot_test.cc.)
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/cluster/allreduce_cluster.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/push_pull_in_turn.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"

#if HYBRIDPS_HAVE_GLOO
#include <thread>

#include "gloo/rendezvous/hash_store.h"
#include "worker/allreduce/allreduce_store.h"
#include "worker/comm/gloo_comm.h"
#include "worker/node/shm_allreduce.h"

namespace hybridps::testing {
namespace {

// Push_pulls of counts[i] float32 each (name "g<i>", priority -i), all in flight; checks
// the sums.
void PushPullSizes(LocalCluster& cluster, const std::vector<size_t>& counts) {
  const int n = cluster.num_workers();
  const int tensors = static_cast<int>(counts.size());
  cluster.RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<Buffer> bufs;
    std::vector<Handle> handles;
    for (int i = 0; i < tensors; ++i) bufs.emplace_back(DType::kFloat32, counts[i]);
    for (int i = 0; i < tensors; ++i) {
      bufs[i].Fill(rank, 0, i);
      auto h = kv->PushPullAsync(absl::StrCat("g", i), bufs[i].view(), bufs[i].view(), -i);
      ASSERT_OK(h);
      handles.push_back(*h);
    }
    for (auto& h : handles) ASSERT_OK(h.Wait());
    for (int i = 0; i < tensors; ++i) {
      for (size_t k = 0; k < counts[i]; k += 101) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += Value(k, r, 0, i);
        ASSERT_EQ(bufs[i].at(k), want) << "g" << i << " element " << k;
      }
    }
  });
}

// `tensors` push_pulls of `count` float32 each.
void PushPullMany(LocalCluster& cluster, int tensors, size_t count) {
  PushPullSizes(cluster, std::vector<size_t>(tensors, count));
}

TEST(AllreduceTest, FusionPacksTensorsReadyTogetherIntoFewAllreduces) {
  auto cluster = StartAllreduce(3);
  ASSERT_NE(cluster, nullptr);
  // 800 KB each: too large to travel with the negotiation, small enough to fuse.
  PushPullMany(*cluster, 40, 200000);
  for (int w = 0; w < 3; ++w) {
    AllreduceStore::Stats s = StatsOf(cluster->worker(w));
    EXPECT_GE(s.fused_tensors, 20u) << "worker " << w;
    EXPECT_LE(s.allreduces, 20u) << "worker " << w;
    EXPECT_EQ(s.eager, 0u);
  }
}

// Tensors larger than fusion_max_tensor_bytes are reduced alone, in place: copying them
// into the fusion buffer and back would cost more than their own allreduce's start.
TEST(AllreduceTest, LargeTensorsRunAloneWhileSmallOnesFuse) {
  auto cl = StartAllreduce(3, 64 << 20, 1,
                           [](ClusterConfig* c) { c->fusion_max_tensor_bytes = 1 << 20; });
  ASSERT_NE(cl, nullptr);
  LocalCluster& cluster = *cl;
  // 20 of 600 KB (over 3 ranks' eager limit, 512 KiB; fused), then 6 of 1.2 MB (alone).
  std::vector<size_t> counts(20, 150000);
  counts.resize(26, 300000);
  PushPullSizes(cluster, counts);
  const int n = cluster.num_workers();
  for (int w = 0; w < n; ++w) {
    AllreduceStore::Stats s = StatsOf(cluster.worker(w));
    EXPECT_LE(s.fused_tensors, 20u) << "worker " << w << ": a large tensor was fused";
    EXPECT_GE(s.allreduces, 7u) << "worker " << w;
    EXPECT_EQ(s.eager, 0u);
  }
}

// On one host (allreduces in shared memory) a collective of its own costs a few
// microseconds, less than the fusion buffer's copies of anything over 128 KiB: such
// tensors run alone whatever HYBRIDPS_FUSION_MAX_TENSOR_BYTES says above it, while a
// lower setting still holds; the Gloo path keeps the setting.
TEST(AllreduceTest, OnOneHostOnlyTensorsUpTo128KiBAreFused) {
  struct Case {
    int local;
    size_t setting, want;
  };
  for (const Case& k : {Case{3, Options().fusion_max_tensor_bytes, 128 << 10},
                        Case{3, 4096, 4096},
                        Case{1, Options().fusion_max_tensor_bytes,
                             Options().fusion_max_tensor_bytes}}) {
    SCOPED_TRACE(absl::StrCat(k.local, " per node, setting ", k.setting));
    auto cl = StartAllreduce(3, 64 << 20, 1, [&](ClusterConfig* c) {
      c->local_size = k.local;
      c->fusion_max_tensor_bytes = k.setting;
    });
    ASSERT_NE(cl, nullptr);
    // 20 of 100 KB (over shared memory's eager limit, 64 KiB), then 6 of 600 KB.
    std::vector<size_t> counts(20, 25000);
    counts.resize(26, 150000);
    PushPullSizes(*cl, counts);
    for (int w = 0; w < 3; ++w) {
      auto* store = dynamic_cast<AllreduceStore*>(cl->worker(w));
      ASSERT_NE(store, nullptr);
      EXPECT_EQ(store->fusion_max_tensor_bytes(), k.want) << "worker " << w;
      if (k.local == 3 && k.setting > (128 << 10)) {
        const AllreduceStore::Stats s = store->stats();
        EXPECT_EQ(s.shm_allreduces, s.allreduces) << "worker " << w;
        EXPECT_LE(s.fused_tensors, 20u) << "worker " << w << ": a 600 KB tensor was fused";
        EXPECT_GE(s.allreduces, 7u) << "worker " << w;
      }
    }
  }
}

// Fusion settings that differ between workers would make them plan different collectives
// (Gloo then aborts the process on the mismatched sizes): every worker takes rank 0's.
TEST(AllreduceTest, WorkersWithOtherFusionSettingsFollowRankZero) {
  auto cl = StartAllreduce(3, 64 << 20, 1, [](ClusterConfig* c) {
    c->op_timeout = absl::Seconds(10);
    // Which of them becomes rank 0 is up to the scheduler: all three differ.
    c->worker_options = [](int i, Options* o) {
      if (i == 1) o->fusion_bytes = 0;
      if (i == 2) o->fusion_max_tensor_bytes = 0;
    };
  });
  ASSERT_NE(cl, nullptr);
  PushPullMany(*cl, 30, 150000);
  // Alike plans: the same number of allreduces and fused tensors everywhere.
  const AllreduceStore::Stats s0 = StatsOf(cl->worker(0));
  for (int w = 1; w < 3; ++w) {
    const AllreduceStore::Stats s = StatsOf(cl->worker(w));
    EXPECT_EQ(s.allreduces, s0.allreduces) << "worker " << w;
    EXPECT_EQ(s.fused_tensors, s0.fused_tensors) << "worker " << w;
  }
}

TEST(AllreduceTest, WithoutFusionEveryTensorHasItsOwnAllreduce) {
  auto cluster = StartAllreduce(2, /*fusion_bytes=*/0);
  ASSERT_NE(cluster, nullptr);
  PushPullMany(*cluster, 12, 300000);  // 1.2 MB: over the eager limit of 2 ranks (1 MiB)
  AllreduceStore::Stats s = StatsOf(cluster->worker(0));
  EXPECT_EQ(s.allreduces + s.two_shots, 12u);
  EXPECT_EQ(s.fused_tensors, 0u);
}

// Ranks in step (one small push_pull after the other) put their data in the round's
// negotiation message and need no allreduce (a rank that is late makes an operation
// take the allreduce path instead, so not every one need go eagerly).
TEST(AllreduceTest, SmallTensorsTravelWithTheNegotiation) {
  auto cluster = StartAllreduce(4);
  ASSERT_NE(cluster, nullptr);
  constexpr int kOps = 30;
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int i = 0; i < kOps; ++i) {
      Buffer b(DType::kFloat32, 1000);
      b.Fill(rank, i, 1);
      ASSERT_OK(kv->PushPull("small", b.view(), b.view()));
      for (size_t k = 0; k < b.count; ++k) {
        double want = 0;
        for (int r = 0; r < 4; ++r) want += Value(k, r, i, 1);
        ASSERT_EQ(b.at(k), want) << "op " << i << " element " << k;
      }
    }
  });
  AllreduceStore::Stats s = StatsOf(cluster->worker(0));
  EXPECT_EQ(s.eager + s.allreduces, static_cast<uint64_t>(kOps));
  EXPECT_GE(s.eager, static_cast<uint64_t>(kOps / 2));
}

// Options::caller_rounds: a thread waiting on its handle runs the round itself when no
// other thread is in one; with it off only the executor does.
TEST(AllreduceTest, WaitingThreadsRunTheRoundsThemselves) {
  for (int caller_rounds : {1, 0}) {
    SCOPED_TRACE(absl::StrCat("caller_rounds ", caller_rounds));
    auto cluster = StartAllreduce(2, 64 << 20, caller_rounds);
    ASSERT_NE(cluster, nullptr);
    // Whether the waiting thread or the executor (woken by the submission) gets a
    // round first is up to the OS scheduler: many operations, so that some do.
    PushPullInTurn(*cluster, 100, 300000);
    for (int w = 0; w < 2; ++w) {
      AllreduceStore::Stats s = StatsOf(cluster->worker(w));
      std::printf("caller_rounds %d worker %d: %llu of %llu rounds by waiting threads\n",
                  caller_rounds, w, static_cast<unsigned long long>(s.caller_rounds),
                  static_cast<unsigned long long>(s.rounds));
      if (caller_rounds) {
        EXPECT_GT(s.caller_rounds, 0u) << "worker " << w;
      } else {
        EXPECT_EQ(s.caller_rounds, 0u) << "worker " << w;
      }
      EXPECT_LE(s.caller_rounds, s.rounds);
    }
  }
}

// While waiting threads run the rounds the executor leaves new work to them for a moment
// (AllreduceStore::kCallerGrace) and is not woken by submissions while it polls: an
// operation that nobody waits on must still run, through the executor. A waited-for
// push_pull first makes the waiting thread the round runner; then each rank polls Done()
// only, the second operation submitted while the executor polls for the first.
TEST(AllreduceTest, OperationsNobodyWaitsOnRunThroughTheExecutor) {
  auto cluster = StartAllreduce(2);
  ASSERT_NE(cluster, nullptr);
  std::vector<AllreduceStore::Stats> before(2);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer waited(DType::kFloat32, 10);
    ASSERT_OK(kv->PushPull("waited", waited.view(), waited.view()));
    before[rank] = StatsOf(kv);
    std::vector<Buffer> bufs;
    std::vector<Handle> handles;
    for (int i = 0; i < 2; ++i) bufs.emplace_back(DType::kFloat32, 1000 + i);
    for (int i = 0; i < 2; ++i) {
      bufs[i].Fill(rank, i, 3);
      auto h = kv->PushPullAsync(absl::StrCat("unwaited", i), bufs[i].view(), bufs[i].view());
      ASSERT_OK(h);
      handles.push_back(*h);
      absl::SleepFor(absl::Microseconds(50));
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (const Handle& h : handles) {
      ASSERT_TRUE(PollUntilDone(h, deadline)) << "an operation nobody waited on never ran";
      ASSERT_OK(h.Wait());  // done: returns its status at once
    }
    for (int i = 0; i < 2; ++i) {
      for (size_t k = 0; k < bufs[i].count; ++k) {
        ASSERT_EQ(bufs[i].at(k), Value(k, 0, i, 3) + Value(k, 1, i, 3)) << "element " << k;
      }
    }
  });
  for (int w = 0; w < 2; ++w) {
    const AllreduceStore::Stats s = StatsOf(cluster->worker(w));
    EXPECT_EQ(s.caller_rounds, before[w].caller_rounds) << "worker " << w << ": nobody waited";
    EXPECT_GE(s.eager + s.allreduces - before[w].eager - before[w].allreduces, 2u)
        << "worker " << w;
  }
}

// Several threads per rank submit and wait at once, in a different order on every rank:
// they take turns holding the round with each other and the executor, and every sum is
// exact.
TEST(AllreduceTest, ManyThreadsWaitingAtOnceAllComplete) {
  constexpr int kWorkers = 3, kThreads = 4, kOps = 15;
  auto cluster = StartAllreduce(kWorkers);
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      const int id = (t + rank) % kThreads;  // rank-dependent start order
      threads.emplace_back([&, id] {
        for (int i = 0; i < kOps; ++i) {
          Buffer b(DType::kFloat32, (id % 2 == 0 ? 150000 : 300) + i);
          b.Fill(rank, i, id);
          absl::Status st = kv->PushPull(absl::StrCat("t", id), b.view(), b.view());
          ASSERT_OK(st);
          for (size_t k = 0; k < b.count; k += 13) {
            double want = 0;
            for (int r = 0; r < kWorkers; ++r) want += Value(k, r, i, id);
            ASSERT_EQ(b.at(k), want) << "t" << id << " op " << i << " element " << k;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
  });
}

// A waiting thread whose peer submits late: its rounds find the operation missing there,
// and it completes once the peer submits (nothing waits for the deadline).
TEST(AllreduceTest, WaiterCompletesWhenALatePeerSubmits) {
  auto cluster = StartAllreduce(2);
  ASSERT_NE(cluster, nullptr);
  const absl::Time start = absl::Now();
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == 1) absl::SleepFor(absl::Milliseconds(300));
    Buffer b(DType::kFloat32, 500000);
    b.Fill(rank, 0, 3);
    absl::Status st = kv->PushPull("late", b.view(), b.view());
    ASSERT_OK(st);
    for (size_t k = 0; k < b.count; k += 101) {
      ASSERT_EQ(b.at(k), Value(k, 0, 0, 3) + Value(k, 1, 0, 3)) << "element " << k;
    }
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Rounds whose messages carry two large eager tensors (a slot over 2 MiB) between rounds
// of small ones (the receives of the next exchange are posted at the end of the round
// before, for the slot then agreed): every sum exact whichever way the slot moves.
TEST(AllreduceTest, NegotiationSlotGrowsAndShrinks) {
  auto cluster = StartAllreduce(2);
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int i = 0; i < 12; ++i) {
      const bool large = i % 3 == 0;
      std::vector<Buffer> bufs;
      for (int t = 0; t < (large ? 2 : 1); ++t) {
        bufs.emplace_back(DType::kFloat32, large ? 262144 : 100);  // 2 x 1 MiB
      }
      std::vector<Handle> handles;
      for (size_t t = 0; t < bufs.size(); ++t) {
        bufs[t].Fill(rank, i, static_cast<int>(t));
        auto h = kv->PushPullAsync(absl::StrCat("s", t), bufs[t].view(), bufs[t].view());
        ASSERT_OK(h);
        handles.push_back(*h);
      }
      for (auto& h : handles) ASSERT_OK(h.Wait());
      for (size_t t = 0; t < bufs.size(); ++t) {
        for (size_t k = 0; k < bufs[t].count; k += 97) {
          ASSERT_EQ(bufs[t].at(k), Value(k, 0, i, t) + Value(k, 1, i, t))
              << "round " << i << " tensor " << t << " element " << k;
        }
      }
    }
  });
  EXPECT_GT(StatsOf(cluster->worker(0)).eager, 0u);
}

// Every worker on one host (one node of local ranks): allreduces of CPU tensors run in
// shared memory, exactly; rank 0's HYBRIDPS_LOCAL_ALLREDUCE=0 sends every worker's
// through Gloo; two nodes go through Gloo, unless rank 0 asks for hierarchical
// allreduces (HYBRIDPS_HIERARCHICAL_ALLREDUCE=1: each node in shared memory).
TEST(AllreduceTest, OneHostReducesInSharedMemoryAsRankZeroSays) {
  struct Case {
    int workers, local, rank0_setting, rank0_hierarchical;
    bool shm;
  };
  for (const Case& k : {Case{3, 3, 1, 0, true}, Case{3, 3, 0, 0, false},
                        Case{4, 2, 1, 0, false}, Case{4, 2, 1, 1, true},
                        Case{4, 2, 0, 1, false}}) {
    SCOPED_TRACE(absl::StrCat(k.workers, " workers, ", k.local, " per node, rank 0 says ",
                              k.rank0_setting, " ", k.rank0_hierarchical));
    auto cluster = StartAllreduce(k.workers, 64 << 20, 1, [&](ClusterConfig* c) {
      c->local_size = k.local;
      c->worker_options = [&](int rank, Options* o) {
        o->local_allreduce = rank == 0 ? k.rank0_setting : 1;
        o->hierarchical_allreduce = rank == 0 ? k.rank0_hierarchical : 1;
      };
    });
    ASSERT_NE(cluster, nullptr);
    // Over the eager limits, several at once (fused through Gloo; in shared memory only
    // tensors up to 128 KiB are), and one over a region's size.
    PushPullSizes(*cluster, {300001, 300001, 200000, 3 << 20});
    for (int w = 0; w < k.workers; ++w) {
      AllreduceStore::Stats s = StatsOf(cluster->worker(w));
      EXPECT_GT(s.allreduces, 0u) << "worker " << w;
      EXPECT_EQ(s.shm_allreduces, k.shm ? s.allreduces : 0u) << "worker " << w;
    }
  }
}

// On one host each rank writes its negotiation message straight into its exchange area
// when it fits there. A round in which rank 0's message does not (70 names of 4,000
// bytes) and rank 1's does (one name) goes through Gloo on both: rank 1 sends the message
// it wrote in place. Rank 1 submits only after rank 0 has queued all 70, so the round that
// runs the first one lists all of rank 0's; every sum exact.
TEST(AllreduceTest, ARoundWithOneMessageTooBigForSharedMemoryGoesThroughGloo) {
  auto cluster = StartAllreduce(2, 64 << 20, 1, [](ClusterConfig* c) { c->local_size = 2; });
  ASSERT_NE(cluster, nullptr);
  constexpr int kTensors = 70;
  constexpr size_t kNameBytes = 4000;
  static_assert(kTensors * kNameBytes > ShmAllreduce::kMessageBytes);
  auto name = [](int i) { return absl::StrCat(i, "/", std::string(kNameBytes, 'n')); };
  absl::Notification queued;
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<Buffer> bufs;
    for (int i = 0; i < kTensors; ++i) bufs.emplace_back(DType::kFloat32, 16);
    std::vector<Handle> handles;
    if (rank == 1) {
      ASSERT_TRUE(queued.WaitForNotificationWithTimeout(absl::Seconds(120)));
    }
    for (int i = 0; i < kTensors; ++i) {
      bufs[i].Fill(rank, 0, i);
      auto h = kv->PushPullAsync(name(i), bufs[i].view(), bufs[i].view());
      ASSERT_OK(h);
      handles.push_back(*h);
      if (rank == 1 && i == 0) {
        ASSERT_OK(handles[0].Wait());  // alone in rank 1's list
      }
    }
    if (rank == 0) queued.Notify();
    for (auto& h : handles) ASSERT_OK(h.Wait());
    for (int i = 0; i < kTensors; ++i) {
      for (size_t k = 0; k < 16; ++k) {
        ASSERT_EQ(bufs[i].at(k), Value(k, 0, 0, i) + Value(k, 1, 0, i)) << i << " " << k;
      }
    }
  });
  // The job's collectives are the shared-memory ones (so its exchanges were too).
  PushPullSizes(*cluster, {100000});
  EXPECT_GT(StatsOf(cluster->worker(0)).shm_allreduces, 0u);
}

// Hierarchical jobs of 3 nodes: the nodes' leaders allreduce directly (a 256 KiB
// push_pull, one at a time so that nothing is fused or eager), in nodes of 2 local ranks
// (the node's sum in shared memory, chunk by chunk) and in nodes of one rank (no shared
// memory); exact sums on every worker.
TEST(AllreduceTest, LeadersOfThreeNodesAllreduceDirectly) {
  for (int local : {2, 1}) {
    SCOPED_TRACE(absl::StrCat("3 nodes of ", local));
    const int workers = 3 * local;
    auto cluster = StartAllreduce(workers, 64 << 20, 1, [&](ClusterConfig* c) {
      c->local_size = local;
      c->op_timeout = absl::Seconds(20);
      c->worker_options = [](int, Options* o) {
        o->hierarchical_allreduce = 1;
        o->eager_bytes = 0;
      };
    });
    ASSERT_NE(cluster, nullptr);
    constexpr int kRounds = 3;
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      for (int i = 0; i < kRounds; ++i) {
        Buffer b(DType::kFloat32, (1 << 16) + 3);
        b.Fill(rank, i, 4);
        ASSERT_OK(kv->PushPull("mid", b.view(), b.view()));
        for (size_t k = 0; k < b.count; ++k) {
          double want = 0;
          for (int r = 0; r < workers; ++r) want += Value(k, r, i, 4);
          ASSERT_EQ(b.at(k), want) << "round " << i << " element " << k;
        }
      }
    });
    for (int w = 0; w < workers; ++w) {
      const AllreduceStore::Stats s = StatsOf(cluster->worker(w));
      const bool leader = cluster->worker(w)->local_rank() == 0;
      // Nodes of one rank run over Gloo alone: there the push_pull goes as a direct
      // two-shot once it has run alone.
      EXPECT_EQ(s.direct_allreduces + s.two_shots, leader ? static_cast<uint64_t>(kRounds) : 0u)
          << "worker " << w;
    }
  }
}

// Hierarchical jobs whose nodes differ in size: the leaders cut a tensor larger than a
// shared-memory region into the same pieces on every node (nodes of 2 and 1 ranks, and of
// 8 and 2, whose regions would differ), so every worker gets exact sums.
TEST(AllreduceTest, NodesOfDifferentSizesAllreduceTensorsLargerThanARegion) {
  for (std::vector<int> nodes : {std::vector<int>{2, 1}, std::vector<int>{8, 2}}) {
    SCOPED_TRACE(absl::StrCat("nodes of ", absl::StrJoin(nodes, " and ")));
    std::vector<int> node_of, local_rank;
    for (int n = 0; n < static_cast<int>(nodes.size()); ++n) {
      for (int l = 0; l < nodes[n]; ++l) {
        node_of.push_back(n);
        local_rank.push_back(l);
      }
    }
    const int workers = static_cast<int>(node_of.size());
    auto cluster = StartAllreduce(workers, 64 << 20, 1, [&](ClusterConfig* c) {
      c->op_timeout = absl::Seconds(30);
      c->worker_options = [&](int rank, Options* o) {
        o->hierarchical_allreduce = 1;
        o->local_size = nodes[node_of[rank]];
        o->local_rank = local_rank[rank];
        o->node_id = absl::StrCat("node", node_of[rank]);
      };
    });
    ASSERT_NE(cluster, nullptr);
    PushPullSizes(*cluster, {(size_t{9} << 20) / 4 + 5});  // 9 MiB: over any region
    for (int w = 0; w < workers; ++w) {
      const AllreduceStore::Stats s = StatsOf(cluster->worker(w));
      EXPECT_EQ(s.shm_allreduces, nodes[node_of[w]] > 1 ? 1u : 0u)
          << "worker " << w;
    }
  }
}

// A malformed node (two workers claiming local rank 0 of node1) sends the whole
// hierarchical job through Gloo, on every rank alike: the well-formed node's ranks do not
// wait for the others in shared memory's set-up, and the sums are exact.
TEST(AllreduceTest, AMalformedNodeSendsEveryRankThroughGloo) {
  auto cluster = StartAllreduce(4, 64 << 20, 1, [](ClusterConfig* c) {
    c->local_size = 2;
    c->start_timeout = absl::Seconds(5);
    c->worker_options = [](int rank, Options* o) {
      o->hierarchical_allreduce = 1;
      if (rank >= 2) o->local_rank = 0;
    };
  });
  ASSERT_NE(cluster, nullptr);
  PushPullSizes(*cluster, {1000, 300001});
  for (int w = 0; w < 4; ++w) EXPECT_EQ(StatsOf(cluster->worker(w)).shm_allreduces, 0u) << w;
}

TEST(AllreduceTest, RankThatLeavesFailsTheOthersAtOnceNamingIt) {
  auto cluster = StartAllreduce(3);
  ASSERT_NE(cluster, nullptr);
  // Worker 0 waits for a tensor the others never submit; worker 2 leaves the job.
  Buffer b(DType::kFloat32, 10);
  auto h = cluster->worker(0)->PushPullAsync("x", b.view(), b.view());
  ASSERT_OK(h);
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_FALSE(h->Done());
  const absl::Time left = absl::Now();
  cluster->CloseWorker(2);
  absl::Status s = h->Wait();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 2 left the job")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "'x'")) << s;
  EXPECT_LT(absl::Now() - left, absl::Seconds(3)) << s;
  // Worker 1, which had nothing pending, fails its next operation with the same cause.
  absl::Status s1 = cluster->worker(1)->PushPull("y", b.view(), b.view());
  EXPECT_TRUE(absl::StrContains(s1.message(), "rank 2 left the job")) << s1;
  EXPECT_TRUE(absl::StrContains(cluster->worker(1)->Barrier().message(), "left")) << s1;
}

TEST(AllreduceTest, OperationsAfterShutdownFailClearly) {
  auto cluster = StartAllreduce(1);
  ASSERT_NE(cluster, nullptr);
  KVStore* kv = cluster->worker(0);
  EXPECT_FALSE(kv->IsCapable(Capability::kOptimizer));
  EXPECT_EQ(kv->type(), "dist_allreduce");
  ASSERT_OK(kv->Shutdown());
  Buffer b(DType::kFloat32, 10);
  auto h = kv->PushPullAsync("late", b.view(), b.view());
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::StrContains(h.status().message(), "shut down")) << h.status();
}

}  // namespace
}  // namespace hybridps::testing

#endif  // HYBRIDPS_HAVE_GLOO
