// The conformance suite's mismatches (every rank gets an error naming the tensor and what
// differs, every time) and MXNet's 2bit compression, on every parameter of
// conformance_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/cluster/conformance.h"

namespace hybridps::testing {
namespace {

TEST_P(MultiWorkerTest, MismatchedSizesFailEveryRankNamingTheTensorAndSizes) {
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
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  const int odd = n() - 1;
  // One worker cannot disagree with itself: it checks the agreeing case below only.
  for (int rep = 0; n() >= 2 && rep < 20; ++rep) {
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

TEST_P(MultiWorkerTest, MismatchedDTypesFailEveryRankNamingBoth) {
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
TEST_P(MultiWorkerTest, MismatchedBroadcastsFailEveryRankNamingWhatDiffers) {
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

}  // namespace
}  // namespace hybridps::testing
