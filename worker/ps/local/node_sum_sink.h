// What a node's local reduction needs of the parameter-server store that pushes the
// node's sums: how a tensor is split and who pushes each partition, the push_pull of a sum
// already made on the node, and the failure of a round the local ranks disagreed on. The
// store (worker/ps/ps_store.h) implements it; the reduction sees nothing else of it, so
// worker/ps/local/ never includes worker/ps/.
#ifndef HYBRIDPS_WORKER_PS_LOCAL_NODE_SUM_SINK_H_
#define HYBRIDPS_WORKER_PS_LOCAL_NODE_SUM_SINK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "worker/handle.h"

namespace hybridps {

// A partition of a tensor as the node splits it: elements [offset, offset + count), pushed
// for the node by local rank `pusher`.
struct NodePart {
  uint64_t offset = 0;
  uint64_t count = 0;
  int pusher = 0;
};

class NodeSumSink {
 public:
  virtual ~NodeSumSink() = default;
  // How a push_pull of `count` `dtype` elements of `name` is split, and which local rank
  // pushes each partition (every local rank computes the same).
  virtual std::vector<NodePart> NodePartsOf(absl::string_view name, size_t count,
                                            DType dtype) const = 0;
  // A push_pull whose input already holds the node's sum in the partitions this local
  // rank pushes (NodePartsOf): pushes those, with no local reduction, and writes their
  // result into `out`; the other partitions of `out` are left as they are. Every local
  // rank of the node calls it for the same operation.
  virtual absl::StatusOr<Handle> PushPullNodeSumAsync(absl::string_view name, TensorView in,
                                                      TensorView out, int priority) = 0;
  // The node's local ranks disagreed on a push_pull: fails the servers' round of the
  // partitions this local rank pushes, split as `count` `dtype` elements would be (every
  // local rank calls it with the same), so that the other nodes' workers get the error
  // `why` at once instead of waiting for the deadline. The handle completes once the
  // requests are sent.
  virtual absl::StatusOr<Handle> FailNodeRoundAsync(absl::string_view name, size_t count,
                                                    DType dtype, absl::string_view why) = 0;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PS_LOCAL_NODE_SUM_SINK_H_
