// dist_hybrid's GPU push_pulls on nodes of several local ranks, reduced on the GPUs first
// (HYBRIDPS_GPU_LOCAL_REDUCE=nccl): the node's GPUs sum each partition with NCCL into
// the local rank that pushes it for the node, only that rank stages the node's sum to the
// host and pushes it, and after the pull it broadcasts the result to the node's other
// GPUs with NCCL. No host memory holds a per-rank copy and no CPU sums the node's data,
// as on the default path (GPU to host, then worker/ps/local/local_reduce.h's shared-memory sums).
//
// One operation, at every local rank:
//   1. the node agrees that every local rank has submitted it (below);
//   2. one NCCL group: per partition, ncclReduce(in -> out) rooted at its pusher
//      (NodeSumSink::NodePartsOf, spread over the local ranks by key and partition);
//   3. the partitions this rank pushes are copied from `out` into a pinned host buffer
//      (cached per tensor name), push_pulled by NodeSumSink::PushPullNodeSumAsync (no other
//      local rank pushes them) and the servers' result copied back into `out`: each GPU
//      moves only its share of the tensor over PCIe, 1/local_size of it;
//   4. when every local rank has finished step 3, one NCCL group: per partition,
//      ncclBroadcast(out) from its pusher; the handle completes.
// NCCL requires every rank to make its calls in the same order, while the users' threads
// submit in their own order and the servers answer each rank at its own pace. So steps 2
// and 4 run only as the node agrees, in rounds: each local rank lists, per tensor name,
// its oldest operation and whether that one is new or has finished step 3, the lists are
// gathered through a small shared-memory segment (ShmAllreduce::Allgather), and
// negotiation::Decide (the same as dist_allreduce's) orders what every rank has listed,
// identically at every rank; what a round agrees on runs as one NCCL group per step.
// Mismatched shapes fail on every rank with an error naming the ranks and their shapes.
//
// Threading: one thread ("hps-node-gpu") runs the rounds and makes every NCCL call.
// Rounds run at once when there is new work, every cycle_time while work is pending
// anywhere on the node, and every idle tick otherwise (so a rank with no work still joins
// the rounds of those waiting for it). Every wait has a deadline: an operation not done by
// op_timeout, or a round a local rank does not join within twice heartbeat_timeout (the
// scheduler names a dead process first, and the store then aborts the rounds), fails every
// pending operation with an error naming the tensor or the local ranks, aborts the NCCL
// communicator, and the reducer stays broken (every later operation fails).
#ifndef HYBRIDPS_WORKER_PS_LOCAL_NODE_GPU_REDUCE_H_
#define HYBRIDPS_WORKER_PS_LOCAL_NODE_GPU_REDUCE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/options.h"
#include "worker/gpu/gpu_staging.h"
#include "worker/handle.h"
#include "worker/node/node_layout.h"
#include "worker/ps/local/node_sum_sink.h"
#include "worker/node/negotiation.h"
#include "worker/node/shm_allreduce.h"

namespace hybridps {

// One tensor of a group of node collectives: `parts` of `in` (Reduce) or `out`.
struct NodeTensor {
  DType dtype = DType::kFloat32;
  const void* in = nullptr;
  void* out = nullptr;
  const std::vector<NodePart>* parts = nullptr;
};

// The collectives among a node's local ranks, on device memory: NCCL in CUDA builds
// (NewNcclNodeCollectives); tests use a host-memory stand-in. Called from one thread; each
// call returns when its work has completed on this rank (or failed).
class NodeCollectives {
 public:
  virtual ~NodeCollectives() = default;
  // Joins the node's communicator on `device`. Collective (every local rank, once, before
  // the other calls).
  virtual absl::Status Open(int device, absl::Time deadline) = 0;
  // One group: per tensor and part, the sum over the local ranks of `in`'s elements into
  // `out` at the part's pusher; the other ranks' `out` there is undefined afterwards.
  virtual absl::Status Reduce(const std::vector<NodeTensor>& tensors, absl::Time deadline) = 0;
  // One group: per tensor and part, the pusher's `out` there into every local rank's.
  virtual absl::Status Broadcast(const std::vector<NodeTensor>& tensors,
                                 absl::Time deadline) = 0;
  // Ends whatever runs (any thread); it and every later call fail with `why`.
  virtual void Abort(const absl::Status& why) = 0;
};

#if HYBRIDPS_WITH_NCCL
// NCCL among the node's local ranks: local rank 0 makes the communicator's id and the
// others get it through `exchange` (which must outlive the result).
std::unique_ptr<NodeCollectives> NewNcclNodeCollectives(ShmAllreduce* exchange,
                                                        const NodeLayout& layout);
#endif

class NodeGpuReducer {
 public:
  // The node's collectives; `exchange`: the node's segment (for NCCL's id), which
  // outlives them.
  using MakeCollectives = std::function<std::unique_ptr<NodeCollectives>(
      ShmAllreduce* exchange, const NodeLayout& layout)>;

  // Opens the node's negotiation segment (every local rank must, within
  // options.start_timeout) and starts the thread.
  // `copier`: step 3's copies (NewCudaCopier() in CUDA builds); `store`: this worker's
  // parameter-server store (step 3's push_pull, the partitions and their pushers), which
  // must outlive the reducer.
  static absl::StatusOr<std::unique_ptr<NodeGpuReducer>> Create(
      const Options& options, const NodeLayout& layout, std::unique_ptr<DeviceCopier> copier,
      NodeSumSink* store, const MakeCollectives& make_collectives);
  // Shutdown().
  ~NodeGpuReducer();
  NodeGpuReducer(const NodeGpuReducer&) = delete;
  NodeGpuReducer& operator=(const NodeGpuReducer&) = delete;

  // A GPU push_pull (same count and dtype; checked by the caller). `out` may alias `in`.
  // Both must be memory of the device of this worker's first GPU tensor (else
  // InvalidArgument naming the tensor).
  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority);
  // Finishes the operations it holds (bounded by their deadlines), tells the node's other
  // local ranks it leaves (their pending and later GPU push_pulls then fail, naming it),
  // stops the thread.
  void Shutdown();

  // Stops the node's collectives and rounds (any thread): the loop thread then fails every
  // operation with `status`, and so do the node's other local ranks.
  void Abort(const absl::Status& status);
  // Whether an operation on `name` was submitted and has not completed yet.
  bool Unfinished(absl::string_view name);

  struct Stats {
    uint64_t rounds = 0;      // negotiation rounds
    uint64_t reduces = 0;     // operations through step 2
    uint64_t broadcasts = 0;  // operations through step 4
    uint64_t groups = 0;      // NCCL groups (each step 2 or 4 of one round's operations)
    uint64_t copies = 0;     // step 3's copies (both ways)
    uint64_t host_allocations = 0;  // staging buffers allocated
  };
  Stats stats();

 private:
  struct Op;
  using OpPtr = std::shared_ptr<Op>;

  NodeGpuReducer(const Options& options, const NodeLayout& layout,
                 std::unique_ptr<DeviceCopier> copier);
  void Loop();
  // One round; false when the loop must stop (every rank left, or broken).
  bool Round();
  // One round's lists (Round and its parts, on the loop thread).
  struct RoundLists {
    negotiation::RankList mine;
    std::vector<OpPtr> listed;  // by entry of `mine`
    std::vector<std::pair<std::string, absl::Status>> my_errors;  // failed step 3s, listed
    std::vector<negotiation::RankList> all;                       // by local rank
    std::vector<std::map<std::string, absl::Status>> errors;      // by local rank
  };
  // Round's parts: the submitted operations join by_name_ (true: this rank is leaving and
  // has nothing left); the deadlines (false: broken); this rank's list; the node's lists
  // gathered (false: broken); what the plan says run or fail (false: broken).
  bool TakeIncoming();
  bool CheckDeadlines(absl::Time now);
  void ListMine(absl::Time now, bool leaving, RoundLists* r);
  bool Exchange(RoundLists* r);
  bool RunPlan(const negotiation::Plan& plan, const RoundLists& r);
  // Steps 2 and 3 of operations the node agreed on in one round (one NCCL group for all).
  void RunFirst(const std::vector<OpPtr>& ops);
  // Step 4 of operations whose step 3 every local rank has finished (one group).
  void RunSecond(const std::vector<OpPtr>& ops);
  // Starts step 3's copies of this rank's partitions between `out` and op's staging buffer.
  absl::Status StartCopies(const OpPtr& op, DeviceCopier::Direction direction,
                           std::vector<uint64_t>* tickets);
  // Waits for `tickets` (every ticket is spent), at most until `deadline`.
  absl::Status WaitCopies(const std::vector<uint64_t>& tickets, absl::Time deadline);
  // A new operation the node's ranks listed with different shapes (`error` names them):
  // fails it here and the servers' rounds it would have pushed to.
  void FailDisagreement(const OpPtr& op, const std::string& listed_name,
                        const std::vector<negotiation::RankList>& lists,
                        const absl::Status& error);
  // The error of an operation whose step 3 failed at some local rank (`errors`: what each
  // rank said this round, by listed name).
  absl::Status FailedPush(const OpPtr& op, const std::string& listed_name,
                          const std::vector<std::map<std::string, absl::Status>>& errors) const;
  void Finish(const OpPtr& op, const absl::Status& status);
  void Completed(const OpPtr& op, const absl::Status& status);  // counts and completes
  // Fails every operation with `status`; with `abort`, also breaks the reducer and ends
  // the node's collectives and rounds (here and, through the segment, at the other ranks).
  void FailAll(const absl::Status& status, bool abort);
  void Break(const absl::Status& status) { FailAll(status, /*abort=*/true); }
  absl::Status broken();
  std::string Who(const std::vector<int>& local_ranks) const;

  // Wakes the loop thread; shared with step 3's completion callbacks, which may run after
  // the reducer is gone.
  struct Bell {
    absl::Mutex mu;
    bool rung ABSL_GUARDED_BY(mu) = false;
    void Ring() {
      absl::MutexLock lock(&mu);
      rung = true;
    }
    void Wait(absl::Time until) {
      absl::MutexLock lock(&mu);
      mu.AwaitWithDeadline(absl::Condition(&rung), until);
      rung = false;
    }
  };

  Options options_;
  NodeLayout layout_;
  std::unique_ptr<DeviceCopier> copier_;
  StagingCache cache_;  // the loop thread only
  NodeSumSink* store_ = nullptr;  // this worker's store: it outlives the reducer (Create)
  std::unique_ptr<ShmAllreduce> exchange_;
  std::unique_ptr<NodeCollectives> collectives_;
  int device_ = -1;  // the communicator's (the loop thread only)
  absl::Duration idle_tick_;

  // The loop thread only: per name, operations in issue order (the first one is listed).
  std::map<std::string, std::deque<OpPtr>> by_name_;
  absl::Time last_round_ = absl::InfinitePast();
  // From the last round: per name, the local ranks that have not listed it.
  std::map<std::string, std::vector<int>> missing_;
  std::shared_ptr<Bell> bell_ = std::make_shared<Bell>();

  absl::Mutex mu_;
  std::vector<OpPtr> incoming_ ABSL_GUARDED_BY(mu_);
  int submit_device_ ABSL_GUARDED_BY(mu_) = -1;  // the first GPU tensor's
  std::map<std::string, uint32_t> occurrences_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int, std::less<>> unfinished_ ABSL_GUARDED_BY(mu_);
  size_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;  // the last round left work listed somewhere
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  absl::Mutex join_mu_;
  std::thread thread_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PS_LOCAL_NODE_GPU_REDUCE_H_
