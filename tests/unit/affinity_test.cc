#include "common/affinity.h"

#include <sched.h>

#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

std::vector<Core> Singles(std::vector<int> cpus) {
  std::vector<Core> cores;
  for (int c : cpus) cores.push_back({c});
  return cores;
}

TEST(AffinityTest, EachLocalRankGetsItsShareOfConsecutiveCores) {
  const std::vector<Core> eight = Singles({0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(CpuShare(eight, 0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(CpuShare(eight, 1, 2), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(CpuShare(eight, 2, 3), (std::vector<int>{4, 5}));  // 8 / 3: two each
  EXPECT_EQ(CpuShare(eight, 0, 1), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // A restricted set (a cgroup, a Slurm allocation): the share is of what is allowed.
  const std::vector<Core> odd = Singles({1, 3, 5, 9});
  EXPECT_EQ(CpuShare(odd, 1, 2), (std::vector<int>{5, 9}));
  EXPECT_EQ(CpuShare(odd, 3, 4), (std::vector<int>{9}));
}

TEST(AffinityTest, HardwareThreadsOfOneCoreStayTogether) {
  // 4 cores of 2 threads, the siblings numbered 4 apart (as on many Intel hosts).
  const std::vector<Core> smt = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  EXPECT_EQ(CpuShare(smt, 0, 4), (std::vector<int>{0, 4}));
  EXPECT_EQ(CpuShare(smt, 2, 4), (std::vector<int>{2, 6}));
  EXPECT_EQ(CpuShare(smt, 1, 2), (std::vector<int>{2, 3, 6, 7}));
  // More ranks than cores: one hardware thread each, every core's first before any
  // core's second.
  EXPECT_EQ(CpuShare(smt, 0, 6), (std::vector<int>{0}));
  EXPECT_EQ(CpuShare(smt, 1, 6), (std::vector<int>{1}));
  EXPECT_EQ(CpuShare(smt, 3, 6), (std::vector<int>{3}));
  EXPECT_EQ(CpuShare(smt, 4, 6), (std::vector<int>{4}));
  EXPECT_EQ(CpuShare(smt, 5, 6), (std::vector<int>{5}));
  EXPECT_EQ(CpuShare(smt, 7, 8), (std::vector<int>{7}));
}

TEST(AffinityTest, MoreRanksThanCpusTakeTheCpusInTurn) {
  const std::vector<Core> two = Singles({0, 1});
  EXPECT_EQ(CpuShare(two, 0, 4), (std::vector<int>{0}));
  EXPECT_EQ(CpuShare(two, 1, 4), (std::vector<int>{1}));
  EXPECT_EQ(CpuShare(two, 2, 4), (std::vector<int>{0}));
  EXPECT_EQ(CpuShare(two, 3, 4), (std::vector<int>{1}));
}

TEST(AffinityTest, NothingToShareGivesNothing) {
  EXPECT_TRUE(CpuShare({}, 0, 1).empty());
  EXPECT_TRUE(CpuShare(Singles({0, 1}), 2, 2).empty());
  EXPECT_TRUE(CpuShare(Singles({0, 1}), -1, 2).empty());
  EXPECT_TRUE(CpuShare(Singles({0, 1}), 0, 0).empty());
}

TEST(AffinityTest, CoresOfThisHostCoverEveryAllowedCpuOnce) {
  auto allowed = AllowedCpus();
  ASSERT_OK(allowed);
  std::vector<int> seen;
  for (const Core& c : CoresOf(*allowed)) {
    ASSERT_FALSE(c.empty());
    seen.insert(seen.end(), c.begin(), c.end());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, *allowed);
}

TEST(AffinityTest, CpuListsReadLikeTaskset) {
  EXPECT_EQ(CpuList({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(CpuList({5}), "5");
  EXPECT_EQ(CpuList({0, 2, 3}), "0,2-3");
  EXPECT_EQ(CpuList({}), "");
}

// Binds this test process (its threads, one started before), checks every thread, binds
// again (the same share, not a share of the share), and undoes it.
TEST(AffinityTest, BindingCoversEveryThreadAndIsUndone) {
  auto allowed = AllowedCpus();
  ASSERT_OK(allowed);
  const std::vector<Core> cores = CoresOf(*allowed);
  const int size = cores.size() >= 2 ? 2 : 1;
  const int rank = size - 1;  // the last share: not every CPU when there are 2+ cores
  const std::vector<int> want = CpuShare(cores, rank, size);
  absl::Mutex mu;
  bool bound = false;
  std::vector<int> old_thread_cpus;
  std::thread old_thread([&] {  // exists before the binding, reads its mask after it
    mu.LockWhen(absl::Condition(&bound));
    old_thread_cpus = *AllowedCpus();
    mu.Unlock();
  });
  auto end = absl::MakeCleanup([&] {
    {
      absl::MutexLock lock(&mu);
      bound = true;
    }
    if (old_thread.joinable()) old_thread.join();
    UndoBinding();
  });
  auto share = BindLocalRank(rank, size);
  ASSERT_OK(share);
  EXPECT_EQ(*share, want);
  {
    absl::MutexLock lock(&mu);
    bound = true;
  }
  old_thread.join();
  std::vector<int> new_thread_cpus;
  std::thread([&] { new_thread_cpus = *AllowedCpus(); }).join();
  EXPECT_EQ(old_thread_cpus, want);
  EXPECT_EQ(new_thread_cpus, want);
  auto again = BindLocalRank(rank, size);  // a second store in the same process
  ASSERT_OK(again);
  EXPECT_EQ(*again, want);
  EXPECT_FALSE(BindLocalRank(3, 2).ok());
  UndoBinding();  // the second store failed: the first one's binding stays
  EXPECT_EQ(*AllowedCpus(), want);
  UndoBinding();
  EXPECT_EQ(*AllowedCpus(), *allowed);
}

}  // namespace
}  // namespace hybridps
