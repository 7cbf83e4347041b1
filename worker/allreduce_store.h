// "dist_allreduce": push_pull is a sum-allreduce across all workers, broadcast a broadcast
// from a root — no servers. CPU tensors go through Gloo (ring allreduce over tcp),
// bootstrapped through the scheduler's rendezvous store; GPU tensors (NCCL) are not built
// yet and fail with Unimplemented.
//
// Operations run in the same order on every rank whatever order each rank submitted
// them in: a background executor negotiates, Horovod-style, what every rank has ready
// (worker/negotiation.h). Each cycle (Options::cycle_time, only while some rank has work
// pending) the ranks exchange the lists of their ready operations (one small exchange,
// GlooComm::AllgatherBytes); an operation ready everywhere runs, small push_pulls
// fused into one allreduce per dtype (Options::fusion_bytes), tiny ones computed from the lists themselves (their data rides
// along, so a small push_pull costs one collective, not two). An operation whose ranks
// disagree on its size, dtype, kind or root fails on every rank with an error naming them;
// one that some ranks never submit is logged after Options::stall_warning, naming the
// missing ranks, and fails at its deadline (Options::op_timeout).
//
// Threading:
// - user threads submit (validate, queue under mu_, wake the executor);
// - "hps-ar-exec", the executor, owns the Gloo communicator: negotiation rounds, the
//   collectives they decide, handle completion;
// - "hps-ar-io" owns the scheduler client once the store has started: heartbeats,
//   barriers, finalisation, and the scheduler's notices (a peer died, the job ended),
//   which break the store (Break).
// Until Create returns, the constructing thread owns the scheduler client and pumps it
// itself (registration, the Gloo rendezvous).
//
// Leaving: Shutdown finishes this rank's pending operations (bounded by their deadlines)
// and announces, in a last round, that the rank leaves; the ranks that are not leaving
// then fail their later operations with an error naming who left.
#ifndef HYBRIDPS_WORKER_ALLREDUCE_STORE_H_
#define HYBRIDPS_WORKER_ALLREDUCE_STORE_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/control_client.h"
#include "common/options.h"
#include "common/transport.h"
#include "worker/kvstore.h"
#include "worker/negotiation.h"

namespace hybridps {

class GlooComm;

class AllreduceStore : public KVStore {
 public:
  // Registers with the scheduler (Options::start_timeout) and connects the Gloo mesh.
  static absl::StatusOr<std::unique_ptr<AllreduceStore>> Create(std::shared_ptr<Context> ctx,
                                                                const Options& options);
  ~AllreduceStore() override;

  absl::string_view type() const override { return "dist_allreduce"; }
  int rank() const override { return rank_; }
  int num_workers() const override { return num_workers_; }
  int local_rank() const override { return options_.local_rank; }
  int local_size() const override { return options_.local_size; }

  absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor,
                                        int root_rank, int priority) override;
  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority) override;
  absl::Status Barrier() override;
  bool IsCapable(Capability capability) const override { return false; }
  absl::Status Shutdown() override;

  // What the executor did so far (tests and benchmarks read it).
  struct Stats {
    uint64_t rounds = 0;         // negotiation rounds
    uint64_t allreduces = 0;     // Gloo allreduce calls
    uint64_t fused_tensors = 0;  // push_pulls that went through a fusion buffer
    uint64_t eager = 0;          // operations computed from the negotiation data
    uint64_t broadcasts = 0;     // Gloo broadcast calls
    absl::Duration negotiating;  // in the rounds' allgathers
    absl::Duration executing;    // running what the rounds decided
  };
  Stats stats() const;

  struct Op;  // an operation in progress (allreduce_op.h)
  // The smallest negotiation slot (bytes per rank in a round's allgather).
  static constexpr size_t kMinSlotBytes = 4096;

 private:
  AllreduceStore(std::shared_ptr<Context> ctx, const Options& options);
  absl::Status Start();
  absl::StatusOr<Handle> Submit(std::shared_ptr<Op> op);
  // Any thread: fails every queued operation the executor is not running, and every
  // later one, with `status`. The first status wins.
  void Break(const absl::Status& status);
  void BreakLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The executor thread.
  void ExecLoop();
  // Waits until the next round is due (or the store broke). False: stop.
  bool WaitForRound(absl::Time last_round, bool job_active);
  void ExpireDeadlines(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One round: list, exchange, decide, run. False: stop.
  bool RunRound(bool* job_active);
  absl::Status Execute(const negotiation::Action& action,
                       const std::vector<std::shared_ptr<Op>>& listed);
  void Warn(const negotiation::Plan& plan, const std::vector<std::shared_ptr<Op>>& listed,
            absl::Time now);
  void Finish(Op* op, absl::Status status);
  // After a transport failure: waits (at most the heartbeat timeout and a little more)
  // for the scheduler to say which peer died.
  void AwaitPeerVerdict() ABSL_LOCKS_EXCLUDED(mu_);

  // The I/O thread.
  void IoLoop();

  std::shared_ptr<Context> ctx_;
  const Options options_;
  const absl::Duration idle_tick_;
  int rank_ = -1;
  int num_workers_ = 0;
  std::string gloo_host_, gloo_iface_;

  // The constructing thread until Start returns, then the I/O thread only.
  std::unique_ptr<ControlClient> control_;
  // The executor only (and Shutdown, after it has joined the executor).
  std::unique_ptr<GlooComm> comm_;
  size_t slot_bytes_;
  std::deque<size_t> recent_sizes_;  // largest negotiation message of the last rounds
  std::string fusion_;  // the fusion buffer
  absl::flat_hash_map<std::string, absl::Time> foreign_warned_;  // name -> next warning

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Op>> queued_ ABSL_GUARDED_BY(mu_);  // by submission
  absl::flat_hash_map<std::string, uint32_t> occurrences_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;      // a submission since the executor looked
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown was called
  bool exec_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);    // non-OK: no operation can run any more
  bool peers_left_ ABSL_GUARDED_BY(mu_) = false;  // broken_ says other ranks shut down
  absl::Status closed_ ABSL_GUARDED_BY(mu_);    // non-OK after Shutdown
  std::vector<std::shared_ptr<HandleState>> barriers_ ABSL_GUARDED_BY(mu_);  // for the I/O thread
  std::shared_ptr<HandleState> finalize_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);

  Waker io_waker_;
  std::atomic<bool> io_exit_{false};
  std::thread exec_thread_;
  std::thread io_thread_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_ALLREDUCE_STORE_H_
