// dist_allreduce's two-shots and direct allreduces: with 2 workers the halves swapped
// after the negotiation (HYBRIDPS_TWO_SHOT_BYTES), with 3 or more the direct allreduce
// between every pair and its first step inside the negotiation (HYBRIDPS_DIRECT_TWO_SHOT).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"

#if HYBRIDPS_HAVE_GLOO
#include "tests/cluster/allreduce_cluster.h"
#include "worker/comm/gloo_comm.h"

namespace hybridps::testing {
namespace {

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

}  // namespace
}  // namespace hybridps::testing

#endif  // HYBRIDPS_HAVE_GLOO
