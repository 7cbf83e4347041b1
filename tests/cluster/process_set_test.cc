// Process sets (worker/process_set.h) made from every multi-worker layout's store: each
// set reduces over its members only, its broadcasts come from its own ranks, the job's
// store goes on beside it, and workers that disagree on a set's ranks all fail, naming
// the difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/cluster/conformance.h"
#include "worker/process_set.h"

namespace hybridps::testing {
namespace {

// The options worker `rank` of the job runs with (LocalCluster's, for that rank).
Options WorkerOptions(const LocalCluster& cluster, const Param& p, int rank) {
  Options o = cluster.options();
  o.role = Role::kWorker;
  o.rank = rank;
  o.local_size = p.local;
  o.local_rank = rank % p.local;
  o.node_id = absl::StrCat("node", rank / p.local);
  return o;
}

TEST_P(MultiWorkerTest, ProcessSetsReduceOverTheirMembersOnly) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  // Two sets that split the job: the even ranks and the odd ones.
  std::vector<int> even, odd;
  for (int r = 0; r < n(); ++r) (r % 2 == 0 ? even : odd).push_back(r);
  std::vector<absl::Status> status(n());
  std::vector<std::vector<double>> sums(n()), broadcasts(n()), job_sums(n());
  std::vector<int> set_ranks(n(), -1), set_sizes(n(), -1);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    const Options o = WorkerOptions(*cluster->cluster, GetParam(), rank);
    auto evens = CreateProcessSet(*kv, o, even, 1);
    auto odds = CreateProcessSet(*kv, o, odd, 2);
    if (!evens.ok() || !odds.ok()) {
      status[rank] = evens.ok() ? odds.status() : evens.status();
      return;
    }
    // Non-members get no store.
    EXPECT_EQ(*evens == nullptr, rank % 2 == 1) << rank;
    EXPECT_EQ(*odds == nullptr, rank % 2 == 0) << rank;
    KVStore* set = rank % 2 == 0 ? evens->get() : odds->get();
    set_ranks[rank] = set->rank();
    set_sizes[rank] = set->num_workers();
    Buffer b(DType::kFloat32, 1000);
    b.Fill(rank, 0, 7);
    status[rank] = set->PushPull("x", b.view(), b.view());
    if (!status[rank].ok()) return;
    for (size_t i = 0; i < b.count; i += 111) sums[rank].push_back(b.at(i));
    // A broadcast from the set's last member (its rank within the set).
    Buffer c(DType::kFloat32, 100);
    c.Fill(rank, 1, 7);
    status[rank] = set->Broadcast("b", c.view(), set->num_workers() - 1);
    if (!status[rank].ok()) return;
    for (size_t i = 0; i < c.count; i += 11) broadcasts[rank].push_back(c.at(i));
    // The job's store, beside the sets.
    Buffer j(DType::kFloat32, 500);
    j.Fill(rank, 2, 7);
    status[rank] = kv->PushPull("job", j.view(), j.view());
    for (size_t i = 0; i < j.count; i += 50) job_sums[rank].push_back(j.at(i));
    // Leaving: every member shuts its set down (the lowest one's scheduler ends after).
    status[rank].Update((rank % 2 == 0 ? *evens : *odds)->Shutdown());
  });
  for (int rank = 0; rank < n(); ++rank) {
    ASSERT_OK(status[rank]) << "worker " << rank;
    const std::vector<int>& members = rank % 2 == 0 ? even : odd;
    const int index = static_cast<int>(
        std::find(members.begin(), members.end(), rank) - members.begin());
    EXPECT_EQ(set_ranks[rank], index);
    EXPECT_EQ(set_sizes[rank], static_cast<int>(members.size()));
    for (size_t k = 0; k < sums[rank].size(); ++k) {
      double want = 0;
      for (int q : members) want += Value(k * 111, q, 0, 7);
      ASSERT_EQ(sums[rank][k], want) << "worker " << rank << " element " << k * 111;
    }
    for (size_t k = 0; k < broadcasts[rank].size(); ++k) {
      ASSERT_EQ(broadcasts[rank][k], Value(k * 11, members.back(), 1, 7)) << rank;
    }
    for (size_t k = 0; k < job_sums[rank].size(); ++k) {
      ASSERT_EQ(job_sums[rank][k], Sum(k * 50, n(), 2, 7)) << rank;
    }
  }
}

TEST_P(MultiWorkerTest, ProcessSetRanksThatDisagreeFailEveryWorkerNamingThem) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::Status> disagree(n()), outside(n()), after(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    const Options o = WorkerOptions(*cluster->cluster, GetParam(), rank);
    // The last worker leaves rank 0 out.
    std::vector<int> ranks = {0, 1};
    if (rank == n() - 1) ranks = {1};
    disagree[rank] = CreateProcessSet(*kv, o, ranks, 1).status();
    outside[rank] = CreateProcessSet(*kv, o, {0, n()}, 2).status();
    // The job goes on, and a set of the same id works afterwards.
    auto set = CreateProcessSet(*kv, o, {0, 1}, 1);
    after[rank] = set.status();
    if (set.ok() && *set) {
      Buffer b(DType::kInt32, 64);
      b.Fill(rank, 0, 9);
      after[rank] = (*set)->PushPull("after", b.view(), b.view());
      for (size_t i = 0; after[rank].ok() && i < b.count; ++i) {
        if (b.at(i) != Value(i, 0, 0, 9) + Value(i, 1, 0, 9)) {
          after[rank] = absl::InternalError(absl::StrCat("element ", i, " is ", b.at(i)));
        }
      }
    }
  });
  for (int rank = 0; rank < n(); ++rank) {
    const absl::Status& s = disagree[rank];
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "worker " << rank << ": " << s;
    EXPECT_TRUE(Mentions(s.message(), "process set 1")) << s;
    EXPECT_TRUE(Mentions(s.message(), "worker 0 gave [0, 1]")) << s;
    EXPECT_TRUE(Mentions(s.message(), absl::StrCat("worker ", n() - 1, " gave [1]"))) << s;
    const absl::Status& t = outside[rank];
    ASSERT_EQ(t.code(), absl::StatusCode::kInvalidArgument) << "worker " << rank << ": " << t;
    EXPECT_TRUE(Mentions(t.message(), absl::StrCat("rank ", n(), " is not a worker of this "
                                                   "job of ", n())))
        << t;
    EXPECT_OK(after[rank]) << "worker " << rank;
  }
}

}  // namespace
}  // namespace hybridps::testing
