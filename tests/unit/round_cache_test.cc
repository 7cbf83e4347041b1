// The negotiation's steady state (RoundCache): repeated messages are not parsed again and
// a repeated round reuses its plan, which must always be the plan a full parse and
// decision give.
#include "tests/status_matchers.h"
#include "tests/unit/negotiation_test_util.h"
#include "worker/node/negotiation.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace hybridps::negotiation {
namespace {

// Whether two plans are the same: actions (types, entries, payload views, errors), and what
// is missing, foreign or leaving.
void ExpectSamePlan(const Plan& got, const Plan& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.actions.size(), want.actions.size());
  for (size_t i = 0; i < want.actions.size(); ++i) {
    const Action& g = got.actions[i];
    const Action& w = want.actions[i];
    EXPECT_EQ(g.type, w.type) << "action " << i;
    EXPECT_EQ(Indices(g), Indices(w)) << "action " << i;
    EXPECT_EQ(g.dtype, w.dtype) << "action " << i;
    EXPECT_EQ(g.total_count, w.total_count) << "action " << i;
    ASSERT_EQ(g.payloads.size(), w.payloads.size()) << "action " << i;
    for (size_t r = 0; r < w.payloads.size(); ++r) {
      // The same view: the same bytes of the same message.
      EXPECT_EQ(static_cast<const void*>(g.payloads[r].data()),
                static_cast<const void*>(w.payloads[r].data()))
          << "action " << i << " payload " << r;
      EXPECT_EQ(g.payloads[r].size(), w.payloads[r].size()) << "action " << i;
    }
    EXPECT_EQ(g.error, w.error) << "action " << i;
  }
  ASSERT_EQ(got.missing.size(), want.missing.size());
  for (size_t i = 0; i < want.missing.size(); ++i) {
    EXPECT_EQ(got.missing[i].entry, want.missing[i].entry);
    EXPECT_EQ(got.missing[i].ranks, want.missing[i].ranks);
  }
  ASSERT_EQ(got.foreign.size(), want.foreign.size());
  for (size_t i = 0; i < want.foreign.size(); ++i) {
    EXPECT_EQ(got.foreign[i].name, want.foreign[i].name);
    EXPECT_EQ(got.foreign[i].ranks, want.foreign[i].ranks);
    EXPECT_EQ(got.foreign[i].max_age_ms, want.foreign[i].max_age_ms);
  }
  EXPECT_EQ(got.leaving, want.leaving);
  EXPECT_EQ(got.pending, want.pending);
  EXPECT_EQ(got.any_entries, want.any_entries);
}

// A job of `n` ranks whose rounds go through one RoundCache per rank, beside the plain
// parse and decide of the same messages (the reference).
class CachedRounds {
 public:
  explicit CachedRounds(int n)
      : n_(n), caches_(n), kept_(n, std::vector<RankList>(n)), plans_(n) {}
  // One round: `lists` (indexed by rank) serialized into fresh buffers; every rank's plan
  // from its cache must be the reference's.
  void Round(const std::vector<RankList>& lists, const std::string& what) {
    wire_.emplace_back();  // earlier rounds' buffers stay alive and distinct
    std::vector<std::string>& wire = wire_.back();
    wire.resize(n_);
    for (int r = 0; r < n_; ++r) Serialize(lists[r], r, &wire[r]);
    std::vector<RankList> fresh(n_);
    for (int r = 0; r < n_; ++r) ASSERT_OK(ParseInto(wire[r], r, &fresh[r])) << what;
    for (int self = 0; self < n_; ++self) {
      for (int r = 0; r < n_; ++r) {
        ASSERT_OK(caches_[self].Parse(wire[r], r, &kept_[self][r])) << what;
      }
      const Plan& got = caches_[self].Decide(kept_[self], self, 1 << 20);
      ExpectSamePlan(got, Decide(fresh, self, 1 << 20), absl::StrCat(what, ", rank ", self));
      plans_[self] = got;
    }
  }
  const RoundCache& cache(int self) const { return caches_[self]; }
  // Rank `self`'s plan of the last round.
  const Plan& plan(int self) const { return plans_[self]; }
  std::vector<RankList>& kept(int self) { return kept_[self]; }

 private:
  int n_;
  std::vector<RoundCache> caches_;
  std::vector<std::vector<RankList>> kept_;  // each rank's lists, kept from round to round
  std::vector<Plan> plans_;
  std::deque<std::vector<std::string>> wire_;
};

// Lists of a steady state: an eager push_pull, a larger one that is fused, and an eager
// broadcast from rank 1, at occurrence `k`, with payloads that differ from round to round.
std::vector<RankList> Steady(int n, uint32_t k, std::vector<std::vector<float>>* data) {
  data->assign(n, std::vector<float>());
  std::vector<RankList> lists(n);
  for (int r = 0; r < n; ++r) {
    (*data)[r] = {float(k), float(r), float(k * 10 + r)};
    Entry a = PushPull("a", 3, DType::kFloat32, 0, k);
    a.has_payload = true;
    a.payload = absl::string_view(reinterpret_cast<const char*>((*data)[r].data()), 12);
    a.age_ms = k + r;
    Entry b = PushPull("b.weight", 1000, DType::kFloat32, 1, k);
    b.shape = TensorShape{2, {10, 100}};
    Entry c = Bcast("c", 3, 1);
    c.occurrence = k;
    if (r == 1) {
      c.has_payload = true;
      c.payload = a.payload;
    }
    lists[r].entries = {a, b, c};
  }
  return lists;
}

TEST(RoundCacheTest, RepeatedRoundsSkipParsingAndReuseThePlanWithTheirOwnPayloads) {
  for (int n : {2, 3}) {
    CachedRounds job(n);
    std::vector<std::vector<float>> data;
    job.Round(Steady(n, 0, &data), "first round");
    EXPECT_EQ(job.cache(0).parses_skipped(), 0u);
    EXPECT_EQ(job.cache(0).plans_reused(), 0u);
    for (uint32_t k = 1; k <= 3; ++k) {
      job.Round(Steady(n, k, &data), absl::StrCat("round ", k));
      for (int self = 0; self < n; ++self) {
        EXPECT_EQ(job.cache(self).parses_skipped(), k * n);
        EXPECT_EQ(job.cache(self).plans_reused(), k);
        // The lists kept hold this round's changing fields.
        const RankList& l1 = job.kept(self)[1];
        EXPECT_EQ(l1.entries[0].occurrence, k);
        EXPECT_EQ(l1.entries[0].age_ms, k + 1);
        float got[3];
        std::memcpy(got, l1.entries[0].payload.data(), sizeof got);
        EXPECT_EQ(got[2], float(k * 10 + 1));
      }
    }
  }
}

// A round that differs from the last in anything but occurrences, ages and payload bytes
// is parsed and decided in full: a rank that changes its tensor gets the mismatch, by name.
TEST(RoundCacheTest, AnyOtherChangeIsParsedAndDecidedInFull) {
  const std::vector<std::pair<std::string, std::function<void(std::vector<RankList>&)>>>
      changes = {
          {"count",
           [](auto& l) {
             l[1].entries[1].count = 999;
             l[1].entries[1].shape = TensorShape();
           }},
          {"dtype", [](auto& l) { l[1].entries[1].dtype = DType::kFloat64; }},
          {"shape", [](auto& l) { l[1].entries[1].shape = TensorShape{2, {100, 10}}; }},
          {"name", [](auto& l) { l[1].entries[1].name = "b.bias"; }},
          {"kind", [](auto& l) { l[1].entries[0].kind = OpKind::kBroadcast; }},
          {"priority", [](auto& l) { l[0].entries[1].priority = 5; }},
          {"root", [](auto& l) { l[0].entries[2].root = 0; }},
          {"no payload", [](auto& l) { l[1].entries[0].has_payload = false; }},
          {"payload size",
           [](auto& l) { l[1].entries[0].payload = l[1].entries[0].payload.substr(0, 8); }},
          {"order", [](auto& l) { std::swap(l[1].entries[0], l[1].entries[1]); }},
          {"one more", [](auto& l) { l[0].entries.push_back(PushPull("d", 2)); }},
          {"one less", [](auto& l) { l[1].entries.pop_back(); }},
          {"leaving", [](auto& l) { l[1].leaving = true; }},
          {"room", [](auto& l) { l[0].room = 8192; }},
          {"occurrence of one rank", [](auto& l) { l[1].entries[1].occurrence += 1; }},
      };
  for (const auto& [what, change] : changes) {
    CachedRounds job(2);
    std::vector<std::vector<float>> data;
    job.Round(Steady(2, 0, &data), "first round");
    job.Round(Steady(2, 1, &data), "steady round");
    ASSERT_EQ(job.cache(0).plans_reused(), 1u);
    std::vector<RankList> lists = Steady(2, 2, &data);
    change(lists);
    job.Round(lists, what);
    EXPECT_EQ(job.cache(0).plans_reused(), 1u) << what;
    EXPECT_EQ(job.cache(1).plans_reused(), 1u) << what;
    // And the round after the change, repeated, is decided from the changed lists.
    lists = Steady(2, 3, &data);
    change(lists);
    job.Round(lists, absl::StrCat(what, ", repeated"));
  }
}

TEST(RoundCacheTest, AMismatchIsNamedEveryTimeNeverReused) {
  CachedRounds job(2);
  std::vector<std::vector<float>> data;
  for (uint32_t k = 0; k < 3; ++k) {
    std::vector<RankList> lists = Steady(2, k, &data);
    lists[1].entries[1].shape = TensorShape{2, {100, 10}};
    job.Round(lists, absl::StrCat("round ", k));
    const Plan& p = job.plan(0);
    bool named = false;
    for (const Action& a : p.actions) {
      named = named || (a.type == Action::Type::kFail &&
                        absl::StrContains(a.error.message(), "mismatched push_pull of 'b.weight'"));
    }
    EXPECT_TRUE(named) << "round " << k;
  }
  EXPECT_EQ(job.cache(0).plans_reused(), 0u);
}

// A plan that left work waiting (a rank has not submitted an operation yet) is decided again
// every round: the rank that was missing may have submitted it meanwhile.
TEST(RoundCacheTest, APlanThatLeftWorkIsNeverReused) {
  CachedRounds job(2);
  std::vector<std::vector<float>> data;
  for (uint32_t k = 0; k < 3; ++k) {
    std::vector<RankList> lists = Steady(2, 0, &data);
    lists[1].entries.pop_back();  // rank 1 has not submitted the broadcast
    job.Round(lists, absl::StrCat("round ", k));
  }
  EXPECT_EQ(job.cache(0).plans_reused(), 0u);
  EXPECT_EQ(job.cache(0).parses_skipped(), 4u);  // the messages repeat, the plan is redone
}

// Two entries of one name in a list (only a malformed or hostile peer sends them) make
// the key structure depend on the occurrences: such a plan is never reused.
TEST(RoundCacheTest, DuplicateNamesAreNeverReused) {
  CachedRounds job(2);
  for (uint32_t k = 0; k < 3; ++k) {
    std::vector<RankList> lists(2);
    for (auto& l : lists) {
      l.entries = {PushPull("w", 4, DType::kFloat32, 0, 2 * k),
                   PushPull("w", 4, DType::kFloat32, 0, 2 * k + 1)};
    }
    job.Round(lists, absl::StrCat("round ", k));
  }
  EXPECT_EQ(job.cache(0).plans_reused(), 0u);
}

// A message that repeats the last one but for a fixed byte is parsed again, and refused
// when malformed, as a first message would be.
TEST(RoundCacheTest, MalformedMessagesAfterRepeatedOnesAreRefused) {
  std::vector<std::vector<float>> data;
  const std::vector<RankList> lists = Steady(2, 0, &data);
  std::string wire;
  Serialize(lists[1], 1, &wire);
  RoundCache cache;
  RankList kept;
  ASSERT_OK(cache.Parse(wire, 1, &kept));
  ASSERT_OK(cache.Parse(wire, 1, &kept));
  ASSERT_EQ(cache.parses_skipped(), 1u);
  const size_t name_pad = kHeaderBytes + kEntryBytesForTest + 1;  // after "a"
  const size_t payload_pad = name_pad + 7 + 12;  // after its 12 bytes of payload
  for (size_t at : {size_t{0}, size_t{kHeaderBytes + 6}, name_pad, payload_pad}) {
    std::string bad = wire;
    bad[at] = '\x7f';
    EXPECT_FALSE(cache.Parse(bad, 1, &kept).ok()) << "byte " << at;
    // And the next good message is parsed in full (the layout was forgotten).
    const uint64_t skipped = cache.parses_skipped();
    ASSERT_OK(cache.Parse(wire, 1, &kept));
    EXPECT_EQ(cache.parses_skipped(), skipped) << "byte " << at;
  }
}

}  // namespace
}  // namespace hybridps::negotiation
