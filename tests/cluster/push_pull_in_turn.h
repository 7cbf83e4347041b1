// Test helpers for the stores' cluster tests: push_pulls one after the other, each waited
// for and its sum checked; an operation followed by polling instead of a wait.
#ifndef HYBRIDPS_TESTS_CLUSTER_PUSH_PULL_IN_TURN_H_
#define HYBRIDPS_TESTS_CLUSTER_PUSH_PULL_IN_TURN_H_

#include <gtest/gtest.h>

#include <cstddef>

#include "absl/time/clock.h"
#include "common/dtype.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/handle.h"

namespace hybridps::testing {

// `ops` push_pulls of "w" on every worker, each waited for: float32 tensors of `count`
// and 100 elements in turn (with dist_allreduce, both the eager and the ring path run).
inline void PushPullInTurn(LocalCluster& cluster, int ops, size_t count) {
  const int n = cluster.num_workers();
  cluster.RunOnWorkers([&](int rank, KVStore* kv) {
    for (int i = 0; i < ops; ++i) {
      Buffer b(DType::kFloat32, i % 2 == 0 ? count : 100);
      b.Fill(rank, i, 2);
      ASSERT_OK(kv->PushPull("w", b.view(), b.view()));
      for (size_t k = 0; k < b.count; k += 7) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += Value(k, r, i, 2);
        ASSERT_EQ(b.at(k), want) << "op " << i << " element " << k;
      }
    }
  });
}

// Polls h.Done() (no Wait: the poll is how the test follows the operation) until it is
// true or `deadline` has passed; whether it is done.
inline bool PollUntilDone(const Handle& h, absl::Time deadline) {
  while (!h.Done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_PUSH_PULL_IN_TURN_H_
