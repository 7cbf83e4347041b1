// Helpers of the dist_allreduce cluster tests (allreduce_test.cc,
// allreduce_two_shot_test.cc).
#ifndef HYBRIDPS_TESTS_CLUSTER_ALLREDUCE_CLUSTER_H_
#define HYBRIDPS_TESTS_CLUSTER_ALLREDUCE_CLUSTER_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "tests/cluster/local_cluster.h"
#include "tests/status_matchers.h"
#include "worker/allreduce/allreduce_store.h"

namespace hybridps::testing {

// `tweak`, when given, changes the configuration further.
inline std::unique_ptr<LocalCluster> StartAllreduce(
    int workers, size_t fusion_bytes = 64 << 20, int caller_rounds = 1,
    const std::function<void(ClusterConfig*)>& tweak = nullptr) {
  ClusterConfig c;
  c.backend = "dist_allreduce";
  c.workers = workers;
  c.fusion_bytes = fusion_bytes;
  c.caller_rounds = caller_rounds;
  c.heartbeat_timeout = absl::Seconds(5);
  if (tweak) tweak(&c);
  auto cl = LocalCluster::Start(c);
  EXPECT_OK(cl);
  return cl.ok() ? std::move(*cl) : nullptr;
}

inline AllreduceStore::Stats StatsOf(KVStore* kv) {
  auto* s = dynamic_cast<AllreduceStore*>(kv);
  EXPECT_NE(s, nullptr);
  return s ? s->stats() : AllreduceStore::Stats{};
}

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_ALLREDUCE_CLUSTER_H_
