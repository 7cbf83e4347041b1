// The dist_allreduce negotiation: wire format (round trip, malformed input refused) and
// the plan every rank derives from the gathered lists.
#include "tests/status_matchers.h"
#include "tests/unit/negotiation_test_util.h"
#include "worker/node/negotiation.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace hybridps::negotiation {
namespace {

// Serialize + Parse, as the allgather would deliver it.
std::vector<RankList> RoundTrip(const std::vector<RankList>& lists,
                                std::vector<std::string>* wire) {
  wire->clear();
  for (size_t r = 0; r < lists.size(); ++r) {
    wire->emplace_back();
    Serialize(lists[r], static_cast<int>(r), &wire->back());
  }
  std::vector<RankList> out;
  for (size_t r = 0; r < lists.size(); ++r) {
    auto p = Parse((*wire)[r], static_cast<int>(r));
    EXPECT_OK(p);
    out.push_back(p.ok() ? *p : RankList{});
  }
  return out;
}

TEST(NegotiationTest, RoundTripKeepsEveryFieldAndAlignsPayloads) {
  float data[3] = {1, 2, 3};
  RankList l;
  l.leaving = true;
  l.room = 70001;
  Entry e = PushPull("layer1.weight", 3, DType::kFloat32, -7, 4);
  e.age_ms = 1234;
  e.has_payload = true;
  e.payload = absl::string_view(reinterpret_cast<const char*>(data), sizeof data);
  l.entries = {e, Bcast("b", 0, 1)};
  l.entries[1].phase = 1;
  std::string wire;
  Serialize(l, 2, &wire);
  auto p = Parse(wire, 2);
  ASSERT_OK(p);
  EXPECT_TRUE(p->leaving);
  EXPECT_EQ(p->room, 70001u);
  ASSERT_EQ(p->entries.size(), 2u);
  const Entry& q = p->entries[0];
  EXPECT_EQ(q.name, "layer1.weight");
  EXPECT_EQ(q.count, 3u);
  EXPECT_EQ(q.priority, -7);
  EXPECT_EQ(q.occurrence, 4u);
  EXPECT_EQ(q.age_ms, 1234u);
  EXPECT_EQ(q.phase, 0);
  EXPECT_EQ(p->entries[1].phase, 1);
  ASSERT_TRUE(q.has_payload);
  EXPECT_EQ(q.payload, e.payload);
  EXPECT_EQ((q.payload.data() - wire.data()) % 8, 0);
  EXPECT_EQ(p->entries[1].kind, OpKind::kBroadcast);
  EXPECT_EQ(p->entries[1].root, 1);
}

// SerializeTo writes exactly SerializedBytes(list) bytes, the same as Serialize (which
// appends them), for lists with names and payloads of every length modulo 8 and shapes.
TEST(NegotiationTest, SerializingInPlaceWritesExactlyTheMeasuredBytes) {
  const std::string data(64, '\x5a');
  for (size_t name_len : {1, 7, 8, 9, 16}) {
    for (size_t payload : {0, 4, 12, 16, 20}) {
      RankList l;
      l.leaving = payload == 4;
      Entry e = PushPull(std::string(name_len, 'n'), payload / 4 + 1, DType::kFloat32, 3, 9);
      e.has_payload = payload > 0;
      e.payload = absl::string_view(data.data(), payload);
      const int64_t dims[2] = {static_cast<int64_t>(payload / 4 + 1), 1};
      if (name_len % 2 == 1) e.shape = TensorShape::Of(dims, 2);
      l.entries = {e, Bcast("b", 2, 1), e};
      l.entries[2].name += "2";
      std::string appended = "prefix";
      Serialize(l, 1, &appended);
      const size_t bytes = SerializedBytes(l);
      ASSERT_EQ(appended.size(), 6 + bytes) << name_len << " " << payload;
      std::string in_place(bytes + 8, '\x7f');  // the 8 after it must stay as they were
      SerializeTo(l, 1, in_place.data());
      EXPECT_EQ(in_place.substr(0, bytes), appended.substr(6)) << name_len << " " << payload;
      EXPECT_EQ(in_place.substr(bytes), std::string(8, '\x7f')) << name_len << " " << payload;
      auto p = Parse(absl::string_view(in_place).substr(0, bytes), 1);
      ASSERT_OK(p);
      ASSERT_EQ(p->entries.size(), 3u);
      EXPECT_EQ(p->entries[2].name, e.name + "2");
      EXPECT_EQ(p->entries[2].payload, e.has_payload ? e.payload : absl::string_view());
      EXPECT_EQ(p->leaving, l.leaving);
    }
  }
}

TEST(NegotiationTest, MalformedMessagesAreRefusedNotTrusted) {
  RankList l;
  l.entries = {PushPull("w", 10)};
  std::string wire;
  Serialize(l, 0, &wire);
  EXPECT_FALSE(Parse(wire, 1).ok());  // claims another rank
  for (size_t cut = 0; cut < wire.size(); ++cut) {
    EXPECT_FALSE(Parse(wire.substr(0, cut), 0).ok()) << cut;
  }
  std::string trailing = wire + "x";
  EXPECT_FALSE(Parse(trailing, 0).ok());
  std::string bad_dtype = wire;
  bad_dtype[kHeaderBytes + 5] = 99;
  auto s = Parse(bad_dtype, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "dtype")) << s.status();
  std::string many = wire;
  many[12] = '\xff';  // entry count far beyond the message
  EXPECT_FALSE(Parse(many, 0).ok());
  std::string payload = wire;
  payload[kHeaderBytes + 6] = 1;  // claims a payload it does not carry
  EXPECT_FALSE(Parse(payload, 0).ok());
  std::string reserved = wire;
  reserved[kHeaderBytes + 50] = 1;  // a reserved byte after the phase and ndim
  auto r = Parse(reserved, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "reserved")) << r.status();
}

TEST(NegotiationTest, ReadyOnlyWhenEveryRankListedIt) {
  std::vector<RankList> lists(3);
  lists[0].entries = {PushPull("a", 100000), PushPull("b", 100000)};
  lists[1].entries = {PushPull("b", 100000), PushPull("a", 100000)};
  lists[2].entries = {PushPull("a", 100000)};
  Plan p = Decide(lists, 1, 0);
  ASSERT_EQ(p.actions.size(), 1u);
  EXPECT_EQ(p.actions[0].type, Action::Type::kAllreduce);
  EXPECT_EQ(Indices(p.actions[0]), std::vector<size_t>{1});  // rank 1's own index of "a"
  ASSERT_EQ(p.missing.size(), 1u);
  EXPECT_EQ(p.missing[0].entry, 0u);
  EXPECT_EQ(p.missing[0].ranks, std::vector<int>{2});
  EXPECT_TRUE(p.any_entries);
  EXPECT_TRUE(p.pending);
  Plan p2 = Decide(lists, 2, 0);
  ASSERT_EQ(p2.foreign.size(), 1u);
  EXPECT_EQ(p2.foreign[0].name, "b");
  EXPECT_EQ(p2.foreign[0].ranks, (std::vector<int>{0, 1}));
}

TEST(NegotiationTest, OccurrencesKeepOperationsOnOneNameApart) {
  std::vector<RankList> lists(2);
  lists[0].entries = {PushPull("w", 10, DType::kFloat32, 0, 1)};
  lists[1].entries = {PushPull("w", 10, DType::kFloat32, 0, 0)};
  Plan p = Decide(lists, 0, 1 << 20);
  EXPECT_TRUE(p.actions.empty());
  EXPECT_EQ(p.missing.size(), 1u);
}

// The node's GPU reduction lists an operation in phase 1 once its push ended: a rank a
// phase ahead waits for the others, and the shapes of the two phases are not compared.
TEST(NegotiationTest, PhasesKeepStepsOfOneOperationApart) {
  std::vector<RankList> lists(2);
  lists[0].entries = {PushPull("w", 10)};
  lists[0].entries[0].phase = 1;
  lists[1].entries = {PushPull("w", 12)};
  Plan p = Decide(lists, 0, 0);
  EXPECT_TRUE(p.actions.empty());
  ASSERT_EQ(p.missing.size(), 1u);
  EXPECT_EQ(p.missing[0].ranks, std::vector<int>{1});
  lists[1].entries[0].phase = 1;
  lists[1].entries[0].count = 10;
  Plan both = Decide(lists, 1, 0);
  ASSERT_EQ(both.actions.size(), 1u);
  EXPECT_EQ(both.actions[0].type, Action::Type::kAllreduce);
  EXPECT_TRUE(both.missing.empty());
}

Entry Shaped(const std::string& name, std::vector<int64_t> dims) {
  TensorShape shape = TensorShape::Of(dims.data(), dims.size());
  Entry e = PushPull(name, shape.elements());
  e.shape = shape;
  return e;
}

TEST(NegotiationTest, ShapesTravelAndAreCheckedAgainstTheCount) {
  RankList l;
  l.entries = {Shaped("conv", {17, 23, 57}), PushPull("plain", 4)};
  std::string wire;
  Serialize(l, 0, &wire);
  auto p = Parse(wire, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->entries[0].shape.ToString(), "(17, 23, 57)");
  EXPECT_EQ(p->entries[0].Shape(), "(17, 23, 57) float32");
  EXPECT_FALSE(p->entries[1].shape.known());
  EXPECT_EQ(p->entries[1].Shape(), "4 float32 elements");

  l.entries = {Shaped("w", {2, 3})};
  wire.clear();
  Serialize(l, 0, &wire);
  const size_t ndim_at = kHeaderBytes + 49, dims_at = kHeaderBytes + kEntryBytesForTest + 8;
  std::string wrong_count = wire;
  wrong_count[dims_at] = 5;  // (5, 3) for 6 elements
  auto s = Parse(wrong_count, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "shape (5, 3) does not hold 6 elements"))
      << s.status();
  std::string negative = wire;
  negative[dims_at + 7] = '\x80';
  EXPECT_FALSE(Parse(negative, 0).ok());
  std::string many = wire;
  many[ndim_at] = kMaxShapeDims + 1;
  EXPECT_FALSE(Parse(many, 0).ok());
  std::string longer = wire;
  longer[ndim_at] = 3;  // one dimension more than the message holds
  EXPECT_FALSE(Parse(longer, 0).ok());
}

TEST(NegotiationTest, ShapesOfTheSameCountMismatch) {
  std::vector<RankList> lists(3);
  lists[0].entries = {Shaped("w", {17, 1311})};
  lists[1].entries = {Shaped("w", {17, 23, 57})};
  lists[2].entries = {PushPull("w", 17 * 1311)};  // no shape given: agrees with any
  for (int self = 0; self < 3; ++self) {
    Plan p = Decide(lists, self, 0);
    ASSERT_EQ(p.actions.size(), 1u);
    EXPECT_EQ(p.actions[0].type, Action::Type::kFail) << self;
  }
  Plan p = Decide(lists, 1, 0);
  EXPECT_EQ(p.actions[0].error.message(),
            "mismatched push_pull of 'w': ranks 0, 2 sent (17, 1311) float32, rank 1 sent "
            "(17, 23, 57) float32");
  // The ranks that gave a shape are compared with each other, not only with rank 0.
  lists[0].entries = {PushPull("w", 17 * 1311)};
  lists[2].entries = {Shaped("w", {17, 1311})};
  EXPECT_EQ(Decide(lists, 0, 0).actions[0].type, Action::Type::kFail);
  lists[1].entries = {Shaped("w", {17, 1311})};
  lists[2].entries = {Shaped("w", {17, 1311})};
  EXPECT_EQ(Decide(lists, 0, 0).actions[0].type, Action::Type::kAllreduce);
  // More than kMaxShapeDims dimensions fold into the last.
  std::vector<int64_t> nine(9, 2);
  TensorShape folded = TensorShape::Of(nine.data(), nine.size());
  EXPECT_EQ(folded.ndim, kMaxShapeDims);
  EXPECT_EQ(folded.dims[kMaxShapeDims - 1], 4);
  EXPECT_EQ(folded.elements(), 512u);
}

TEST(NegotiationTest, MismatchNamesTensorRanksAndShapesOnEveryRank) {
  std::vector<RankList> lists(3);
  lists[0].entries = {PushPull("w", 10)};
  lists[1].entries = {PushPull("w", 12)};
  lists[2].entries = {PushPull("w", 12)};
  for (int self = 0; self < 3; ++self) {
    Plan p = Decide(lists, self, 0);
    ASSERT_EQ(p.actions.size(), 1u);
    EXPECT_EQ(p.actions[0].type, Action::Type::kFail);
    EXPECT_EQ(p.actions[0].error.code(), absl::StatusCode::kInvalidArgument);
    if (self == 0) {
      EXPECT_EQ(p.actions[0].error.message(),
                "mismatched push_pull of 'w': ranks 1, 2 sent 12 float32 elements, rank 0 "
                "sent 10 float32 elements");
    }
  }
  lists[1].entries = {Bcast("w", 10, 0)};
  lists[2].entries = {PushPull("w", 10, DType::kInt32)};
  Plan p = Decide(lists, 2, 0);
  ASSERT_EQ(p.actions.size(), 1u);
  EXPECT_EQ(p.actions[0].error.message(),
            "mismatched operations on 'w': rank 0 sent a push_pull of 10 float32 elements, "
            "rank 1 sent a broadcast of 10 float32 elements from root 0, rank 2 sent a "
            "push_pull of 10 int32 elements");
  lists = std::vector<RankList>(2);
  lists[0].entries = {Bcast("b", 5, 0)};
  lists[1].entries = {Bcast("b", 5, 1)};
  p = Decide(lists, 1, 0);
  ASSERT_EQ(p.actions.size(), 1u);
  EXPECT_TRUE(absl::StrContains(p.actions[0].error.message(), "from root 0")) << p.actions[0].error;
}

TEST(NegotiationTest, PriorityThenRankZeroOrderAndFusionPerDType) {
  std::vector<RankList> lists(2);
  // Large enough not to be eager (no payloads), small enough to fuse (threshold 1 MiB).
  lists[0].entries = {PushPull("f1", 1000), PushPull("i1", 1000, DType::kInt32),
                      PushPull("f2", 1000), PushPull("hi", 1000, DType::kFloat32, 9),
                      PushPull("huge", 1 << 20), Bcast("bc", 1000, 1)};
  lists[1].entries = lists[0].entries;
  std::reverse(lists[1].entries.begin(), lists[1].entries.end());
  Plan p = Decide(lists, 0, 1 << 20);
  std::vector<std::vector<size_t>> got;
  for (const Action& a : p.actions) got.push_back(Indices(a));
  // "hi" (priority 9) opens the float32 bucket; f1 and f2 join it; i1 gets its own bucket;
  // "huge" exceeds the threshold and runs alone; the broadcast alone.
  EXPECT_EQ(got, (std::vector<std::vector<size_t>>{{3, 0, 2}, {1}, {4}, {5}}));
  EXPECT_EQ(p.actions[0].total_count, 3000u);
  EXPECT_EQ(p.actions[3].type, Action::Type::kBroadcast);
  // Rank 1 computes the same plan in its own indices.
  Plan q = Decide(lists, 1, 1 << 20);
  ASSERT_EQ(q.actions.size(), 4u);
  EXPECT_EQ(Indices(q.actions[0]), (std::vector<size_t>{2, 5, 3}));
  // A full bucket is closed and a new one opened.
  Plan small = Decide(lists, 0, 8000);
  EXPECT_EQ(Indices(small.actions[0]), (std::vector<size_t>{3, 0}));
}

// A round's lists are parsed into the last round's (their memory kept): what the earlier
// message held (a longer name, a shape, a payload, more entries) must not show through.
TEST(NegotiationTest, ParsingIntoAReusedListReadsOnlyTheNewMessage) {
  float data[6] = {1, 2, 3, 4, 5, 6};
  RankList first;
  first.leaving = true;
  Entry shaped = PushPull("a.rather.long.layer.name.weight", 6);
  shaped.shape = TensorShape{2, {2, 3}};
  shaped.has_payload = true;
  shaped.payload = absl::string_view(reinterpret_cast<const char*>(data), sizeof data);
  first.entries = {shaped, Bcast("b", 4, 1)};
  RankList second;
  second.entries = {PushPull("w", 6)};
  std::string w1, w2;
  Serialize(first, 1, &w1);
  Serialize(second, 1, &w2);
  RankList reused;
  ASSERT_OK(ParseInto(w1, 1, &reused));
  ASSERT_EQ(reused.entries[0].shape.ToString(), "(2, 3)");
  ASSERT_OK(ParseInto(w2, 1, &reused));
  ASSERT_OK_AND_ASSIGN(RankList fresh, Parse(w2, 1));
  EXPECT_FALSE(reused.leaving);
  ASSERT_EQ(reused.entries.size(), 1u);
  const Entry& e = reused.entries[0];
  EXPECT_EQ(e.name, "w");
  EXPECT_FALSE(e.shape.known());
  EXPECT_FALSE(e.has_payload);
  EXPECT_TRUE(e.payload.empty());
  EXPECT_EQ(e.Shape(), fresh.entries[0].Shape());
  EXPECT_EQ(e.kind, OpKind::kPushPull);
  EXPECT_EQ(e.root, fresh.entries[0].root);
}

// Rounds of a few entries find their keys by a scan, larger ones through a map: the same
// keys get the same plan either way. Padding a round with keys only one rank listed moves
// it over to the map; the common keys' actions must not change.
TEST(NegotiationTest, SmallAndLargeRoundsDecideTheSameWay) {
  std::vector<RankList> lists(3);
  lists[0].entries = {PushPull("a", 1000), PushPull("b", 1000, DType::kFloat32, 5),
                      PushPull("c", 10), Bcast("d", 100, 2)};
  lists[1].entries = {PushPull("c", 10), PushPull("a", 1000), Bcast("d", 100, 2),
                      PushPull("b", 1000, DType::kFloat32, 5)};
  lists[2].entries = {Bcast("d", 100, 2), PushPull("b", 1000, DType::kFloat32, 5),
                      PushPull("a", 1000), PushPull("c", 12)};  // "c" mismatches
  for (int self = 0; self < 3; ++self) {
    const Plan small = Decide(lists, self, 1 << 20);
    std::vector<RankList> padded = lists;
    for (int i = 0; i < 20; ++i) {
      padded[self].entries.push_back(PushPull(absl::StrCat("only", i), 4));
    }
    const Plan large = Decide(padded, self, 1 << 20);
    ASSERT_EQ(small.actions.size(), large.actions.size());
    for (size_t i = 0; i < small.actions.size(); ++i) {
      EXPECT_EQ(small.actions[i].type, large.actions[i].type) << i;
      EXPECT_EQ(Indices(small.actions[i]), Indices(large.actions[i])) << i;
      EXPECT_EQ(small.actions[i].error, large.actions[i].error) << i;
    }
    EXPECT_TRUE(small.missing.empty());
    EXPECT_EQ(large.missing.size(), 20u);
  }
}

TEST(NegotiationTest, CpuTensorsOverTheMaxTensorSizeRunAloneGpuOnesStillFuse) {
  Entry g1 = PushPull("g1", 1000), g2 = PushPull("g2", 1000);
  g1.gpu = g2.gpu = true;
  std::vector<RankList> lists(2);
  lists[0].entries = {PushPull("a", 1000), PushPull("big", 1001), PushPull("b", 1000), g1, g2};
  lists[1].entries = lists[0].entries;
  // CPU tensors of more than 4000 bytes run alone; GPU ones fuse whatever their size.
  Plan p = Decide(lists, 0, 1 << 20, 4000);
  std::vector<std::vector<size_t>> got;
  for (const Action& a : p.actions) got.push_back(Indices(a));
  EXPECT_EQ(got, (std::vector<std::vector<size_t>>{{0, 2}, {1}, {3, 4}}));
  // Exactly at the limit still fuses.
  Plan at = Decide(lists, 0, 1 << 20, 4004);
  EXPECT_EQ(Indices(at.actions[0]), (std::vector<size_t>{0, 1, 2}));
  // 0: no CPU tensor is fused.
  Plan none = Decide(lists, 0, 1 << 20, 0);
  EXPECT_EQ(none.actions.size(), 4u);
}

// GPU tensors (NCCL) and CPU tensors (Gloo) never share an action: a name on a GPU on one
// rank and on the CPU on another is a mismatch, and buckets are per dtype and device.
TEST(NegotiationTest, DeviceKindIsPartOfTheSignatureAndOfTheFusionBucket) {
  Entry g = PushPull("w", 1000);
  g.gpu = true;
  RankList l;
  l.entries = {g, PushPull("c", 1000)};
  std::vector<std::string> wire;
  std::vector<RankList> back = RoundTrip({l}, &wire);
  ASSERT_EQ(back[0].entries.size(), 2u);
  EXPECT_TRUE(back[0].entries[0].gpu);
  EXPECT_FALSE(back[0].entries[1].gpu);
  std::string bad = wire[0];
  bad[kHeaderBytes + 7] = 2;  // the device byte
  auto s = Parse(bad, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "device")) << s.status();

  std::vector<RankList> lists(2);
  lists[0].entries = {g};
  lists[1].entries = {PushPull("w", 1000)};
  Plan p = Decide(lists, 0, 1 << 20);
  ASSERT_EQ(p.actions.size(), 1u);
  EXPECT_EQ(p.actions[0].type, Action::Type::kFail);
  EXPECT_EQ(p.actions[0].error.message(),
            "mismatched push_pull of 'w': rank 1 sent 1000 float32 elements, rank 0 sent "
            "1000 float32 elements on GPU");

  Entry g2 = PushPull("g2", 1000);
  g2.gpu = true;
  lists[0].entries = {g, PushPull("c1", 1000), g2, PushPull("c2", 1000)};
  lists[1].entries = lists[0].entries;
  p = Decide(lists, 1, 1 << 20);
  std::vector<std::vector<size_t>> got;
  for (const Action& a : p.actions) {
    EXPECT_EQ(a.type, Action::Type::kAllreduce);
    got.push_back(Indices(a));
  }
  EXPECT_EQ(got, (std::vector<std::vector<size_t>>{{0, 2}, {1, 3}}));
}

TEST(NegotiationTest, EagerWhenEveryRankSentItsDataOrTheRootDid) {
  float a[2] = {1, 2}, b[2] = {10, 20};
  std::vector<RankList> lists(2);
  Entry ea = PushPull("x", 2), eb = PushPull("x", 2);
  ea.has_payload = eb.has_payload = true;
  ea.payload = absl::string_view(reinterpret_cast<const char*>(a), sizeof a);
  eb.payload = absl::string_view(reinterpret_cast<const char*>(b), sizeof b);
  Entry r0 = Bcast("y", 2, 1), r1 = Bcast("y", 2, 1);
  r1.has_payload = true;
  r1.payload = eb.payload;
  Entry partial = PushPull("z", 2), partial1 = PushPull("z", 2);
  partial.has_payload = true;
  partial.payload = ea.payload;
  lists[0].entries = {ea, r0, partial};
  lists[1].entries = {eb, r1, partial1};
  std::vector<std::string> wire;
  auto parsed = RoundTrip(lists, &wire);
  Plan p = Decide(parsed, 0, 1 << 20);
  ASSERT_EQ(p.actions.size(), 3u);
  EXPECT_EQ(p.actions[0].type, Action::Type::kEager);
  ASSERT_EQ(p.actions[0].payloads.size(), 2u);
  EXPECT_EQ(p.actions[0].payloads[1], eb.payload);
  EXPECT_EQ(p.actions[1].type, Action::Type::kEager);
  ASSERT_EQ(p.actions[1].payloads.size(), 1u);  // the root's
  EXPECT_EQ(p.actions[1].payloads[0], eb.payload);
  EXPECT_EQ(p.actions[2].type, Action::Type::kAllreduce);  // rank 1 sent no data for z
}

// Rank r's entry in its message to rank `to` in a two-shot: rank `to`'s chunk of `data`.
Entry ChunkFor(const std::string& name, const std::vector<float>& data, int to, int n) {
  Entry e = PushPull(name, data.size());
  const Chunk c = ChunkOf(data.size(), to, n);
  e.has_payload = true;
  e.payload_offset = c.begin;
  e.payload = absl::string_view(reinterpret_cast<const char*>(data.data() + c.begin),
                                (c.end - c.begin) * sizeof(float));
  return e;
}

// Rank r's entry of a two-shot of 2 ranks: the other rank's chunk of `data`.
Entry Half(const std::string& name, const std::vector<float>& data, int r) {
  return ChunkFor(name, data, 1 - r, 2);
}

TEST(NegotiationTest, ChunksSplitEveryElementOnceAndEvenly) {
  for (uint64_t count : {0, 1, 2, 5, 1000001}) {
    for (int n : {1, 2, 3, 7}) {
      uint64_t next = 0;
      for (int r = 0; r < n; ++r) {
        const Chunk c = ChunkOf(count, r, n);
        EXPECT_EQ(c.begin, next) << count << " " << n << " " << r;
        EXPECT_LE(c.end - c.begin, count / n + 1);
        EXPECT_GE(c.end - c.begin, count / n);
        next = c.end;
      }
      EXPECT_EQ(next, count) << count << " " << n;
    }
  }
}

TEST(NegotiationTest, TwoShotWhenBothRanksSentTheOthersChunk) {
  const std::vector<float> a = {1, 2, 3, 4, 5}, b = {10, 20, 30, 40, 50};
  std::vector<RankList> lists(2);
  // "t": a two-shot. "u": rank 1 sent its own chunk instead. "v": rank 0 sent nothing.
  Entry wrong = Half("u", b, 0);
  lists[0].entries = {Half("t", a, 0), Half("u", a, 0), PushPull("v", 5)};
  lists[1].entries = {Half("t", b, 1), wrong, Half("v", b, 1)};
  std::vector<std::string> wire;
  auto parsed = RoundTrip(lists, &wire);
  ASSERT_EQ(parsed[0].entries.size(), 3u);
  EXPECT_EQ(parsed[0].entries[0].payload_offset, 3u);  // rank 1 owns [3, 5)
  EXPECT_FALSE(parsed[0].entries[0].WholePayload());
  for (int self = 0; self < 2; ++self) {
    Plan p = Decide(parsed, self, 0);
    ASSERT_EQ(p.actions.size(), 3u) << self;
    EXPECT_EQ(p.actions[0].type, Action::Type::kTwoShot);
    ASSERT_EQ(p.actions[0].payloads.size(), 2u);
    // What the peer sent is this rank's own chunk of the peer's data.
    const Chunk own = ChunkOf(5, self, 2);
    const std::vector<float>& peer = self == 0 ? b : a;
    EXPECT_EQ(p.actions[0].payloads[1 - self],
              absl::string_view(reinterpret_cast<const char*>(peer.data() + own.begin),
                                (own.end - own.begin) * sizeof(float)));
    EXPECT_EQ(p.actions[1].type, Action::Type::kAllreduce);
    EXPECT_EQ(p.actions[2].type, Action::Type::kAllreduce);
  }
  // With three ranks chunks of two never make a two-shot.
  std::vector<float> c = {7, 8, 9, 10, 11};
  std::vector<RankList> three(3);
  for (int r = 0; r < 3; ++r) three[r].entries = {Half("t", r == 0 ? a : r == 1 ? b : c, r % 2)};
  Plan p3 = Decide(RoundTrip(three, &wire), 0, 0);
  ASSERT_EQ(p3.actions.size(), 1u);
  EXPECT_EQ(p3.actions[0].type, Action::Type::kAllreduce);
}

// With 3 and 4 ranks each peer's message carries the receiving rank's chunk, and a rank's
// own list is its message to the next rank: every rank that received its chunk from every
// peer plans a two-shot, with payloads[r] its own chunk of rank r's data. A rank that sent
// the wrong chunk (its own, to every peer and in its own list), or none, makes it an
// allreduce on every rank.
TEST(NegotiationTest, TwoShotWithMoreRanksWhenEveryPeerSentThisRanksChunk) {
  for (int n : {3, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    std::vector<std::vector<float>> data(n);
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < 11; ++k) data[r].push_back(static_cast<float>(100 * r + k));
    }
    // "t": a two-shot. "u": rank 1 sent every rank its own chunk (rank 1's). "v": the last
    // rank sent nothing.
    for (int self = 0; self < n; ++self) {
      std::vector<RankList> lists(n);
      for (int r = 0; r < n; ++r) {
        const int to = r == self ? (self + 1) % n : self;
        lists[r].entries = {ChunkFor("t", data[r], to, n),
                            ChunkFor("u", data[r], r == 1 ? 1 : to, n),
                            r == n - 1 ? PushPull("v", 11) : ChunkFor("v", data[r], to, n)};
      }
      std::vector<std::string> wire;
      Plan p = Decide(RoundTrip(lists, &wire), self, 0);
      ASSERT_EQ(p.actions.size(), 3u) << "rank " << self;
      EXPECT_EQ(p.actions[0].type, Action::Type::kTwoShot) << "rank " << self;
      ASSERT_EQ(p.actions[0].payloads.size(), static_cast<size_t>(n));
      const Chunk own = ChunkOf(11, self, n);
      for (int r = 0; r < n; ++r) {
        if (r == self) continue;
        std::vector<float> got(own.end - own.begin);
        ASSERT_EQ(p.actions[0].payloads[r].size(), got.size() * sizeof(float));
        std::memcpy(got.data(), p.actions[0].payloads[r].data(), got.size() * sizeof(float));
        EXPECT_EQ(got, std::vector<float>(data[r].begin() + own.begin,
                                          data[r].begin() + own.end))
            << "rank " << self << " from rank " << r;
      }
      EXPECT_EQ(p.actions[1].type, Action::Type::kAllreduce) << "rank " << self;
      EXPECT_EQ(p.actions[2].type, Action::Type::kAllreduce) << "rank " << self;
    }
  }
}

TEST(NegotiationTest, PayloadsOutsideTheTensorAreRefused) {
  const std::vector<float> a = {1, 2, 3, 4};
  for (auto [offset, elements] : std::vector<std::pair<uint64_t, size_t>>{
           {3, 2}, {5, 0}, {2, 0}, {uint64_t{1} << 62, 1}}) {
    RankList l;
    Entry e = PushPull("w", 4);
    e.has_payload = true;
    e.payload_offset = offset;
    e.payload = absl::string_view(reinterpret_cast<const char*>(a.data()),
                                  elements * sizeof(float));
    l.entries = {e};
    std::string wire;
    Serialize(l, 0, &wire);
    auto s = Parse(wire, 0);
    ASSERT_FALSE(s.ok()) << offset << " " << elements;
    EXPECT_TRUE(absl::StrContains(s.status().message(), "payload of")) << s.status();
  }
}

TEST(NegotiationTest, LeavingRanksAndIdleJob) {
  std::vector<RankList> lists(3);
  Plan idle = Decide(lists, 0, 0);
  EXPECT_FALSE(idle.any_entries);
  EXPECT_FALSE(idle.pending);
  EXPECT_TRUE(idle.actions.empty());
  lists[2].leaving = true;
  Plan p = Decide(lists, 0, 0);
  EXPECT_EQ(p.leaving, std::vector<int>{2});
}

}  // namespace
}  // namespace hybridps::negotiation
