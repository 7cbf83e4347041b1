// "dist_hybrid": the parameter-server store. Tensors are split into partitions
// (common/partition.h); each partition is pushed to its server and the round's sum pulled
// back in one request/reply exchange.
//
// Threading: user threads enqueue operations; the worker's I/O runs in turns (IoTurn):
// poll every socket, dispatch partitions by priority within a credit limit on bytes in
// flight, copy replies into the output tensors, complete handles. One thread at a time
// takes the turns, and every socket and the state marked "turns only" are its own while
// it does: the I/O thread ("hps-worker-io"), or a thread waiting on one of its operations
// (HelpWith, Options::caller_rounds; not on a node of several local ranks). A waiting
// thread runs the turns until its operation completed, which saves the wake-ups of the
// hand-off to the I/O thread and back on every round trip; the I/O thread then leaves
// the turns to waiting threads for kCallerGrace, takes them back as soon as they are
// free for work that someone follows without waiting (a callback, a poll: MXNet's engine,
// GPU staging; see Watched), when other work is left unclaimed that long, or after
// kIdleHandBack without a waiting thread, and hands them over when a waiting thread asks
// (io_wanted_). A waiting thread's turn takes operations only: barriers, RunOnIo's
// functions and the shutdown are the I/O thread's (io_call_ reserves it the next turn).
// Operations on one tensor name run in the order they were issued; different names
// overlap freely.
#ifndef HYBRIDPS_WORKER_PS_PS_STORE_H_
#define HYBRIDPS_WORKER_PS_PS_STORE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/control_client.h"
#include "common/hybridps.pb.h"
#include "common/options.h"
#include "common/timeline.h"
#include "common/partition.h"
#include "common/spin.h"
#include "common/transport.h"
#include "worker/handle.h"
#include "worker/kvstore.h"
#include "worker/ps/local/local_reduce.h"
#include "worker/ps/local/node_sum_sink.h"
#include "worker/ps/server_window.h"

namespace hybridps {

// dist_hybrid. It is the NodeSumSink of its node's GPU reduction (worker/ps/local/).
class PsStore : public KVStore, public NodeSumSink {
 public:
  // `on_broken`: called once, in an I/O turn, when the store breaks (a peer died, an
  // operation timed out); PsGpuStore stops the node's GPU reduction with it.
  using OnBroken = std::function<void(const absl::Status&)>;
  static absl::StatusOr<std::unique_ptr<PsStore>> Create(std::shared_ptr<Context> ctx,
                                                         const Options& options,
                                                         OnBroken on_broken = nullptr);
  ~PsStore() override;

  absl::string_view type() const override { return "dist_hybrid"; }
  int rank() const override { return rank_; }
  int num_workers() const override { return num_workers_; }
  int local_rank() const override { return options_.local_rank; }
  int local_size() const override { return options_.local_size; }
  int cross_rank() const override { return cross_.rank; }
  int cross_size() const override { return cross_.size; }

  absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor,
                                        int root_rank, int priority) override;
  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority) override;
  absl::Status Barrier() override;
  bool IsCapable(Capability capability) const override {
    return capability == Capability::kOptimizer;
  }
  absl::Status Shutdown() override;
  absl::Status SetGradientCompression(const GradientCompression& compression,
                                      absl::string_view name_prefix = "") override;
  absl::Status StartTimeline(const std::string& path) override;
  absl::Status StopTimeline() override;

  // The server-side optimizer (ps_store_optimizer.cc).
  absl::Status SetOptimizer(const ServerOptimizer& optimizer) override;
  absl::Status SetOptimizerParam(absl::string_view param, double value) override;
  absl::Status SaveOptimizerStates(const std::string& path) override;
  absl::Status LoadOptimizerStates(const std::string& path) override;

  // This worker's timeline (HYBRIDPS_TIMELINE), for its GPU front; null when off.
  // Never null once connected: it records with HYBRIDPS_TIMELINE or between
  // StartTimeline and StopTimeline (Recording() tells).
  Timeline* timeline() const { return timeline_.get(); }

  // NodeSumSink: for the node's GPU reduction (worker/ps/local/node_gpu_reduce.h).
  std::vector<NodePart> NodePartsOf(absl::string_view name, size_t count,
                                    DType dtype) const override;
  absl::StatusOr<Handle> PushPullNodeSumAsync(absl::string_view name, TensorView in,
                                              TensorView out, int priority) override;
  absl::StatusOr<Handle> FailNodeRoundAsync(absl::string_view name, size_t count, DType dtype,
                                            absl::string_view why) override;

  // Partitions per server dispatched so far (tests check placement and one push per node).
  std::vector<uint64_t> PushesPerServer() const;
  // The same per data connection: element l of server s's vector counts its lane l
  // (Options::max_server_lanes).
  std::vector<std::vector<uint64_t>> PushesPerLane() const;
  // The most payload bytes this worker has had pushed to one server and unanswered.
  size_t MaxUnansweredBytes() const { return max_unanswered_.load(); }
  // I/O turns run so far by threads waiting on their operations (see the threading notes).
  uint64_t CallerTurns() const { return caller_turn_count_.load(std::memory_order_relaxed); }
  // For tests: how long the I/O thread leaves idle turns to waiting threads (kIdleHandBack);
  // a long one makes every other path that gives it the turns back visible.
  void SetIdleHandBackForTesting(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    idle_hand_back_ = d;
  }
  // Where this worker sits (its node, the node's local ranks).
  const NodeLayout& layout() const { return layout_; }
  // Queues `fn` to run on the I/O thread, which does nothing else until it returns; any
  // thread. The optimizer calls run there; tests stall the thread with it.
  absl::Status RunOnIo(std::function<void()> fn);

  struct Op;  // An operation in progress (ps_store.cc).
  struct SavedTensor;  // A tensor's weights and state, gathered (ps_store_optimizer.cc).
  // Payload bytes handed to ZeroMQ and not yet written out: the credit in use. Released by
  // ZeroMQ's I/O thread when it is done with a payload — not when the round completes, so
  // a worker never stops sending while it waits for the others: two workers that issue
  // tensors in different orders cannot deadlock on full credit windows.
  struct Credits {  // (public for ps_store.cc's ZeroMQ free callback)
    std::atomic<size_t> queued{0};
    std::atomic<bool> blocked{false};  // Dispatch stopped for lack of credit
    Waker waker;                       // wakes the turns' poll (commands, credit)
  };

 private:
  PsStore(std::shared_ptr<Context> ctx, const Options& options, OnBroken on_broken)
      : ctx_(std::move(ctx)), options_(options), on_broken_(std::move(on_broken)) {}
  absl::Status Start();
  struct PartTask {
    int priority;
    uint64_t seq;  // op sequence number
    uint32_t part;
    std::shared_ptr<Op> op;
    // Nodes of several local ranks: this rank pushes the node's partition, from `data`
    // (nullptr: no payload); `fail` non-empty: a request that fails the server's round.
    bool local = false;
    const char* data = nullptr;
    std::string fail;
    bool skip = false;  // another local rank pushes it (PushPullNodeSumAsync): done at once
    bool operator<(const PartTask& o) const {  // std::priority_queue: top = largest
      if (priority != o.priority) return priority < o.priority;
      if (seq != o.seq) return seq > o.seq;
      return part > o.part;
    }
  };
  using GlobalOrder = ServerWindows::Order;
  struct InFlight {
    std::shared_ptr<Op> op;
    uint32_t part;
    uint64_t round;
    int server;
    size_t bytes;  // payload pushed (counted in windows_)
    GlobalOrder order;
    std::string stall;  // the server's last StallNotice: whom the round waits for
    absl::Time sent;    // when its request left (the timeline's span)
  };
  // A command for the I/O turns.
  struct Command {
    std::shared_ptr<Op> op;                  // a data operation, or
    std::shared_ptr<HandleState> barrier;    // a barrier, or
    std::shared_ptr<HandleState> finalize;   // leave the job
    std::function<void()> run;               // or run this on the I/O thread
  };
  // An optimizer request to a server, waiting for its reply (turns only).
  struct ServerCall {
    int server;
    absl::Time deadline;
    std::function<void(absl::StatusOr<wire::Envelope>)> done;
  };

  absl::StatusOr<Handle> SubmitPushPull(absl::string_view name, TensorView in, TensorView out,
                                        int priority, bool node_sum);
  absl::StatusOr<Handle> Submit(std::shared_ptr<Op> op);
  void IoLoop();
  // One turn of the worker's I/O (see the threading notes); `spin`: the taker's own. A
  // waiting thread's turn (`caller`) takes operations only: true when it left another
  // command (a barrier, RunOnIo's function, the shutdown) to the I/O thread.
  bool IoTurn(PollSpin* spin, bool caller);
  // The I/O thread: waits until the turns are its own. False: the store is closing (the
  // turns are its own then too, for its last requests).
  bool AcquireIoTurns();
  // A thread waiting on `state` (Options::caller_rounds): takes the turns (asking the I/O
  // thread for them, or waiting for another waiting thread to let them go) and runs them
  // until the operation completed. Returns at once when it cannot help.
  void HelpWith(HandleState* state);
  // Someone follows an operation without waiting on it (WaitHelper::Watched): the
  // I/O thread takes the turns for it as soon as they are free, without the grace.
  void Watched() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an operation queued or in flight is watched (HandleState::watched); by the
  // thread that has the turns.
  bool WatchedWorkLeft() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A command was queued that only the I/O thread runs (barriers, RunOnIo, the
  // shutdown): it takes the turns next, at once if nobody has them.
  void CallIoLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { io_call_ = true; }
  // The queued commands; a waiting thread's turn (`caller`) takes operations only (see
  // IoTurn) and returns whether it left others.
  bool TakeCommands(bool caller);
  void StartOp(std::shared_ptr<Op> op);
  void Activate(Op* op);
  void ReleaseHeld(absl::Time now, bool force);
  void Dispatch();
  // Sends partition task `t` (its place in the shared order: `order`) to its server.
  static size_t PushedBytes(const Op& op, const Partition& part);
  // SetGradientCompression's setting for the tensor `name`.
  GradientCompression CompressionOf(absl::string_view name);
  void SendPart(const PartTask& t, const GlobalOrder& order);
  bool HasCredit(size_t bytes);
  void HandleReply(int server, Message msg);
  // Opens the data connections to every server and completes their handshakes within
  // Options::start_timeout (ps_store_connect.cc).
  absl::Status ConnectServers();
  // The data connection (index into data_) of every partition of tensor `key`: a
  // tensor's partitions for one server take that server's lanes in turn, starting at one
  // drawn from the key (so one-partition tensors spread too). The same for every round of
  // the tensor, so a partition's rounds reach its server in order.
  std::vector<uint32_t> AssignLanes(uint64_t key, const std::vector<Partition>& parts) const;
  void FinishPart(Op* op, const absl::Status& status);
  void MaybeComplete(Op* op);
  void CheckDeadlines(absl::Time now);
  void Break(const absl::Status& status);
  void TakeLocalEvents();
  void PumpLocal();  // runs the local reducer until it has nothing to do now
  void SubmitLocal(Op* op);
  static void ReleaseFrame(void* data, void* hint);
  void FailServerCalls(const absl::Status& status, absl::Time now);

  // The partitions of a tensor and their servers: spread over the servers, or all on one
  // server while the optimizer needs whole-tensor norms (LAMB, LARS).
  std::vector<Partition> Place(uint64_t key, size_t count, DType dtype) const;
  // User threads: optimizer requests to servers; scheduler requests.
  absl::StatusOr<std::vector<wire::OptimizerResponse>> CallServers(
      std::vector<std::pair<int, wire::OptimizerRequest>> requests);
  absl::StatusOr<wire::Envelope> CallScheduler(wire::Envelope env);
  // Every worker calls it; rank 0 runs `rank0` (returning the rule it set) and tells the
  // others its outcome through the scheduler's store.
  absl::Status OptimizerCollective(absl::string_view what,
                                   const std::function<absl::StatusOr<wire::CollectiveResult>()>& rank0);
  absl::Status ConfigureServers(const wire::OptimizerSpec& spec, bool validate_only);
  absl::StatusOr<std::vector<wire::PartState>> GatherParts(wire::OptimizerResponse* spec);
  // Sends whole tensors to the servers, split as Place() says.
  absl::Status ScatterTensors(const std::map<std::string, SavedTensor>& tensors);

  std::shared_ptr<Context> ctx_;
  Options options_;
  OnBroken on_broken_;  // Create's; called by Break (in a turn)
  int rank_ = -1;
  int num_workers_ = 0;
  int num_servers_ = 0;
  std::vector<wire::NodeInfo> servers_;

  // The thread that takes the I/O turns only.
  // Records with HYBRIDPS_TIMELINE, or between StartTimeline and StopTimeline (any
  // thread: the Timeline locks itself). Set when the store connects.
  std::unique_ptr<Timeline> timeline_;
  // A user's StopTimeline reads control_'s clock offset; Shutdown resets control_ under it.
  absl::Mutex timeline_mu_;
  std::unique_ptr<ControlClient> control_;
  CrossPlace cross_;  // set when the store connects
  // The data connections: server s's lanes are data_[lane_first_[s]] and the
  // lane_count_[s] - 1 after it (Options::max_server_lanes); lane_server_ maps back.
  // The three index vectors are set by ConnectServers when the store starts and only read
  // afterwards (Submit reads them on the caller's thread).
  std::vector<std::unique_ptr<Socket>> data_;
  std::vector<int> lane_first_, lane_count_, lane_server_;
  std::vector<bool> inproc_;                   // by server rank: payloads are copied
  std::map<uint64_t, std::shared_ptr<Op>> active_;  // by seq: submission (= deadline) order
  absl::flat_hash_map<uint64_t, std::deque<std::shared_ptr<Op>>> per_key_;
  absl::flat_hash_map<uint64_t, uint64_t> rounds_;  // key -> next round
  std::priority_queue<PartTask> ready_;
  // Partitions of a burst being gathered (Options::burst_gather); they join ready_ when
  // the burst ends, the gathering has lasted ten gaps, or the store breaks.
  std::vector<PartTask> held_;
  absl::Time holding_since_ = absl::InfiniteFuture();  // InfiniteFuture: not gathering
  absl::flat_hash_map<uint64_t, InFlight> in_flight_;
  ServerWindows windows_;  // Options::server_window_bytes
  absl::Time last_send_ = absl::InfinitePast();
  bool windowed_waiting_ = false;  // the last Dispatch left windowed partitions
  uint64_t next_request_id_ = 1;
  std::shared_ptr<HandleState> finalize_;
  bool finalize_sent_ = false;
  absl::Status broken_;  // non-OK: a peer died or an operation timed out; all later fail
  std::vector<std::shared_ptr<Op>> failing_;  // failed ops waiting for ZeroMQ to release their payloads
  absl::Time broken_at_ = absl::InfiniteFuture();
  std::unique_ptr<std::atomic<uint64_t>[]> pushes_per_lane_;  // by data_ index
  absl::flat_hash_map<uint64_t, ServerCall> server_calls_;  // by request id

  std::atomic<bool> one_server_per_tensor_{false};
  // SetGradientCompression's settings, by name prefix (user threads; each push_pull takes
  // its own when submitted).
  absl::Mutex compression_mu_;
  std::vector<std::pair<std::string, GradientCompression>> compressions_
      ABSL_GUARDED_BY(compression_mu_);
  std::atomic<bool> any_compression_{false};
  // Turns only: the 2bit residual of each (key, partition) this worker pushes.
  absl::flat_hash_map<std::pair<uint64_t, uint32_t>, std::vector<float>> residuals_;
  uint64_t optimizer_collectives_ = 0;  // user thread of the collective calls

  NodeLayout layout_;
  std::unique_ptr<LocalReducer> local_;  // nodes of several local ranks
  absl::Time local_next_ = absl::InfinitePast();  // when local_ must pump next

  // Shared with user threads and ZeroMQ's threads.
  std::shared_ptr<Credits> credits_ = std::make_shared<Credits>();
  absl::Mutex mu_;
  std::vector<Command> commands_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // non-OK after Shutdown
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_submit_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<bool> io_exit_{false};
  // Who takes the I/O turns (see the threading notes).
  enum class IoOwner { kNone, kThread, kCaller };
  // How long the I/O thread leaves the turns to waiting threads after one let them go,
  // with work left unclaimed, and with nothing to do.
  static constexpr absl::Duration kCallerGrace = absl::Microseconds(200);
  static constexpr absl::Duration kIdleHandBack = absl::Milliseconds(10);
  absl::Duration idle_hand_back_ ABSL_GUARDED_BY(mu_) = kIdleHandBack;
  // An operation is followed without a wait (a callback, a poll; HandleState's watched
  // hook): the I/O thread takes the turns for it as soon as they are free.
  bool watched_ ABSL_GUARDED_BY(mu_) = false;
  IoOwner io_owner_ ABSL_GUARDED_BY(mu_) = IoOwner::kNone;
  // A thread waited on its operation since the I/O thread last took the turns for work
  // nobody claimed: the I/O thread leaves the turns to waiting threads.
  bool callers_active_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time caller_left_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // turns let go to them
  std::thread::id io_caller_ ABSL_GUARDED_BY(mu_);  // the waiting thread that has them
  // The I/O thread takes the turns next (a command only it runs is queued).
  bool io_call_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> io_wanted_{false};  // a waiting thread asks the I/O thread for them
  std::atomic<int> helpers_waiting_{0};  // threads in HelpWith waiting for the turns
  std::atomic<uint64_t> caller_turn_count_{0};  // CallerTurns()
  bool caller_turns_ = false;           // waiting threads may take the turns (Start)
  std::thread::id io_thread_id_;        // set before the gate opens (Start)
  std::shared_ptr<WaitHelperGate<PsStore>> gate_ =
      std::make_shared<WaitHelperGate<PsStore>>(&PsStore::HelpWith, &PsStore::Watched);
  std::atomic<size_t> max_unanswered_{0};
  absl::Mutex local_mu_;
  std::vector<LocalReducer::Event> local_events_ ABSL_GUARDED_BY(local_mu_);
  std::thread io_thread_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PS_PS_STORE_H_
