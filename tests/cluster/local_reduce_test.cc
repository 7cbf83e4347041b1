// Nodes of several local ranks (dist_hybrid): the local ranks reduce in shared memory and
// only one push per node and partition reaches the servers, with the pushes spread over
// the local ranks. (The conformance suite runs with 1-3 nodes of 2-4 local ranks too.)
#include <dirent.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/partition.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/ps/local/local_reduce.h"
#include "worker/ps/ps_store.h"

namespace hybridps::testing {
namespace {

struct Shape {
  int nodes;
  int local;
  int servers;
  bool threaded = false;  // on the reducer thread (a large tensor) instead of inline
};

class LocalReduceTest : public ::testing::TestWithParam<Shape> {};

std::vector<std::string> HybridpsSegments() {
  std::vector<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) {
      if (absl::StartsWith(e->d_name, "hybridps-")) names.push_back(e->d_name);
    }
    closedir(dir);
  }
  return names;
}

TEST_P(LocalReduceTest, OnePushPerNodeAndPartitionSpreadOverTheLocalRanks) {
  const Shape shape = GetParam();
  ClusterConfig c;
  c.workers = shape.nodes * shape.local;
  c.local_size = shape.local;
  c.servers = shape.servers;
  c.transport = "inproc";
  c.partition_bytes = 4096;
  if (shape.threaded) c.local_inline_bytes = 1024;
  c.heartbeat_timeout = absl::Seconds(5);
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  const std::vector<std::string> segments_at_start = HybridpsSegments();
  const int n = c.workers;
  constexpr int kRounds = 3;
  const size_t count = 12 * 1024 + 5;  // 13 partitions of 4 KiB floats
  const size_t parts =
      PartitionTensor(TensorKey("grad"), count, DType::kFloat32, c.partition_bytes, c.servers)
          .size();
  ASSERT_GE(parts, static_cast<size_t>(2 * shape.local));
  (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
    ASSERT_EQ(kv->local_size(), shape.local);
    ASSERT_EQ(kv->local_rank(), rank % shape.local);
    Buffer in(DType::kFloat32, count), out(DType::kFloat32, count);
    for (int round = 0; round < kRounds; ++round) {
      in.Fill(rank, round, 7);
      absl::Status st = kv->PushPull("grad", in.view(), out.view());
      ASSERT_OK(st);
      for (size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += Value(i, r, round, 7);
        ASSERT_EQ(out.at(i), want) << "element " << i << " round " << round;
      }
    }
    // Broadcast from a root in the middle of the last node goes through the node too.
    const int root = n - 1 - (shape.local > 1 ? 1 : 0);
    in.Fill(rank, 9, 8);
    absl::Status st = kv->Broadcast("weights", in.view(), root);
    ASSERT_OK(st);
    for (size_t i = 0; i < count; i += 3) ASSERT_EQ(in.at(i), Value(i, root, 9, 8)) << i;
  });
  const size_t bparts =
      PartitionTensor(TensorKey("weights"), count, DType::kFloat32, c.partition_bytes,
                      c.servers).size();
  // Workers: per node, the local ranks together pushed every partition exactly once.
  for (int node = 0; node < shape.nodes; ++node) {
    uint64_t node_pushes = 0;
    std::vector<uint64_t> per_rank;
    for (int lr = 0; lr < shape.local; ++lr) {
      auto* ps = PsOf((*cluster)->worker(node * shape.local + lr));
      ASSERT_NE(ps, nullptr);
      EXPECT_EQ(ps->layout().node, node);
      EXPECT_EQ(ps->layout().num_nodes, shape.nodes);
      auto v = ps->PushesPerServer();
      per_rank.push_back(std::accumulate(v.begin(), v.end(), uint64_t{0}));
      node_pushes += per_rank.back();
    }
    EXPECT_EQ(node_pushes, kRounds * parts + bparts) << "node " << node;
    // Spread: every local rank pushes its share of the partitions.
    EXPECT_GE(*std::min_element(per_rank.begin(), per_rank.end()), kRounds * (parts / shape.local))
        << "node " << node;
  }
  // Servers: exactly one request per node and partition arrived.
  uint64_t seen = 0;
  for (int s = 0; s < c.servers; ++s) seen += (*cluster)->server(s)->stats().data_requests.load();
  EXPECT_EQ(seen, static_cast<uint64_t>(shape.nodes) * (kRounds * parts + bparts));
  // The job's control segment and doorbells were unlinked as soon as every local rank had
  // them mapped or open (its tensor segments are created later).
  const std::string job = absl::StrFormat(
      "%016x", PsOf((*cluster)->worker(0))->layout().job_id);
  for (const std::string& name : segments_at_start) {
    EXPECT_FALSE(absl::StrContains(name, job)) << name << " left in /dev/shm";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LocalReduceTest,
                         ::testing::Values(Shape{1, 2, 1}, Shape{2, 2, 2}, Shape{3, 2, 2},
                                           Shape{2, 3, 1}, Shape{1, 4, 2},
                                           Shape{1, 2, 1, true}, Shape{2, 3, 2, true}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("n", info.param.nodes, "_l", info.param.local,
                                               "_s", info.param.servers,
                                               info.param.threaded ? "_threaded" : "");
                         });

// A node whose ranks say different things is refused with the node's ranks named.
TEST(NodeLayoutTest, IncompleteOrInconsistentNodesAreNamed) {
  wire::Welcome w;
  w.set_num_workers(3);
  w.set_num_nodes(2);
  auto add = [&](int node, int lr, int ls) {
    auto* n = w.add_workers();
    n->set_rank(w.workers_size() - 1);
    n->set_node(node);
    n->set_local_rank(lr);
    n->set_local_size(ls);
    n->set_host("h");
  };
  add(0, 0, 2);
  add(0, 0, 2);  // the same local rank twice
  add(1, 0, 1);
  auto bad = NodeLayoutFromWelcome(w, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "worker 1 on h local rank 0 of 2"))
      << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "HYBRIDPS_LOCAL_RANK"));
  auto single = NodeLayoutFromWelcome(w, 2);
  ASSERT_OK(single);
  EXPECT_EQ(single->node, 1);
  EXPECT_EQ(single->local_size, 1);
  w.mutable_workers(1)->set_local_rank(1);
  auto good = NodeLayoutFromWelcome(w, 1);
  ASSERT_OK(good);
  EXPECT_EQ(good->members, (std::vector<int>{0, 1}));
  EXPECT_EQ(good->node_of, (std::vector<int>{0, 0, 1}));
  w.mutable_workers(1)->set_local_size(3);  // disagrees on the node's size
  EXPECT_FALSE(NodeLayoutFromWelcome(w, 0).ok());
}

// A local rank that stops taking part fails its node peers at the deadline, naming it.
TEST(LocalReduceFaultTest, MissingLocalRankFailsItsPeersAtTheDeadlineNamingIt) {
  ClusterConfig c;
  c.workers = 3;
  c.local_size = 3;
  c.servers = 1;
  c.op_timeout = absl::Milliseconds(1500);
  auto cluster = LocalCluster::Start(c);
  ASSERT_OK(cluster);
  std::vector<absl::Status> status(3);
  std::vector<absl::Duration> took(3);
  (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == 2) return;
    Buffer b(DType::kFloat32, 4000);
    const absl::Time start = absl::Now();
    status[rank] = kv->PushPull("lonely", b.view(), b.view());
    took[rank] = absl::Now() - start;
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_FALSE(status[rank].ok());
    EXPECT_EQ(status[rank].code(), absl::StatusCode::kDeadlineExceeded) << status[rank];
    EXPECT_TRUE(absl::StrContains(status[rank].message(), "'lonely'")) << status[rank];
    EXPECT_TRUE(absl::StrContains(status[rank].message(), "2 (worker 2)")) << status[rank];
    EXPECT_GE(took[rank], absl::Milliseconds(1400));
    EXPECT_LT(took[rank], absl::Milliseconds(4000));
  }
}

}  // namespace
}  // namespace hybridps::testing
