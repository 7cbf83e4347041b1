#include "common/affinity.h"

#include <sched.h>

#include <thread>

#include "absl/synchronization/mutex.h"

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

TEST(AffinityTest, EachLocalRankGetsItsShareOfConsecutiveCpus) {
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(CpuShare(eight, 0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(CpuShare(eight, 1, 2), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(CpuShare(eight, 2, 3), (std::vector<int>{4, 5}));  // 8 / 3: two each
  EXPECT_EQ(CpuShare(eight, 0, 1), eight);
  // A restricted set (a cgroup, a Slurm allocation): the share is of what is allowed.
  const std::vector<int> odd = {1, 3, 5, 9};
  EXPECT_EQ(CpuShare(odd, 1, 2), (std::vector<int>{5, 9}));
  EXPECT_EQ(CpuShare(odd, 3, 4), (std::vector<int>{9}));
}

TEST(AffinityTest, MoreRanksThanCpusTakeTheCpusInTurn) {
  const std::vector<int> two = {0, 1};
  EXPECT_EQ(CpuShare(two, 0, 4), (std::vector<int>{0}));
  EXPECT_EQ(CpuShare(two, 1, 4), (std::vector<int>{1}));
  EXPECT_EQ(CpuShare(two, 2, 4), (std::vector<int>{0}));
  EXPECT_EQ(CpuShare(two, 3, 4), (std::vector<int>{1}));
}

TEST(AffinityTest, NothingToShareGivesNothing) {
  EXPECT_TRUE(CpuShare({}, 0, 1).empty());
  EXPECT_TRUE(CpuShare({0, 1}, 2, 2).empty());
  EXPECT_TRUE(CpuShare({0, 1}, -1, 2).empty());
  EXPECT_TRUE(CpuShare({0, 1}, 0, 0).empty());
}

TEST(AffinityTest, CpuListsReadLikeTaskset) {
  EXPECT_EQ(CpuList({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(CpuList({5}), "5");
  EXPECT_EQ(CpuList({0, 2, 3}), "0,2-3");
  EXPECT_EQ(CpuList({}), "");
}

// Binds this test process (its own threads, and one started before), then restores the
// mask: every thread, old and new, runs on the share only.
TEST(AffinityTest, BindingCoversThreadsThatExistAndThoseStartedLater) {
  auto allowed = AllowedCpus();
  ASSERT_OK(allowed);
  ASSERT_FALSE(allowed->empty());
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  const int size = static_cast<int>(allowed->size()) >= 2 ? 2 : 1;
  const int rank = size - 1;  // the last share: not the whole set when there are 2+ CPUs
  // A thread that exists before the binding, and reads its own mask after it.
  absl::Mutex mu;
  bool bound = false;
  std::vector<int> old_thread_cpus;
  std::thread old_thread([&] {
    mu.LockWhen(absl::Condition(&bound));
    old_thread_cpus = *AllowedCpus();
    mu.Unlock();
  });
  auto share = BindLocalRank(rank, size);
  ASSERT_OK(share);
  EXPECT_EQ(*share, CpuShare(*allowed, rank, size));
  {
    absl::MutexLock lock(&mu);
    bound = true;
  }
  old_thread.join();
  std::vector<int> new_thread_cpus;
  std::thread([&] { new_thread_cpus = *AllowedCpus(); }).join();
  EXPECT_EQ(*AllowedCpus(), *share);
  EXPECT_EQ(old_thread_cpus, *share);
  EXPECT_EQ(new_thread_cpus, *share);
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  EXPECT_FALSE(BindLocalRank(3, 2).ok());
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
}

}  // namespace
}  // namespace hybridps
