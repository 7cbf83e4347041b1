// Where a worker sits among the job's nodes, from the scheduler's Welcome: both stores
// need it (dist_hybrid to reduce a node's local ranks before the push, dist_allreduce to
// choose shared memory, Gloo or both), so it lives below them.
#ifndef HYBRIDPS_WORKER_NODE_NODE_LAYOUT_H_
#define HYBRIDPS_WORKER_NODE_NODE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hybridps.pb.h"

namespace hybridps {

// Where a worker sits: its node and the node's ranks, from the scheduler's Welcome.
struct NodeLayout {
  int node = 0;  // this worker's node (0 .. num_nodes-1)
  int num_nodes = 1;
  int local_rank = 0;
  int local_size = 1;
  std::vector<int> node_of;   // by worker rank
  std::vector<int> members;   // worker ranks of this node, by local rank
  std::vector<uint32_t> pids;  // of the members, by local rank
  uint64_t job_id = 0;
  std::string host;
  // The node sums GPU tensors with NCCL (HYBRIDPS_GPU_LOCAL_REDUCE as the scheduler
  // resolved it for the node).
  bool gpu_reduce_nccl = false;
};
// Checks that this worker's node is complete and consistent (local_size ranks with local
// ranks 0 .. local_size-1); the error names the node's ranks and what they said.
absl::StatusOr<NodeLayout> NodeLayoutFromWelcome(const wire::Welcome& welcome, int rank);

// Horovod's cross_rank and cross_size of worker `rank`: its index among the workers with
// its local rank, in rank order, and their number (the nodes, when every node runs as
// many workers).
struct CrossPlace {
  int rank = 0;
  int size = 1;
};
CrossPlace CrossPlaceOf(const wire::Welcome& welcome, int rank);

// The local rank that pushes partition `part` of tensor `key` for its node (spread over
// the node's `local_size` ranks), when no local rank is a broadcast's root.
inline int NodePusherOf(uint64_t key, uint32_t part, int local_size) {
  return static_cast<int>((key + part) % static_cast<uint64_t>(local_size));
}

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_NODE_NODE_LAYOUT_H_
