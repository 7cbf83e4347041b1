#include "server/key_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/compression.h"
#include "common/dtype.h"
#include "common/reduce.h"
#include "common/wire.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

class KeyStoreTest : public ::testing::Test {
 protected:
  KeyStoreTest() : store_(3, [this](KeyStore::Reply r) { replies_.push_back(std::move(r)); }) {}

  static wire::DataRequest Req(const std::string& name, uint64_t round, uint64_t count,
                               wire::DataOp op = wire::OP_PUSHPULL, int root = -1) {
    wire::DataRequest r;
    r.set_key(TensorKeyFor(name));
    r.set_part(0);
    r.set_round(round);
    r.set_op(op);
    r.set_dtype(static_cast<uint32_t>(DType::kFloat32));
    r.set_count(count);
    r.set_total_count(count);
    r.set_root(root);
    r.set_name(name);
    return r;
  }
  static uint64_t TensorKeyFor(const std::string& name) { return std::hash<std::string>()(name); }
  static std::optional<Frame> Floats(std::vector<float> v) {
    return Frame(absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  }
  static std::vector<float> AsFloats(const Frame& f) {
    std::vector<float> v(f.size() / 4);
    std::memcpy(v.data(), f.data(), f.size());
    return v;
  }

  KeyStore store_;
  std::vector<KeyStore::Reply> replies_;
};

TEST_F(KeyStoreTest, SumsARoundAndAnswersEveryoneWhenTheLastArrives) {
  store_.Handle("a", 0, 1, Req("w", 0, 2), Floats({1, 2}));
  store_.Handle("b", 1, 2, Req("w", 0, 2), Floats({10, 20}));
  EXPECT_TRUE(replies_.empty());  // Pulls wait for the round.
  store_.Handle("c", 2, 3, Req("w", 0, 2), Floats({100, 200}));
  ASSERT_EQ(replies_.size(), 3u);
  for (auto& r : replies_) {
    ASSERT_TRUE(r.env.has_data_response()) << r.env.DebugString();
    ASSERT_TRUE(r.payload.has_value());
    EXPECT_EQ(AsFloats(*r.payload), (std::vector<float>{111, 222}));
  }
  EXPECT_EQ(replies_[0].peer, "a");
  EXPECT_EQ(replies_[0].env.id(), 1u);
  // The next round starts from scratch.
  replies_.clear();
  for (int r = 0; r < 3; ++r) store_.Handle("p", r, 10 + r, Req("w", 1, 2), Floats({1, 1}));
  ASSERT_EQ(replies_.size(), 3u);
  EXPECT_EQ(AsFloats(*replies_[2].payload), (std::vector<float>{3, 3}));
}

// A round counts nodes; its errors name a node by its workers ("node 1 (workers 2, 3)"),
// and a node of one worker by that worker.
TEST(KeyStoreNamesTest, MismatchesNameTheNodesAndTheirWorkers) {
  std::vector<KeyStore::Reply> replies;
  KeyStore store(3, [&](KeyStore::Reply r) { replies.push_back(std::move(r)); }, nullptr,
                 {{0, 1}, {2, 3}, {4}});
  auto req = [](uint64_t count, wire::DataOp op = wire::OP_PUSHPULL, int root = -1) {
    wire::DataRequest r;
    r.set_key(7);
    r.set_round(0);
    r.set_op(op);
    r.set_dtype(static_cast<uint32_t>(DType::kFloat32));
    r.set_count(count);
    r.set_total_count(count);
    r.set_root(root);
    r.set_name("w");
    return r;
  };
  auto floats = [](size_t n) { return Frame(std::string(n * 4, '\0')); };
  store.Handle("a", 0, 1, req(2), floats(2));
  store.Handle("b", 1, 2, req(3), floats(3));
  ASSERT_EQ(replies.size(), 2u);
  for (auto& r : replies) {
    ASSERT_TRUE(r.env.has_error()) << r.env.DebugString();
    EXPECT_NE(r.env.error().message().find("node 1 (workers 2, 3) sent 3 float32 elements but "
                                           "node 0 (workers 0, 1) sent 2"),
              std::string::npos)
        << r.env.error().message();
  }
  replies.clear();
  store.Handle("c", 2, 3, req(2), floats(2));  // the failed round ends with the third node
  replies.clear();
  wire::DataRequest b0 = req(2, wire::OP_BROADCAST, 2), b1 = req(2, wire::OP_BROADCAST, 0);
  b0.set_round(1);
  b1.set_round(1);
  store.Handle("c", 2, 4, b0, floats(2));
  store.Handle("a", 0, 5, b1, floats(2));
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_NE(replies[1].env.error().message().find(
                "node 0 (workers 0, 1) broadcasts from a root on node 0 (workers 0, 1) but "
                "worker 4 from root worker 4"),
            std::string::npos)
      << replies[1].env.error().message();
}

// The failing request carries one local rank's shape, which may differ from another
// node's push that came first: the round fails with the node's own message (it names both
// local shapes), not with a comparison against that one shape.
TEST_F(KeyStoreTest, AFailingRequestOfAnotherShapeFailsTheRoundWithItsMessage) {
  store_.Handle("a", 0, 1, Req("w", 0, 101), Floats(std::vector<float>(101, 1)));
  wire::DataRequest fail = Req("w", 0, 100);
  fail.set_fail("the node's local ranks disagree: local rank 1 sent 101 float32 elements but "
                "local rank 0 sent 100");
  store_.Handle("b", 1, 2, fail, std::nullopt);
  ASSERT_EQ(replies_.size(), 2u);
  for (auto& r : replies_) {
    ASSERT_TRUE(r.env.has_error()) << r.env.DebugString();
    EXPECT_NE(r.env.error().message().find("local ranks disagree"), std::string::npos)
        << r.env.error().message();
  }
}

// A node whose local ranks disagreed sends a failing request (no payload): the round
// fails for every node at once with its message, and the next round is unaffected.
TEST_F(KeyStoreTest, AFailingRequestFailsTheRoundForEveryNode) {
  store_.Handle("a", 0, 1, Req("w", 0, 2), Floats({1, 2}));
  wire::DataRequest fail = Req("w", 0, 2);
  fail.set_fail("local rank 1 sent 12 float32 elements but local rank 0 sent 2");
  ASSERT_OK(ValidateDataRequest(fail, std::nullopt));
  EXPECT_FALSE(ValidateDataRequest(fail, Floats({1, 2})).ok());  // no payload with it
  store_.Handle("b", 1, 2, fail, std::nullopt);
  ASSERT_EQ(replies_.size(), 2u);
  for (auto& r : replies_) {
    ASSERT_TRUE(r.env.has_error()) << r.env.DebugString();
    EXPECT_NE(r.env.error().message().find("'w'"), std::string::npos);
    EXPECT_NE(r.env.error().message().find("local rank 1 sent 12"), std::string::npos);
  }
  store_.Handle("c", 2, 3, Req("w", 0, 2), Floats({1, 2}));
  ASSERT_EQ(replies_.size(), 3u);
  EXPECT_TRUE(replies_[2].env.has_error());
  replies_.clear();
  for (int r = 0; r < 3; ++r) store_.Handle("p", r, 10 + r, Req("w", 1, 2), Floats({1, 1}));
  ASSERT_EQ(replies_.size(), 3u);
  EXPECT_EQ(AsFloats(*replies_[2].payload), (std::vector<float>{3, 3}));
}

TEST_F(KeyStoreTest, MismatchedSizesFailTheRoundForEveryWorkerAndNameTheKey) {
  store_.Handle("a", 0, 1, Req("w", 0, 10), Floats(std::vector<float>(10, 1)));
  store_.Handle("b", 1, 2, Req("w", 0, 12), Floats(std::vector<float>(12, 1)));
  ASSERT_EQ(replies_.size(), 2u);  // Both waiting workers hear at once.
  for (auto& r : replies_) {
    ASSERT_TRUE(r.env.has_error());
    const std::string& m = r.env.error().message();
    EXPECT_NE(m.find("'w'"), std::string::npos) << m;
    EXPECT_NE(m.find("12 float32"), std::string::npos) << m;
    EXPECT_NE(m.find("10 float32"), std::string::npos) << m;
  }
  store_.Handle("c", 2, 3, Req("w", 0, 10), Floats(std::vector<float>(10, 1)));
  ASSERT_EQ(replies_.size(), 3u);  // A later arrival of the failed round hears too.
  EXPECT_TRUE(replies_[2].env.has_error());
  // Other keys, and the next round of this one, are unaffected.
  replies_.clear();
  for (int r = 0; r < 3; ++r) store_.Handle("p", r, 20 + r, Req("w", 1, 1), Floats({2}));
  ASSERT_EQ(replies_.size(), 3u);
  EXPECT_EQ(AsFloats(*replies_[0].payload), (std::vector<float>{6}));
}

TEST_F(KeyStoreTest, ShapesOfTheSameSizeMustAgreeWhereGiven) {
  auto shaped = [](uint64_t round, std::vector<int64_t> dims) {
    wire::DataRequest r = Req("w", round, 6);
    for (int64_t d : dims) r.add_shape(d);
    return r;
  };
  store_.Handle("a", 0, 1, shaped(0, {2, 3}), Floats(std::vector<float>(6, 1)));
  store_.Handle("b", 1, 2, shaped(0, {3, 2}), Floats(std::vector<float>(6, 1)));
  ASSERT_EQ(replies_.size(), 2u);
  for (auto& r : replies_) {
    ASSERT_TRUE(r.env.has_error());
    EXPECT_EQ(r.env.error().message(),
              "mismatched push_pull of tensor 'w' (key " +
                  absl::StrFormat("%016x", TensorKeyFor("w")) +
                  ", partition 0, round 0): worker 1 sent (3, 2) float32 but worker 0 sent "
                  "(2, 3) float32");
  }
  // A first node that gives no shape does not hide a disagreement of the others.
  replies_.clear();
  store_.Handle("a", 0, 1, Req("w", 1, 6), Floats(std::vector<float>(6, 1)));
  store_.Handle("b", 1, 2, shaped(1, {2, 3}), Floats(std::vector<float>(6, 1)));
  store_.Handle("c", 2, 3, shaped(1, {3, 2}), Floats(std::vector<float>(6, 1)));
  ASSERT_EQ(replies_.size(), 3u);
  for (auto& r : replies_) {
    ASSERT_TRUE(r.env.has_error());
    EXPECT_TRUE(absl::StrContains(r.env.error().message(),
                                  "worker 2 sent (3, 2) float32 but worker 1 sent (2, 3)"))
        << r.env.error().message();
  }
  // A node that gives no shape (the C++ API) agrees with any of the same size.
  replies_.clear();
  store_.Handle("a", 0, 1, shaped(2, {2, 3}), Floats(std::vector<float>(6, 1)));
  store_.Handle("b", 1, 2, Req("w", 2, 6), Floats(std::vector<float>(6, 1)));
  store_.Handle("c", 2, 3, shaped(2, {2, 3}), Floats(std::vector<float>(6, 1)));
  ASSERT_EQ(replies_.size(), 3u);
  for (auto& r : replies_) EXPECT_FALSE(r.env.has_error()) << r.env.error().message();
}

TEST_F(KeyStoreTest, CompressedPushesAreUnpackedAndSummedWithPlainOnes) {
  // Node 0 sends [0.7, -0.7, 0.2] packed (+0.5, -0.5, 0), nodes 1 and 2 plain floats.
  const std::vector<float> grad = {0.7f, -0.7f, 0.2f};
  std::vector<float> residual(3, 0.0f);
  std::string packed(TwoBitBytes(3), '\0');
  TwoBitQuantize(grad.data(), 3, 0.5f, residual.data(), packed.data());
  wire::DataRequest compressed = Req("w", 0, 3);
  compressed.set_compression(static_cast<uint32_t>(Compression::kTwoBit));
  compressed.set_threshold(0.5f);
  store_.Handle("a", 0, 1, compressed, Frame(packed));
  store_.Handle("b", 1, 2, Req("w", 0, 3), Floats({1, 1, 1}));
  store_.Handle("c", 2, 3, Req("w", 0, 3), Floats({1, 2, 3}));
  ASSERT_EQ(replies_.size(), 3u);
  for (auto& r : replies_) {
    ASSERT_FALSE(r.env.has_error()) << r.env.error().message();
    EXPECT_EQ(AsFloats(*r.payload), (std::vector<float>{2.5f, 2.5f, 4.0f}));
  }
  EXPECT_EQ(store_.traffic().bytes_in, packed.size() + 2 * 12);  // as they came
  EXPECT_EQ(store_.traffic().bytes_decompressed, 12u);
}

TEST_F(KeyStoreTest, RejectsEarlierRoundsDuplicatesAndBadRanks) {
  for (int r = 0; r < 3; ++r) store_.Handle("p", r, r, Req("w", 0, 1), Floats({1}));
  ASSERT_EQ(replies_.size(), 3u);  // round 0 done; the server is at round 1
  replies_.clear();
  store_.Handle("a", 0, 1, Req("w", 0, 1), Floats({1}));
  ASSERT_EQ(replies_.size(), 1u);
  EXPECT_NE(replies_[0].env.error().message().find("round 0 but the server is at round 1"),
            std::string::npos)
      << replies_[0].env.error().message();
  store_.Handle("a", 0, 2, Req("w", 1, 1), Floats({1}));
  store_.Handle("a", 0, 3, Req("w", 1, 1), Floats({1}));
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_NE(replies_[1].env.error().message().find("twice"), std::string::npos);
  store_.Handle("z", 7, 4, Req("w", 1, 1), Floats({1}));
  ASSERT_EQ(replies_.size(), 3u);
  EXPECT_NE(replies_[2].env.error().message().find("node 7 is out of range"), std::string::npos);
}

TEST_F(KeyStoreTest, ALaterRoundAbandonsAStaleOpenOne) {
  // Worker 0 pushed round 0 and gave up on it (say, a mismatch elsewhere in the tensor);
  // the others moved on to round 3. Round 0's data must not be mixed into round 3.
  store_.Handle("a", 0, 1, Req("w", 0, 1), Floats({100}));
  store_.Handle("b", 1, 2, Req("w", 3, 1), Floats({1}));
  ASSERT_EQ(replies_.size(), 1u);
  EXPECT_EQ(replies_[0].peer, "a");
  EXPECT_NE(replies_[0].env.error().message().find("abandoned"), std::string::npos);
  replies_.clear();
  store_.Handle("a", 0, 3, Req("w", 3, 1), Floats({2}));
  store_.Handle("c", 2, 4, Req("w", 3, 1), Floats({4}));
  ASSERT_EQ(replies_.size(), 3u);
  for (auto& r : replies_) EXPECT_EQ(AsFloats(*r.payload), (std::vector<float>{7}));
}

TEST_F(KeyStoreTest, BroadcastSendsTheRootsValueAndNothingBackToTheRoot) {
  store_.Handle("a", 0, 1, Req("b", 0, 2, wire::OP_BROADCAST, 1), std::nullopt);
  store_.Handle("b", 1, 2, Req("b", 0, 2, wire::OP_BROADCAST, 1), Floats({5, 6}));
  store_.Handle("c", 2, 3, Req("b", 0, 2, wire::OP_BROADCAST, 1), std::nullopt);
  ASSERT_EQ(replies_.size(), 3u);
  for (auto& r : replies_) {
    ASSERT_TRUE(r.env.has_data_response());
    if (r.peer == "b") {
      EXPECT_FALSE(r.payload.has_value());
    } else {
      EXPECT_EQ(AsFloats(*r.payload), (std::vector<float>{5, 6}));
    }
  }
}

TEST_F(KeyStoreTest, BroadcastRootsMustAgreeAndSendData) {
  store_.Handle("a", 0, 1, Req("b", 0, 2, wire::OP_BROADCAST, 0), Floats({1, 2}));
  store_.Handle("b", 1, 2, Req("b", 0, 2, wire::OP_BROADCAST, 2), std::nullopt);
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_NE(replies_[1].env.error().message().find("root"), std::string::npos);
  replies_.clear();
  store_.Handle("c", 2, 3, Req("b", 0, 2, wire::OP_BROADCAST, 0), std::nullopt);
  ASSERT_EQ(replies_.size(), 1u);
  // Next round: the root forgets its data.
  replies_.clear();
  store_.Handle("a", 0, 4, Req("b", 1, 2, wire::OP_BROADCAST, 0), std::nullopt);
  ASSERT_EQ(replies_.size(), 1u);
  EXPECT_NE(replies_[0].env.error().message().find("no data"), std::string::npos);
}

TEST_F(KeyStoreTest, MixedOpsInOneRoundAreAnError) {
  store_.Handle("a", 0, 1, Req("m", 0, 1), Floats({1}));
  store_.Handle("b", 1, 2, Req("m", 0, 1, wire::OP_BROADCAST, 0), std::nullopt);
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_NE(replies_[1].env.error().message().find("broadcast"), std::string::npos);
}

TEST_F(KeyStoreTest, FailAllAnswersWaitersAndLaterRequests) {
  store_.Handle("a", 0, 1, Req("w", 0, 1), Floats({1}));
  store_.FailAll(absl::UnavailableError("worker 2 died"));
  ASSERT_EQ(replies_.size(), 1u);
  EXPECT_NE(replies_[0].env.error().message().find("worker 2 died"), std::string::npos);
  store_.Handle("b", 1, 2, Req("x", 0, 1), Floats({1}));
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_TRUE(replies_[1].env.has_error());
}

}  // namespace
}  // namespace hybridps

namespace hybridps {
namespace {

// Large sums go to the offload hook; the round closes only after every sum is done, and
// a late SumDone of a failed round is ignored.
TEST(KeyStoreOffload, RoundClosesAfterOffloadedSums) {
  std::vector<KeyStore::Reply> replies;
  std::vector<KeyStore::SumTask> tasks;
  KeyStore store(
      3, [&](KeyStore::Reply r) { replies.push_back(std::move(r)); },
      [&](KeyStore::SumTask t) { tasks.push_back(std::move(t)); });
  const size_t n = KeyStore::kInlineSumBytes / 4 + 1;  // just above the inline limit
  wire::DataRequest req;
  req.set_key(1);
  req.set_op(wire::OP_PUSHPULL);
  req.set_dtype(static_cast<uint32_t>(DType::kFloat32));
  req.set_count(n);
  req.set_total_count(n);
  req.set_name("big");
  auto payload = [&](float v) {
    std::vector<float> x(n, v);
    return std::optional<Frame>(
        Frame(absl::string_view(reinterpret_cast<const char*>(x.data()), n * 4)));
  };
  store.Handle("a", 0, 1, req, payload(1));  // becomes the accumulator
  store.Handle("b", 1, 2, req, payload(2));  // offloaded
  store.Handle("c", 2, 3, req, payload(4));  // queued behind it (offloaded too)
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_TRUE(replies.empty());  // everyone arrived, sums still pending
  for (auto& t : tasks) {
    SumInto(t.dtype, t.dst, t.src.data(), t.count);
    store.SumDone(t.key, t.part, t.round);
  }
  ASSERT_EQ(replies.size(), 3u);
  std::vector<float> got(n);
  std::memcpy(got.data(), replies[0].payload->data(), n * 4);
  EXPECT_EQ(got[0], 7.f);
  EXPECT_EQ(got[n - 1], 7.f);
  store.SumDone(1, 0, 0);  // stale: ignored
  EXPECT_EQ(replies.size(), 3u);
}

}  // namespace
}  // namespace hybridps
