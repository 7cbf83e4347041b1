// Local reduction for nodes of several local ranks on CPUs: the ranks of one node sum
// each partition in POSIX shared memory, one of them (the partition's "pusher", spread
// over the local ranks by key and partition) push_pulls the node's sum, and every local
// rank copies the result back out. Only one push per node and partition leaves the host;
// the servers count one push per node.
//
// Shared memory: a control segment per node and job, created by local rank 0 and unlinked
// as soon as every local rank has mapped it, named after the scheduler endpoint, the node
// and the job id; stale segments of earlier jobs on the same scheduler endpoint and node
// are unlinked at start. It holds the slot table: one slot per tensor partition (key,
// part), registered on first use and kept for the job, with that partition's round state
// (who joined, contributed, copied out; the result state or the error). Data lives in one
// segment per tensor (key and size): local_size contribution regions and a result region,
// each the tensor's size, created by the first local rank that needs it and removed by the
// last local rank to leave the job. Because every partition has its own slot and memory,
// a partition only ever waits for its own previous round, never for another tensor, so
// nodes that issue tensors in different orders cannot deadlock on shared resources.
//
// Threading: two executors. Tensors of at most Options::local_inline_bytes run inline:
// the owner's thread (the store's I/O thread) polls wake_fd() with its sockets and calls
// Pump(), which does every copy and sum that can be done now and reports through `notify`
// (called inside Pump), so a small partition goes from submission to its push, and from
// the server's reply to its completion, without a thread hand-off. Larger tensors run on
// the reducer thread ("hps-local"), so their copies and sums overlap the owner's network
// work; it reports through `notify` and then calls `wake`. Submit/Publish/Cancel/Abort
// only queue work (any thread). Every state change rings the other local ranks' doorbell
// of the same executor (a FIFO each, polled by the thread that acts on it). Waits have
// deadlines; a local rank whose executors have not run for heartbeat_timeout (its process
// died or hangs) fails the node's operations.
#ifndef HYBRIDPS_WORKER_PS_LOCAL_LOCAL_REDUCE_H_
#define HYBRIDPS_WORKER_PS_LOCAL_LOCAL_REDUCE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/hybridps.pb.h"
#include "common/options.h"
#include "common/timeline.h"
#include "common/transport.h"
#include "worker/node/node_layout.h"

namespace hybridps {

namespace local_reduce_shm {
struct SlotHeader;
}  // namespace local_reduce_shm

class LocalReducer {
 public:
  // One partition of one operation at this local rank.
  struct Task {
    std::shared_ptr<void> owner;  // the operation; kept alive until the task's kDone
    uint32_t part = 0;
    std::string name;  // the tensor's name, for errors
    uint64_t key = 0;
    uint64_t round = 0;
    wire::DataOp op = wire::OP_PUSHPULL;
    DType dtype = DType::kFloat32;
    uint64_t count = 0;        // elements of this partition
    uint64_t offset = 0;       // its first element in the tensor
    uint64_t total_count = 0;  // of the whole tensor
    TensorShape shape;         // of the whole tensor, compared where given
    int root = -1;             // broadcast: the root's worker rank
    const char* in = nullptr;  // this partition's bytes
    char* out = nullptr;
    absl::Time deadline;
  };
  struct Event {
    enum Kind {
      kPush,    // this rank pushes the node's partition: `data` (nullptr: no payload)
      kDone,    // the task ended with `status`; nothing of it touches memory any more
      kBroken,  // a local rank died: the store must fail
    };
    Kind kind = kDone;
    std::shared_ptr<void> owner;
    uint32_t part = 0;
    const char* data = nullptr;
    std::string fail;  // kPush: non-empty: push a request that fails the server's round
    absl::Status status;
  };
  using Notify = std::function<void(Event)>;
  using Wake = std::function<void()>;

  // Opens (local rank 0: creates) the node's segment; waits until every local rank has
  // attached, at most until `deadline`.
  // `timeline` (may be null; it must outlive the reducer): each task's local reduction
  // and local broadcast become spans on its lane `timeline_lane`.
  static absl::StatusOr<std::unique_ptr<LocalReducer>> Create(const Options& options,
                                                              const NodeLayout& layout,
                                                              Notify notify, Wake wake,
                                                              Timeline* timeline = nullptr,
                                                              int timeline_lane = 0);
  ~LocalReducer();

  // The local rank that pushes partition `part` of tensor `key` for the node.
  int PusherOf(uint64_t key, uint32_t part, int root_rank) const;
  void Submit(Task task);
  // The fd to poll for readability (other local ranks rang); then call Pump.
  int wake_fd() const { return exec_[kInline].bells[layout_.local_rank]; }
  // Advances every task as far as it can go now, checks the other local ranks' liveness
  // and the deadlines. Returns when it must be called again at the latest (it must also
  // be called after wake_fd() turns readable and after Submit/Publish/Cancel/Abort).
  absl::Time Pump() { return Run(kInline); }
  // Work was queued since the last Pump.
  bool queued() const { return exec_[kInline].queued.load(std::memory_order_acquire); }
  // The pusher's server round ended: its reply payload (absent for a broadcast root).
  void Publish(const void* owner, uint32_t part, absl::Status status,
               std::optional<Frame> payload);
  // Fails the tasks of `owner` still running (their operation failed elsewhere).
  void Cancel(const void* owner, const absl::Status& status);
  // Fails every task, now and later.
  void Abort(const absl::Status& status);

  struct Shared;  // the segment's layout (local_reduce.cc)

 private:
  struct Pending {  // a task at this rank, as Pump advances it
    Task task;
    enum Stage { kClaim, kArrivals, kWaitPublish, kWaitResult, kCopyOut } stage = kClaim;
    int slot = -1;        // in the node's slot table (one per tensor partition)
    char* base = nullptr;  // the tensor's shared memory
    bool joined = false;  // counted in the slot: must leave it
    bool pusher = false;
    bool published = false;
    absl::Status pub_status;
    std::optional<Frame> payload;
    size_t bytes = 0;
    int exec = 0;  // the executor it runs on
    absl::Time submitted = absl::InfinitePast();  // for the timeline
  };
  struct Inbox {
    std::vector<Task> submitted;
    struct Pub {
      const void* owner;
      uint32_t part;
      absl::Status status;
      std::optional<Frame> payload;
    };
    std::vector<Pub> published;
    std::vector<std::pair<const void*, absl::Status>> cancelled;
    absl::Status aborted;
  };

  enum ExecKind { kInline = 0, kThreaded = 1 };
  struct Exec {
    std::list<Pending> tasks;  // its thread only
    absl::Status broken;
    std::vector<uint64_t> last_beat;      // of the other local ranks, as last seen
    std::vector<absl::Time> last_change;  // when it last changed
    std::vector<int> bells;               // this executor's doorbell FIFOs, by local rank
    absl::Mutex mu;
    Inbox inbox ABSL_GUARDED_BY(mu);
    std::atomic<bool> queued{false};
    uint64_t emitted = 0;  // events sent (its thread only)
    absl::Time last_stall_log = absl::InfinitePast();  // its thread only
  };

  LocalReducer(const Options& options, const NodeLayout& layout, Notify notify, Wake wake)
      : options_(options), layout_(layout), notify_(std::move(notify)), wake_(std::move(wake)) {}
  absl::Status Attach();
  // Attach's parts: the node's segment, then the doorbells.
  absl::Status MapSegment(const std::string& stale_prefix, absl::Time deadline);
  absl::Status OpenDoorbells(absl::Time deadline);
  std::string BellPath(int e, int local_rank) const;
  absl::Status OpenBell(int e, int local_rank);
  absl::Status WaitAll(const std::atomic<uint32_t>& counter, absl::Time deadline,
                       absl::string_view what) const;
  // Runs executor `e`'s tasks as far as they go now; returns when to run it next.
  absl::Time Run(int e);
  // Run's parts: the queued work, the other local ranks' liveness, the deadlines.
  void TakeInbox(int e);
  void CheckLiveness(int e, absl::Time now);
  absl::Time FailOverdue(int e, absl::Time now);
  std::string WhyOverdue(const Pending& t);
  void ThreadLoop();
  void Queue(int e, const std::function<void(Inbox&)>& add);
  void Ring(int e);  // the other local ranks' doorbells of executor e
  void RingAll();
  void Emit(int e, Event ev);  // notify_, counted
  bool Step(Pending& t);
  // A timeline span of t, `what`, from `start` until now.
  void Record(const Pending& t, const char* what, absl::Time start) const;
  // The stages of Step, one each; true when the task has ended.
  bool StepClaim(Pending& t);
  bool StepArrivals(Pending& t);
  bool StepWaitPublish(Pending& t);
  bool StepWaitResult(Pending& t);
  bool StepCopyOut(Pending& t);
  // Joins the round of t's slot: claims the slot when it is free, else compares t with the
  // slot's first claim (a disagreement fails the round for every local rank). kWait: the
  // slot's previous round is still being copied out; kFailed: `*failed` says why, with
  // `*mismatch` when the local ranks disagreed.
  enum class Join { kJoined, kWait, kFailed };
  Join JoinSlot(Pending& t, absl::Status* failed, bool* mismatch);
  std::string Disagreement(const local_reduce_shm::SlotHeader& slot, const Task& k) const;
  bool FailFromSlot(Pending& t, const absl::Status& status, bool local_mismatch);
  void EmitPush(const Pending& t, const char* data, std::string fail);
  char* Region(const Pending& t, int local_rank) const;
  uint64_t FullMask() const;
  void Leave(Pending& t, const absl::Status& status);
  absl::StatusOr<int> FindSlot(uint64_t key, uint32_t part);
  absl::StatusOr<char*> TensorSegment(uint64_t key, uint64_t bytes);
  static void RemoveSegments(const std::string& prefix);
  std::string Who(int local_rank) const;

  Options options_;
  NodeLayout layout_;
  Notify notify_;
  Timeline* timeline_ = nullptr;
  int timeline_lane_ = 0;
  Wake wake_;
  std::string shm_name_;
  std::string job_prefix_;  // names of this job's tensor segments (without the '/')
  size_t map_bytes_ = 0;
  Shared* shared_ = nullptr;

  Exec exec_[2];
  absl::Mutex seg_mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::pair<void*, size_t>> segments_
      ABSL_GUARDED_BY(seg_mu_);  // mapped
  std::atomic<bool> exit_{false};
  std::thread thread_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PS_LOCAL_LOCAL_REDUCE_H_
