// dist_allreduce's eager probe (Options::eager_probe): where it runs, every worker takes
// rank 0's verdict, and push_pulls at the verdict go eagerly while larger ones take the
// allreduce, with exact sums either way. Which verdict the links give is checked on
// emulated hosts (tests/python/test_hybridrun_hosts.py): here every "node" is this host.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/allreduce/allreduce_store.h"
#include "worker/allreduce/eager_probe.h"

namespace hybridps::testing {
namespace {

AllreduceStore* Store(KVStore* kv) {
  auto* s = dynamic_cast<AllreduceStore*>(kv);
  EXPECT_NE(s, nullptr);
  return s;
}

// `workers` workers, each a node of its own; rank 0 probes when `rank0_probe` (the others
// ask for the opposite, and for another eager limit: rank 0's settings rule).
std::unique_ptr<LocalCluster> Start(int workers, int rank0_probe) {
  ClusterConfig c;
  c.backend = "dist_allreduce";
  c.workers = workers;
  c.heartbeat_timeout = absl::Seconds(5);
  c.worker_options = [rank0_probe](int rank, Options* o) {
    o->eager_probe = rank == 0 ? rank0_probe : 1 - rank0_probe;
    o->eager_bytes = rank == 0 ? Options().eager_bytes : 2 << 20;
  };
  auto cl = LocalCluster::Start(c);
  EXPECT_OK(cl);
  return cl.ok() ? std::move(*cl) : nullptr;
}

// `times` push_pulls of `bytes` (float32) on every worker, one after the other; checks
// the sums.
void PushPull(LocalCluster& cluster, const std::string& name, size_t bytes, int times = 1) {
  const int n = cluster.num_workers();
  cluster.RunOnWorkers([&](int rank, KVStore* kv) {
    for (int i = 0; i < times; ++i) {
      Buffer b(DType::kFloat32, bytes / sizeof(float));
      b.Fill(rank, i, 1);
      ASSERT_OK(kv->PushPull(name, b.view(), b.view()));
      for (size_t k = 0; k < b.count; k += 7) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += Value(k, r, i, 1);
        ASSERT_EQ(b.at(k), want) << name << " " << i << " element " << k;
      }
    }
  });
}

TEST(EagerProbeTest, EveryWorkerTakesRankZerosVerdictAndSendsUpToItEagerly) {
  constexpr int kWorkers = 4;
  auto cluster = Start(kWorkers, /*rank0_probe=*/1);
  ASSERT_NE(cluster, nullptr);
  const size_t largest = Options().eager_bytes / (kWorkers - 1) / 4 * 4;
  const size_t limit = Store(cluster->worker(0))->eager_limit();
  EXPECT_GE(limit, EagerProbe::kSmallest);
  EXPECT_LE(limit, largest);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(Store(cluster->worker(w))->eager_limit(), limit) << "worker " << w;
    EXPECT_EQ(Store(cluster->worker(w))->stats().eager_probes, 1u) << "worker " << w;
  }
  std::vector<AllreduceStore::Stats> before;
  for (int w = 0; w < kWorkers; ++w) before.push_back(Store(cluster->worker(w))->stats());
  // At the limit a push_pull goes eagerly when the ranks list it in the same round (not
  // every time: a rank that lists it before the others sends no data the next time);
  // over it, never.
  constexpr int kTimes = 10;
  PushPull(*cluster, "at", limit, kTimes);
  std::vector<AllreduceStore::Stats> at;
  for (int w = 0; w < kWorkers; ++w) at.push_back(Store(cluster->worker(w))->stats());
  PushPull(*cluster, "over", limit + 4, kTimes);
  for (int w = 0; w < kWorkers; ++w) {
    const AllreduceStore::Stats s = Store(cluster->worker(w))->stats();
    EXPECT_GE(at[w].eager - before[w].eager, 1u) << "worker " << w;
    EXPECT_EQ(at[w].eager + at[w].allreduces - before[w].eager - before[w].allreduces,
              static_cast<uint64_t>(kTimes))
        << "worker " << w;
    EXPECT_EQ(s.eager, at[w].eager) << "worker " << w << ": over the limit, eagerly";
    // Directly: as an allreduce or (from the second time) as a direct two-shot.
    EXPECT_EQ(s.allreduces + s.two_shots - at[w].allreduces - at[w].two_shots,
              static_cast<uint64_t>(kTimes))
        << "worker " << w;
  }
}

TEST(EagerProbeTest, WithoutItTheLimitIsEachWorkersOwn) {
  constexpr int kWorkers = 3;
  auto cluster = Start(kWorkers, /*rank0_probe=*/0);
  ASSERT_NE(cluster, nullptr);
  EXPECT_EQ(Store(cluster->worker(0))->eager_limit(), Options().eager_bytes / (kWorkers - 1));
  for (int w = 1; w < kWorkers; ++w) {
    EXPECT_EQ(Store(cluster->worker(w))->eager_limit(), size_t{2 << 20} / (kWorkers - 1))
        << "worker " << w;
  }
  // Each lists a tensor eagerly by its own limit; one goes eagerly only when every rank
  // sent it so: over rank 0's limit never, and the sums are exact either way.
  PushPull(*cluster, "mid", 768 << 10, 3);
  EXPECT_EQ(Store(cluster->worker(0))->stats().eager, 0u);
  EXPECT_EQ(Store(cluster->worker(0))->stats().allreduces, 3u);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(Store(cluster->worker(w))->stats().eager_probes, 0u) << "worker " << w;
  }
}

// Two workers: eager moves the allreduce's bytes in fewer steps, so nothing is probed.
TEST(EagerProbeTest, TwoWorkersDoNotProbe) {
  auto cluster = Start(2, /*rank0_probe=*/1);
  ASSERT_NE(cluster, nullptr);
  EXPECT_EQ(Store(cluster->worker(0))->eager_limit(), Options().eager_bytes);
  EXPECT_EQ(Store(cluster->worker(0))->stats().eager_probes, 0u);
}

}  // namespace
}  // namespace hybridps::testing
