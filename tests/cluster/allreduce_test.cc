// What only dist_allreduce has: fusion, eager small tensors, ranks that leave. (What
// every backend must do is in conformance_test.cc.)
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

// `tweak`, when given, changes the configuration further.
std::unique_ptr<LocalCluster> StartAllreduce(
    int workers, size_t fusion_bytes = 64 << 20, int caller_rounds = 1,
    const std::function<void(ClusterConfig*)>& tweak = nullptr) {
  ClusterConfig c;
  c.backend = "dist_allreduce";
  c.workers = workers;
  c.fusion_bytes = fusion_bytes;
  c.caller_rounds = caller_rounds;
  c.heartbeat_timeout = absl::Seconds(5);
  if (tweak) tweak(&c);
  auto cl = LocalCluster::Start(c);
  EXPECT_OK(cl);
  return cl.ok() ? std::move(*cl) : nullptr;
}

AllreduceStore::Stats StatsOf(KVStore* kv) {
  auto* s = dynamic_cast<AllreduceStore*>(kv);
  EXPECT_NE(s, nullptr);
  return s ? s->stats() : AllreduceStore::Stats{};
}

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

// With 2 ranks, push_pulls over the eager limit (1 MiB) and up to two_shot_bytes are
// two-shots when the ranks are in step: every element exact (the chunk boundary, odd
// counts, 16-bit floats summed in float32), in place and out of place; larger ones and
// all of them with two_shot_bytes 0 take the ring.
TEST(AllreduceTest, TwoRanksSwapSummedHalvesOfMidSizeTensors) {
  for (size_t two_shot_bytes : {size_t{8} << 20, size_t{0}}) {
    SCOPED_TRACE(absl::StrCat("two_shot_bytes ", two_shot_bytes));
    auto cluster = StartAllreduce(2, 64 << 20, 1, [&](ClusterConfig* c) {
      c->worker_options = [two_shot_bytes](int, Options* o) {
        o->two_shot_bytes = two_shot_bytes;
      };
    });
    ASSERT_NE(cluster, nullptr);
    struct Case {
      DType dtype;
      size_t count;
    };
    const std::vector<Case> cases = {
        {DType::kFloat32, (1 << 18) + 1},      // just over 1 MiB, odd
        {DType::kFloat16, (3 << 19) + 3},      // 3 MiB
        {DType::kFloat64, (1 << 20)},          // 8 MiB: the largest two-shot
        {DType::kBFloat16, (5 << 19) + 1},     // 5 MiB
        {DType::kFloat32, (2 << 20) + 1},      // just over 8 MiB: the ring
    };
    constexpr int kRounds = 6;
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      for (int i = 0; i < kRounds; ++i) {
        for (size_t c = 0; c < cases.size(); ++c) {
          Buffer in(cases[c].dtype, cases[c].count), out(cases[c].dtype, cases[c].count);
          const int salt = static_cast<int>(c);
          in.Fill(rank, i, salt);
          const bool inplace = (i + c) % 2 == 0;
          ASSERT_TRUE(kv->PushPull(absl::StrCat("t", c), in.view(),
                                   inplace ? in.view() : out.view())
                          .ok());
          const Buffer& result = inplace ? in : out;
          for (size_t k = 0; k < in.count; ++k) {
            ASSERT_EQ(result.at(k), Value(k, 0, i, salt) + Value(k, 1, i, salt))
                << "tensor " << c << " round " << i << " element " << k << " of " << in.count;
          }
        }
      }
    });
    for (int w = 0; w < 2; ++w) {
      AllreduceStore::Stats s = StatsOf(cluster->worker(w));
      std::printf("two_shot_bytes %zu worker %d: %llu two-shots, %llu allreduces\n",
                  two_shot_bytes, w, static_cast<unsigned long long>(s.two_shots),
                  static_cast<unsigned long long>(s.allreduces));
      EXPECT_EQ(s.two_shots + s.allreduces, cases.size() * kRounds) << "worker " << w;
      EXPECT_GE(s.allreduces, static_cast<uint64_t>(kRounds));  // the 8 MiB + 4 ones
      if (two_shot_bytes > 0) {
        EXPECT_GT(s.two_shots, 0u) << "worker " << w;
      } else {
        EXPECT_EQ(s.two_shots, 0u) << "worker " << w;
      }
    }
  }
}

// With 4 workers over Gloo and the slow links' eager_bytes (256 KiB: eagerly up to 85
// KiB): a small push_pull goes eagerly; a 256 KiB one goes directly between every pair;
// one over direct_allreduce_bytes takes the ring. A rank 0 with direct_allreduce_bytes 0
// sends every allreduce through the ring, whatever the others say (ranks that chose
// differently would hang in mismatched collectives).
TEST(AllreduceTest, FourRanksSendMidSizeTensorsDirectlyAsRankZeroSays) {
  for (size_t rank0_direct : {size_t{1} << 20, size_t{0}}) {
    SCOPED_TRACE(absl::StrCat("rank 0's direct_allreduce_bytes ", rank0_direct));
    auto cluster = StartAllreduce(4, 64 << 20, 1, [&](ClusterConfig* c) {
      c->op_timeout = absl::Seconds(20);
      c->worker_options = [rank0_direct](int, Options* o) {
        o->direct_allreduce_bytes = o->rank == 0 ? rank0_direct : size_t{1} << 20;
        o->eager_bytes = 256 << 10;
      };
    });
    ASSERT_NE(cluster, nullptr);
    ASSERT_EQ(cluster->worker(0)->rank(), 0);  // the one whose setting counts
    // float32 counts: 4 KB (eager), 256 KiB + 4 bytes (direct), 1 MiB + 4 bytes (ring).
    const std::vector<size_t> counts = {1000, (1 << 16) + 1, (1 << 18) + 1};
    constexpr int kRounds = 4;
    std::vector<AllreduceStore::Stats> after(counts.size() * 4);
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      for (size_t c = 0; c < counts.size(); ++c) {
        for (int i = 0; i < kRounds; ++i) {
          Buffer b(DType::kFloat32, counts[c]);
          const int salt = static_cast<int>(c);
          b.Fill(rank, i, salt);
          ASSERT_OK(kv->PushPull(absl::StrCat("t", c), b.view(), b.view()));
          for (size_t k = 0; k < b.count; ++k) {
            double want = 0;
            for (int r = 0; r < 4; ++r) want += Value(k, r, i, salt);
            ASSERT_EQ(b.at(k), want) << "tensor " << c << " round " << i << " element " << k;
          }
        }
        after[c * 4 + rank] = StatsOf(kv);
      }
    });
    for (int w = 0; w < 4; ++w) {
      const AllreduceStore::Stats& small = after[w];
      const AllreduceStore::Stats& mid = after[4 + w];
      const AllreduceStore::Stats& large = after[8 + w];
      SCOPED_TRACE(absl::StrCat("worker ", w));
      EXPECT_EQ(large.allreduces - mid.allreduces, static_cast<uint64_t>(kRounds));
      EXPECT_EQ(large.direct_allreduces - mid.direct_allreduces, 0u) << "1 MiB went directly";
      EXPECT_EQ(mid.eager, small.eager) << "a 256 KiB push_pull went eagerly with 4 ranks";
      // Directly: as an allreduce, or (from the second round, when the ranks are in step)
      // as a direct two-shot.
      const uint64_t two_shots = mid.two_shots - small.two_shots;
      EXPECT_EQ(mid.allreduces - small.allreduces + two_shots, static_cast<uint64_t>(kRounds));
      EXPECT_EQ(mid.direct_allreduces - small.direct_allreduces + two_shots,
                rank0_direct > 0 ? static_cast<uint64_t>(kRounds) : 0u);
      EXPECT_EQ(large.two_shots, mid.two_shots) << "1 MiB went as a two-shot";
    }
  }
}

// With 3 and 4 workers over Gloo, a push_pull that goes directly and is alone in its
// round sends its shares with the negotiation (a direct two-shot) once the slot has room
// for them: every element exact (odd counts, float16 summed in float32, in place and out
// of place), and the same bits as the direct allreduce, which runs them when one worker
// has HYBRIDPS_DIRECT_TWO_SHOT=0 (its messages carry no shares, so no worker's plan is a
// two-shot).
TEST(AllreduceTest, MidSizePushPullsSendTheirSharesWithTheNegotiation) {
  struct Case {
    int workers;
    bool one_off;
  };
  for (const Case& k : {Case{4, false}, Case{3, false}, Case{4, true}}) {
    SCOPED_TRACE(absl::StrCat(k.workers, " workers", k.one_off ? ", one without" : ""));
    auto cluster = StartAllreduce(k.workers, 64 << 20, 1, [&](ClusterConfig* c) {
      c->op_timeout = absl::Seconds(30);
      c->worker_options = [&k](int, Options* o) {
        o->eager_bytes = 256 << 10;
        o->eager_probe = 0;
        o->direct_two_shot = k.one_off && o->rank == k.workers - 1 ? 0 : 1;
      };
    });
    ASSERT_NE(cluster, nullptr);
    struct Tensor {
      DType dtype;
      size_t count;
    };
    // 256 KiB + 4 bytes and 1 MiB - 2 bytes, both over the eager limit and directly.
    const std::vector<Tensor> tensors = {{DType::kFloat32, (1 << 16) + 1},
                                         {DType::kFloat16, (1 << 19) - 1}};
    constexpr int kRounds = 24;
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      for (int i = 0; i < kRounds; ++i) {
        const size_t t = i % tensors.size();
        Buffer in(tensors[t].dtype, tensors[t].count), out(tensors[t].dtype, tensors[t].count);
        const int salt = static_cast<int>(t);
        in.Fill(rank, i, salt);
        const bool inplace = i % 4 < 2;
        ASSERT_OK(kv->PushPull(absl::StrCat("t", t), in.view(), inplace ? in.view() : out.view()));
        const Buffer& result = inplace ? in : out;
        for (size_t e = 0; e < in.count; ++e) {
          double want = 0;
          for (int r = 0; r < k.workers; ++r) want += Value(e, r, i, salt);
          ASSERT_EQ(result.at(e), want) << "tensor " << t << " round " << i << " element " << e;
        }
      }
    });
    for (int w = 0; w < k.workers; ++w) {
      AllreduceStore::Stats s = StatsOf(cluster->worker(w));
      SCOPED_TRACE(absl::StrCat("worker ", w));
      std::printf("%d workers%s, worker %d: %llu two-shots, %llu direct allreduces\n",
                  k.workers, k.one_off ? " (one without)" : "", w,
                  static_cast<unsigned long long>(s.two_shots),
                  static_cast<unsigned long long>(s.direct_allreduces));
      EXPECT_EQ(s.two_shots + s.direct_allreduces, static_cast<uint64_t>(kRounds));
      if (k.one_off) {
        EXPECT_EQ(s.two_shots, 0u);
      } else {
        EXPECT_GT(s.two_shots, 0u);
      }
    }
    // A worker that deviates in this steady state (one element more, its shares sent
    // along) fails every worker with an error that names the tensor and both sizes; the
    // next push_pull of the name sums exactly.
    std::vector<absl::Status> status(k.workers);
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      Buffer b(DType::kFloat32, (1 << 16) + 1 + (rank == 1 ? 1 : 0));
      b.Fill(rank, 0, 0);
      status[rank] = kv->PushPull("t0", b.view(), b.view());
    });
    for (int w = 0; w < k.workers; ++w) {
      EXPECT_EQ(status[w].code(), absl::StatusCode::kInvalidArgument) << status[w];
      EXPECT_TRUE(absl::StrContains(status[w].message(), "'t0'")) << status[w];
      EXPECT_TRUE(absl::StrContains(status[w].message(), "65537")) << status[w];
      EXPECT_TRUE(absl::StrContains(status[w].message(), "65538")) << status[w];
    }
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      Buffer b(DType::kFloat32, (1 << 16) + 1);
      b.Fill(rank, 1, 0);
      ASSERT_OK(kv->PushPull("t0", b.view(), b.view()));
      for (size_t e = 0; e < b.count; ++e) {
        double want = 0;
        for (int r = 0; r < k.workers; ++r) want += Value(e, r, 1, 0);
        ASSERT_EQ(b.at(e), want) << "element " << e;
      }
    });
  }
}

// A direct push_pull that comes back every other round (a small eager one in between)
// finds room for its shares: the slot holds the rooms asked for in the last two rounds.
// One whose share could not go in a slot that is exchanged directly (12 MiB over 3
// workers with direct_allreduce_bytes 16 MiB: 4 MiB shares) asks for none, so the slot
// never grows onto the ring, and it runs as the direct allreduce; every sum exact.
TEST(AllreduceTest, SharesRideEveryOtherRoundAndNeverPushTheSlotOntoTheRing) {
  constexpr int kWorkers = 3;
  auto cluster = StartAllreduce(kWorkers, 64 << 20, 1, [](ClusterConfig* c) {
    c->op_timeout = absl::Seconds(30);
    c->worker_options = [](int, Options* o) {
      o->eager_bytes = 256 << 10;
      o->eager_probe = 0;
      o->direct_allreduce_bytes = 16 << 20;
    };
  });
  ASSERT_NE(cluster, nullptr);
  auto push_pull = [](int rank, KVStore* kv, const std::string& name, size_t count, int i) {
    Buffer b(DType::kFloat32, count);
    b.Fill(rank, i, static_cast<int>(count % 7));
    ASSERT_OK(kv->PushPull(name, b.view(), b.view()));
    for (size_t e = 0; e < count; ++e) {
      double want = 0;
      for (int r = 0; r < kWorkers; ++r) want += Value(e, r, i, static_cast<int>(count % 7));
      ASSERT_EQ(b.at(e), want) << name << " round " << i << " element " << e;
    }
  };
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int i = 0; i < 12; ++i) {
      push_pull(rank, kv, "mid", (1 << 16) + 1, i);
      push_pull(rank, kv, "small", 100, i);
    }
  });
  std::vector<AllreduceStore::Stats> mid(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    mid[w] = StatsOf(cluster->worker(w));
    EXPECT_GT(mid[w].two_shots, 0u) << "worker " << w;
  }
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int i = 0; i < 4; ++i) push_pull(rank, kv, "big", size_t{3} << 20, i);
  });
  for (int w = 0; w < kWorkers; ++w) {
    const AllreduceStore::Stats s = StatsOf(cluster->worker(w));
    EXPECT_EQ(s.two_shots, mid[w].two_shots) << "worker " << w;
    EXPECT_EQ(s.direct_allreduces - mid[w].direct_allreduces, 4u) << "worker " << w;
    EXPECT_LE(s.largest_slot, GlooComm::kDirectSlotBytes) << "worker " << w;
  }
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
