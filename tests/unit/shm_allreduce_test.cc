// The shared-memory allreduce of dist_allreduce (worker/node/shm_allreduce.h), with threads as
// the local ranks (each maps the segment on its own, as a process would): exact sums in
// every dtype over sizes that span several chunks, in place and out of place; a rank
// that never arrives is named at the deadline; Abort ends the others' waits at once.
#include "tests/status_matchers.h"
#include "worker/node/shm_allreduce.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "tests/cluster/tensor_fill.h"

namespace hybridps {
namespace {

using testing::GetElement;
using testing::SetElement;

constexpr size_t kChunk = 64 << 10;  // small, so that tensors span several chunks

std::string Name(absl::string_view test) {
  return absl::StrCat("/hps-test-shmar-", getpid(), "-", test);
}

// Opens a segment for `n` ranks on n threads, then runs fn(rank, store) on each.
void OnRanks(const std::string& name, int n,
             const std::function<void(int, ShmAllreduce*)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto s = ShmAllreduce::Open(name, r, n, kChunk, absl::Now() + absl::Seconds(10));
      ASSERT_OK(s);
      fn(r, s->get());
    });
  }
  for (auto& t : threads) t.join();
}

// Element i of rank r: small integers, exact in every dtype (sums of up to 4 ranks < 128).
double Val(size_t i, int r, int round) { return static_cast<double>((i * 7 + r * 3 + round) % 29); }

TEST(ShmAllreduceTest, ExactSumsInEveryDTypeAcrossChunks) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " local ranks"));
    OnRanks(Name(absl::StrCat("sums", n)), n, [&](int r, ShmAllreduce* s) {
      for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                       DType::kInt32, DType::kInt64, DType::kUInt8}) {
        const size_t es = DTypeSize(dt);
        // 0, 1, odd, exactly one chunk, several chunks and a tail.
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, kChunk / es,
                             3 * kChunk / es + 5}) {
          for (int round = 0; round < 2; ++round) {
            std::vector<char> in(count * es + 1), out(count * es + 1);
            for (size_t i = 0; i < count; ++i) SetElement(dt, in.data(), i, Val(i, r, round));
            const bool inplace = round == 1;
            absl::Status st = s->Allreduce(dt, in.data(), inplace ? in.data() : out.data(),
                                           count, absl::Seconds(20));
            ASSERT_OK(st);
            const char* res = inplace ? in.data() : out.data();
            for (size_t i = 0; i < count; ++i) {
              double want = 0;
              for (int k = 0; k < n; ++k) want += Val(i, k, round);
              ASSERT_EQ(GetElement(dt, res, i), want)
                  << DTypeName(dt) << " count " << count << " element " << i;
            }
          }
        }
      }
    });
  }
}

// The negotiation's exchange: every rank's message by local rank, the views of one call
// valid until the rank's next call (two areas take turns; the others may be a call ahead
// by then), interleaved with allreduces, some messages written in place
// (AllgatherWritten); a message too big for an area is ResourceExhausted on every rank
// alike.
TEST(ShmAllreduceTest, AllgatherGivesEveryRanksMessageAndRefusesTooBigOnesEverywhere) {
  constexpr int kRanks = 3;
  std::vector<absl::StatusCode> too_big(kRanks);
  OnRanks(Name("gather"), kRanks, [&](int r, ShmAllreduce* s) {
    auto msg = [](int rank, int round) {
      return std::string(static_cast<size_t>(1 + (rank * 977 + round * 131) % 5000),
                         static_cast<char>('a' + (rank + round) % 26));
    };
    std::vector<absl::string_view> previous;
    for (int round = 0; round < 20; ++round) {
      for (int k = 0; k < kRanks && round > 0; ++k) {  // the last call's, still intact
        ASSERT_EQ(previous[k], msg(k, round - 1)) << "round " << round << " rank " << k;
      }
      const std::string mine = msg(r, round);
      std::vector<absl::string_view> got;
      if ((r + round) % 2 == 0) {  // written in place by this rank, copied by the others
        std::memcpy(s->NextMessage(), mine.data(), mine.size());
        for (int k = 0; k < kRanks && round > 0; ++k) {  // another area than the last call's
          ASSERT_EQ(previous[k], msg(k, round - 1)) << "round " << round << " rank " << k;
        }
        ASSERT_OK(s->AllgatherWritten(mine.size(), absl::Seconds(20), &got));
      } else {
        ASSERT_OK(s->Allgather(mine, absl::Seconds(20), &got));
      }
      ASSERT_EQ(got.size(), static_cast<size_t>(kRanks));
      for (int k = 0; k < kRanks; ++k) {
        ASSERT_EQ(got[k], msg(k, round)) << "round " << round << " rank " << k;
      }
      previous = got;
      if (round % 3 == 0) {  // allreduces between exchanges use other memory
        float x[100];
        for (float& v : x) v = static_cast<float>(r);
        ASSERT_OK(s->Allreduce(DType::kFloat32, x, x, 100, absl::Seconds(20)));
        ASSERT_EQ(x[99], 0.0f + 1.0f + 2.0f);
        for (int k = 0; k < kRanks; ++k) ASSERT_EQ(previous[k], msg(k, round));
      }
    }
    // Rank 1's is too big; rank 2 wrote its own in place.
    const std::string big(r == 1 ? ShmAllreduce::kExchangeBytes : 10, 'x');
    if (r == 2) {
      std::memcpy(s->NextMessage(), big.data(), big.size());
      std::vector<absl::string_view> got;
      too_big[r] = s->AllgatherWritten(big.size(), absl::Seconds(20), &got).code();
    } else {
      too_big[r] = s->Allgather(big, absl::Seconds(20)).status().code();
    }
    // Still usable afterwards.
    auto after = s->Allgather("after", absl::Seconds(20));
    ASSERT_OK(after);
    EXPECT_EQ((*after)[(r + 1) % kRanks], "after");
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(too_big[r], absl::StatusCode::kResourceExhausted) << "rank " << r;
  }
}

// Each rank in turn arrives late, long after the others stopped spinning and yielding
// (they sleep on the futex): no barrier lets a rank through before the late one, so every
// sum and every exchanged message is exact, and the late rank's arrival wakes the
// sleepers (they would otherwise sleep until their 20 s deadline and fail).
TEST(ShmAllreduceTest, RanksArrivingLateInTurnWakeTheSleepersAndMissNothing) {
  constexpr int kRanks = 3;
  constexpr int kRounds = 12;
  OnRanks(Name("late-turns"), kRanks, [&](int r, ShmAllreduce* s) {
    s->set_sleep_slice_for_testing(absl::Seconds(600));
    for (int round = 0; round < kRounds; ++round) {
      if (round % kRanks == r) absl::SleepFor(absl::Milliseconds(3));
      const std::string mine = absl::StrCat("rank ", r, " round ", round);
      std::vector<absl::string_view> all;
      ASSERT_OK(s->Allgather(mine, absl::Seconds(20), &all));
      ASSERT_EQ(all.size(), size_t{kRanks});
      for (int k = 0; k < kRanks; ++k) {
        ASSERT_EQ(all[k], absl::StrCat("rank ", k, " round ", round)) << r;
      }
      if ((round + 1) % kRanks == r) absl::SleepFor(absl::Milliseconds(3));
      // Several chunks: a late rank at any of the chunks' barriers would show as a
      // missing term.
      const size_t count = 2 * kChunk / sizeof(float) + 3;
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(Val(i, r, round));
      ASSERT_OK(s->Allreduce(DType::kFloat32, x.data(), x.data(), count, absl::Seconds(20)));
      for (size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int k = 0; k < kRanks; ++k) want += Val(i, k, round);
        ASSERT_EQ(x[i], want) << "rank " << r << " round " << round << " element " << i;
      }
    }
  });
}

// Broadcasts from every root, back to back (no other collective between them), over
// several chunks and in every element size.
TEST(ShmAllreduceTest, BroadcastsFromEveryRootBackToBack) {
  constexpr int kRanks = 3;
  OnRanks(Name("bcast"), kRanks, [&](int r, ShmAllreduce* s) {
    for (DType dt : {DType::kUInt8, DType::kFloat16, DType::kFloat32, DType::kFloat64}) {
      const size_t count = 2 * kChunk / DTypeSize(dt) + 3;
      for (int root = 0; root < kRanks; ++root) {
        std::vector<char> data(count * DTypeSize(dt));
        for (size_t i = 0; i < count; ++i) SetElement(dt, data.data(), i, Val(i, r, root));
        ASSERT_OK(s->Broadcast(dt, data.data(), count, root, absl::Seconds(20)));
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(GetElement(dt, data.data(), i), Val(i, root, root))
              << DTypeName(dt) << " root " << root << " element " << i;
        }
      }
    }
    float x[1];
    EXPECT_EQ(s->Broadcast(DType::kFloat32, x, 1, kRanks, absl::Seconds(1)).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

// An allreduce and then at once a broadcast (what dist_allreduce's plan does within a
// round, and Module's init after a push): the broadcast's root must not overwrite the
// result region while a slower rank still copies the allreduce's result out of it. More
// ranks than cores, so that some rank is often descheduled in the middle of its copy.
TEST(ShmAllreduceTest, AllreduceThenBroadcastBackToBackNeverMixTheirData) {
  for (int n : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " local ranks"));
    OnRanks(Name(absl::StrCat("mix", n)), n, [&](int r, ShmAllreduce* s) {
      const size_t count = kChunk / sizeof(float) + 17;  // two chunks, the last one short
      std::vector<float> x(count), b(count);
      for (int round = 0; round < 300; ++round) {
        const int root = round % n;
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(Val(i, r, round));
        ASSERT_OK(s->Allreduce(DType::kFloat32, x.data(), x.data(), count, absl::Seconds(30)));
        for (size_t i = 0; i < count; ++i) b[i] = r == root ? 1000.0f + round : -1.0f;
        ASSERT_OK(s->Broadcast(DType::kFloat32, b.data(), count, root, absl::Seconds(30)));
        for (size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int k = 0; k < n; ++k) want += Val(i, k, round);
          if (x[i] != want || b[i] != 1000.0f + round) {
            s->Abort(absl::InternalError("wrong data"));  // the others stop at once
            FAIL() << "round " << round << " rank " << r << " element " << i << ": allreduce "
                   << x[i] << " (want " << want << "), broadcast " << b[i] << " (want "
                   << 1000.0f + round << ")";
          }
        }
      }
    });
  }
}

TEST(ShmAllreduceTest, ARankThatNeverArrivesIsNamedAtTheDeadline) {
  std::vector<absl::Status> got(3);
  OnRanks(Name("late"), 3, [&](int r, ShmAllreduce* s) {
    if (r == 2) return;  // attaches, never calls
    float x[4] = {1, 2, 3, 4};
    const absl::Time t0 = absl::Now();
    got[r] = s->Allreduce(DType::kFloat32, x, x, 4, absl::Milliseconds(300));
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  });
  // The first to time out names rank 2 (and aborts); the other may read either.
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(got[r].ok()) << r;
    named = named || absl::StrContains(got[r].message(), "local rank 2 did not arrive");
  }
  EXPECT_TRUE(named) << got[0] << " / " << got[1];
}

// A caller that claims more bytes in place than the area holds gets an internal error,
// and the peers' exchange fails at once with it instead of waiting for their timeout.
TEST(ShmAllreduceTest, AnInPlaceMessageOverTheRoomFailsEveryRankAtOnce) {
  std::vector<absl::Status> got(2);
  OnRanks(Name("over-room"), 2, [&](int r, ShmAllreduce* s) {
    std::vector<absl::string_view> all;
    const absl::Time t0 = absl::Now();
    got[r] = r == 0 ? s->AllgatherWritten(ShmAllreduce::kMessageBytes + 1, absl::Seconds(60),
                                          &all)
                    : s->Allgather("mine", absl::Seconds(60), &all);
    EXPECT_LT(absl::Now() - t0, absl::Seconds(30)) << r;
  });
  EXPECT_EQ(got[0].code(), absl::StatusCode::kInternal) << got[0];
  EXPECT_TRUE(absl::StrContains(got[0].message(), "written in place")) << got[0];
  // Named by local rank (the reason may not be in the segment yet when the flag is seen).
  EXPECT_FALSE(got[1].ok());
  EXPECT_TRUE(absl::StrContains(got[1].message(), "local rank 0")) << got[1];
}

// The negotiation's exchange counts its timeout from when it stops spinning: it still
// ends, naming the rank that never came.
TEST(ShmAllreduceTest, AnExchangeARankNeverJoinsEndsAtItsTimeoutNamingIt) {
  std::vector<absl::Status> got(3);
  std::vector<absl::Duration> took(3);
  OnRanks(Name("late-exchange"), 3, [&](int r, ShmAllreduce* s) {
    if (r == 2) return;  // attaches, never calls
    const absl::Time t0 = absl::Now();
    got[r] = s->Allgather("mine", absl::Milliseconds(300)).status();
    took[r] = absl::Now() - t0;
    EXPECT_LT(took[r], absl::Seconds(5)) << r;
  });
  // The first to give up waited its whole timeout; its abort may end the other's sooner.
  EXPECT_GE(std::max(took[0], took[1]), absl::Milliseconds(300));
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(got[r].ok()) << r;
    named = named || absl::StrContains(got[r].message(), "local rank 2 did not arrive");
  }
  EXPECT_TRUE(named) << got[0] << " / " << got[1];
}

TEST(ShmAllreduceTest, AbortEndsTheOthersWaitsAtOnce) {
  std::vector<absl::Status> got(2);
  OnRanks(Name("abort"), 2, [&](int r, ShmAllreduce* s) {
    if (r == 1) {
      absl::SleepFor(absl::Milliseconds(100));
      s->Abort(absl::UnavailableError("the scheduler says worker 7 died"));
      float x[4] = {};
      got[1] = s->Allreduce(DType::kFloat32, x, x, 4, absl::Seconds(30));
      return;
    }
    float x[4] = {1, 2, 3, 4};
    const absl::Time t0 = absl::Now();
    got[0] = s->Allreduce(DType::kFloat32, x, x, 4, absl::Seconds(30));
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  });
  ASSERT_FALSE(got[0].ok());
  EXPECT_EQ(got[0].code(), absl::StatusCode::kUnavailable) << got[0];
  EXPECT_TRUE(absl::StrContains(got[0].message(), "local rank 1")) << got[0];
  EXPECT_TRUE(absl::StrContains(got[1].message(), "worker 7 died")) << got[1];
}

TEST(ShmAllreduceTest, OpenFailsCleanlyWhenARankNeverAttaches) {
  const std::string name = Name("alone");
  auto s = ShmAllreduce::Open(name, 0, 2, kChunk, absl::Now() + absl::Milliseconds(200));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "1 of 2 local ranks attached"))
      << s.status();
  // Nothing is left behind.
  EXPECT_NE(access((std::string("/dev/shm") + name).c_str(), F_OK), 0);
  auto bad = ShmAllreduce::Open(name, 0, 2, 1000, absl::Now());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// Local rank 0 created the segment and died before initialising it (so it cannot remove
// it either): the rank that gives up waiting removes it.
TEST(ShmAllreduceTest, ARankThatGivesUpRemovesTheSegmentOfADeadCreator) {
  const std::string name = Name("dead-creator");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 16 << 20), 0);  // big enough for any layout of 3 ranks here
  close(fd);
  auto late = ShmAllreduce::Open(name, 1, 3, kChunk, absl::Now() + absl::Milliseconds(300));
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(absl::StrContains(late.status().message(), "never initialised")) << late.status();
  EXPECT_NE(access((std::string("/dev/shm") + name).c_str(), F_OK), 0);
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace hybridps
