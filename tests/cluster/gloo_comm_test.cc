// GlooComm, the Gloo mesh under dist_allreduce's collectives across nodes: Abort ends a
// blocked collective at once and leaves other meshes alone, exchanges with receives posted
// a round ahead deliver every message, direct allreduces give exact sums.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"

#if HYBRIDPS_HAVE_GLOO
#include <thread>

#include "gloo/rendezvous/hash_store.h"
#include "common/partition.h"
#include "worker/comm/gloo_comm.h"

namespace hybridps::testing {
namespace {

// `n` ranks of one Gloo mesh, connected through an in-memory store.
std::vector<std::unique_ptr<GlooComm>> ConnectMesh(gloo::rendezvous::HashStore& store,
                                                   int n = 2) {
  std::vector<std::unique_ptr<GlooComm>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = GlooComm::Connect(r, n, "127.0.0.1", "", store, absl::Seconds(20));
      ASSERT_OK(c);
      comms[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  return comms;
}

// Runs `blocked` (a call on `comm` that no peer joins) on a thread and aborts `comm`
// 300 ms later: the call must fail within 5 s of the abort.
void ExpectAbortEnds(GlooComm& comm, const std::function<absl::Status()>& blocked) {
  absl::Status status;
  absl::Time ended;
  std::thread t([&] {
    status = blocked();
    ended = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time aborted = absl::Now();
  comm.Abort();
  t.join();
  EXPECT_FALSE(status.ok());
  EXPECT_LT(ended - aborted, absl::Seconds(5)) << status;
}

TEST(GlooCommTest, AbortEndsABlockedCollectiveAtOnceAndLeavesOtherMeshesAlone) {
  gloo::rendezvous::HashStore store_a, store_b;
  auto a = ConnectMesh(store_a);
  auto b = ConnectMesh(store_b);  // another mesh in this process, as in-process tests have
  ASSERT_TRUE(a[0] && a[1] && b[0] && b[1]);
  std::vector<float> x(1 << 18, 1.0f);
  // Rank 1 of mesh a never joins (a hung peer): rank 0 would wait for the 60 s timeout.
  ExpectAbortEnds(*a[0], [&] {
    return a[0]->Allreduce(DType::kFloat32, x.data(), x.data(), x.size(), absl::Seconds(60));
  });
  // Mesh b still works: Abort found mesh a's sockets only.
  std::vector<std::vector<float>> y(2, std::vector<float>(1000));
  std::vector<absl::Status> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < y[r].size(); ++i) y[r][i] = static_cast<float>(r + 1) * i;
    threads.emplace_back([&, r] {
      got[r] = b[r]->Allreduce(DType::kFloat32, y[r].data(), y[r].data(), y[r].size(),
                               absl::Seconds(20));
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK(got[r]);
    for (size_t i = 0; i < y[r].size(); ++i) ASSERT_EQ(y[r][i], 3.0f * i) << r << " " << i;
  }
}

// AllgatherBytes with the next exchange's receives posted a round ahead: messages of
// every length (inline, with tails, slots over the direct limit) arrive intact, round
// after round, whether or not the round before posted.
TEST(GlooCommTest, ExchangesWithReceivesPostedAheadDeliverEveryMessage) {
  gloo::rendezvous::HashStore store;
  auto c = ConnectMesh(store);
  ASSERT_TRUE(c[0] && c[1]);
  const std::vector<size_t> slots = {4096, 4096, 8192, 4096, 4 << 20, 4096, 4096, 65536};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      for (size_t i = 0; i < slots.size(); ++i) {
        // Round i: rank r sends i * 1500 + r bytes of (r + i), some longer than the slot.
        std::string mine(i * 1500 + r, static_cast<char>('a' + r + i));
        auto got = c[r]->AllgatherBytes(mine, slots[i], absl::Seconds(20));
        ASSERT_OK(got);
        for (int p = 0; p < 2; ++p) {
          ASSERT_EQ((*got)[p], std::string(i * 1500 + p, static_cast<char>('a' + p + i)))
              << "round " << i << " rank " << r << " from " << p;
        }
        if (i + 1 < slots.size() && i % 2 == 0) c[r]->PostNextExchange(slots[i + 1]);
      }
    });
  }
  for (auto& t : threads) t.join();
}

// With 3 and 4 ranks, exchanges in which some ranks send each peer a message of its own
// (AllgatherPerPeer) and the others one message to all (AllgatherFramed), receives posted
// ahead or not: every rank gets every peer's message to it, and a rank's own is its message
// to the next rank. Messages shorter than the slot, after longer ones in the same slot,
// arrive exactly (only the message is sent), and one longer than its slot from a rank
// sending one message to all still gets through.
TEST(GlooCommTest, ExchangesOfAMessagePerPeerDeliverEachPeerItsOwn) {
  for (int n : {3, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    gloo::rendezvous::HashStore store;
    auto c = ConnectMesh(store, n);
    for (int r = 0; r < n; ++r) ASSERT_NE(c[r], nullptr);
    constexpr size_t kSlot = 16384;
    // What rank `from` sends rank `to` in round i: per peer for even ranks from round 1 on.
    auto per_peer = [](int from, size_t i) { return i > 0 && from % 2 == 0; };
    auto message = [&](int from, int to, size_t i) {
      if (!per_peer(from, i)) to = 0;  // one message to all
      const size_t length = i == 1 ? 9000 + 10 * from + to : i == 3 && from == 1 ? 20000 : 100;
      return std::string(length, static_cast<char>('a' + to + 5 * from + i));
    };
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        for (size_t i = 0; i < 5; ++i) {
          absl::StatusOr<std::vector<absl::string_view>> got;
          std::string framed(sizeof(uint64_t), '\0');  // the own view points into it
          if (per_peer(r, i)) {
            char* room = c[r]->PerPeerRoom(kSlot);
            ASSERT_NE(room, nullptr);
            std::vector<size_t> lengths(n, 0);
            for (int p = 0; p < n; ++p) {
              if (p == r) continue;
              const std::string m = message(r, p, i);
              m.copy(room + p * kSlot + sizeof(uint64_t), m.size());
              lengths[p] = m.size();
            }
            got = c[r]->AllgatherPerPeer(lengths, kSlot, absl::Seconds(20));
          } else {
            framed += message(r, (r + 1) % n, i);
            got = c[r]->AllgatherFramed(&framed, kSlot, absl::Seconds(20));
          }
          ASSERT_OK(got);
          for (int p = 0; p < n; ++p) {
            ASSERT_EQ((*got)[p], message(p, p == r ? (r + 1) % n : r, i))
                << "round " << i << " rank " << r << " from " << p;
          }
          if (i % 2 == 1) c[r]->PostNextExchange(kSlot);
        }
      });
    }
    for (auto& t : threads) t.join();
  }
}

// ShareChunks on 2 to 4 ranks: every rank ends with every rank's chunk (counts smaller
// than the ranks: empty chunks), written by `fill` on the rank that owns it.
TEST(GlooCommTest, SharedChunksReachEveryRank) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    gloo::rendezvous::HashStore store;
    auto c = ConnectMesh(store, n);
    for (int r = 0; r < n; ++r) ASSERT_NE(c[r], nullptr);
    for (size_t count : {size_t{1}, size_t{3}, size_t{1001}, size_t{65537}}) {
      std::vector<std::vector<float>> out(n, std::vector<float>(count, -1.0f));
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
          const Chunk own = ChunkOf(count, r, n);
          ASSERT_OK(c[r]->ShareChunks(
              DType::kFloat32, out[r].data(), count,
              [&] {
                for (uint64_t k = own.begin; k < own.end; ++k) out[r][k] = 3.0f * k + r;
              },
              absl::Seconds(20)));
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < n; ++r) {
        for (int owner = 0; owner < n; ++owner) {
          const Chunk ch = ChunkOf(count, owner, n);
          for (uint64_t k = ch.begin; k < ch.end; ++k) {
            ASSERT_EQ(out[r][k], 3.0f * k + owner) << "count " << count << " rank " << r;
          }
        }
      }
    }
  }
}

// A rank whose peer never joins the exchange (receives posted ahead) is ended by Abort
// at once, and by its timeout without one.
TEST(GlooCommTest, ABlockedExchangeEndsAtAbortOrItsTimeout) {
  gloo::rendezvous::HashStore store;
  auto c = ConnectMesh(store);
  ASSERT_TRUE(c[0] && c[1]);
  c[0]->PostNextExchange(4096);
  absl::Time start = absl::Now();
  auto timed_out = c[0]->AllgatherBytes("x", 4096, absl::Milliseconds(500));
  EXPECT_FALSE(timed_out.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << timed_out.status();
  // A fresh mesh: the timeout broke that one.
  gloo::rendezvous::HashStore store2;
  auto d = ConnectMesh(store2);
  ASSERT_TRUE(d[0] && d[1]);
  d[0]->PostNextExchange(4096);
  ExpectAbortEnds(*d[0],
                  [&] { return d[0]->AllgatherBytes("y", 4096, absl::Seconds(60)).status(); });
}

// AllreduceDirect on 3 and 4 ranks: exact sums of every dtype the store takes, counts
// smaller than the ranks (empty shares), odd ones and large ones, in place or not, taking
// turns with the ring on the same mesh; every rank ends with the same bits.
TEST(GlooCommTest, DirectAllreduceGivesEveryRankTheSameExactSums) {
  for (int n : {3, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    gloo::rendezvous::HashStore store;
    auto c = ConnectMesh(store, n);
    for (int r = 0; r < n; ++r) ASSERT_NE(c[r], nullptr);
    struct Case {
      DType dtype;
      size_t count;
    };
    const std::vector<Case> cases = {
        {DType::kFloat32, 1},     {DType::kFloat32, 2},         {DType::kFloat32, 3},
        {DType::kFloat32, 5},     {DType::kFloat16, 1001},      {DType::kBFloat16, 77},
        {DType::kFloat64, 4099},  {DType::kInt32, 333},         {DType::kFloat32, 262147},
    };
    std::vector<std::thread> threads;
    std::vector<std::vector<float>> rounded(n);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        for (size_t i = 0; i < cases.size(); ++i) {
          Buffer in(cases[i].dtype, cases[i].count), out(cases[i].dtype, cases[i].count);
          in.Fill(r, 0, static_cast<int>(i));
          const bool inplace = i % 2 == 0;
          Buffer& result = inplace ? in : out;
          ASSERT_OK(c[r]->AllreduceDirect(cases[i].dtype, in.bytes.data(),
                                          result.bytes.data(), cases[i].count,
                                          absl::Seconds(20)));
          for (size_t k = 0; k < cases[i].count; ++k) {
            double want = 0;
            for (int p = 0; p < n; ++p) want += Value(k, p, 0, static_cast<int>(i));
            ASSERT_EQ(result.at(k), want) << "case " << i << " element " << k;
          }
          // The ring between two direct ones: their messages must not cross.
          Buffer ring(DType::kFloat32, 1000);
          ring.Fill(r, 1, 0);
          ASSERT_OK(c[r]->Allreduce(DType::kFloat32, ring.bytes.data(), ring.bytes.data(),
                                    ring.count, absl::Seconds(20)));
          for (size_t k = 0; k < ring.count; k += 7) {
            double want = 0;
            for (int p = 0; p < n; ++p) want += Value(k, p, 1, 0);
            ASSERT_EQ(ring.at(k), want) << "ring after case " << i << " element " << k;
          }
        }
        // Sums that round: every rank must still hold the same bits.
        std::vector<float> x(100003);
        for (size_t k = 0; k < x.size(); ++k) x[k] = 0.1f * static_cast<float>(k % 97 + r);
        ASSERT_OK(c[r]->AllreduceDirect(DType::kFloat32, x.data(), x.data(), x.size(),
                                        absl::Seconds(20)));
        rounded[r] = std::move(x);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(rounded[r].size(), 100003u);
      for (size_t k = 0; k < rounded[r].size(); ++k) {
        double want = 0;
        for (int p = 0; p < n; ++p) want += 0.1 * static_cast<double>(k % 97 + p);
        ASSERT_NEAR(rounded[r][k], want, 1e-3) << "rank " << r << " element " << k;
        ASSERT_EQ(std::memcmp(&rounded[r][k], &rounded[0][k], sizeof(float)), 0)
            << "rank " << r << " element " << k << " differs from rank 0's";
      }
    }
  }
}

// A direct allreduce that a peer never joins ends at its timeout, and at once on Abort.
TEST(GlooCommTest, ABlockedDirectAllreduceEndsAtAbortOrItsTimeout) {
  gloo::rendezvous::HashStore store;
  auto c = ConnectMesh(store, 3);
  ASSERT_TRUE(c[0] && c[1] && c[2]);
  std::vector<float> x(3000, 1.0f);
  const absl::Time start = absl::Now();
  const absl::Status timed_out =
      c[0]->AllreduceDirect(DType::kFloat32, x.data(), x.data(), x.size(),
                            absl::Milliseconds(500));
  EXPECT_FALSE(timed_out.ok());
  EXPECT_TRUE(absl::StrContains(timed_out.message(), "allreduce (direct)")) << timed_out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << timed_out;
  gloo::rendezvous::HashStore store2;
  auto d = ConnectMesh(store2, 3);
  ASSERT_TRUE(d[0] && d[1] && d[2]);
  ExpectAbortEnds(*d[0], [&] {
    return d[0]->AllreduceDirect(DType::kFloat32, x.data(), x.data(), x.size(),
                                 absl::Seconds(60));
  });
}

}  // namespace
}  // namespace hybridps::testing

#endif  // HYBRIDPS_HAVE_GLOO
