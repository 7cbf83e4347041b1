// "dist_allreduce": push_pull is a sum-allreduce across all workers, broadcast a broadcast
// from a root — no servers. CPU tensors go through Gloo over tcp (the ring, or with 3
// workers or more and up to Options::direct_allreduce_bytes two steps directly between
// every pair of workers, GlooComm::AllreduceDirect),
// bootstrapped through the scheduler's rendezvous store; when every worker is a local rank
// of one node (one host), their allreduces, broadcasts and the negotiation's exchange run
// in shared memory instead (worker/node/shm_allreduce.h, Options::local_allreduce); over
// several nodes, with Options::hierarchical_allreduce, each node sums in shared memory and
// the nodes' local ranks 0 allreduce over a Gloo mesh of their own. Which of the three is
// chosen once at start (worker/allreduce/cpu_collectives.h). GPU tensors go through NCCL when
// built with CUDA (HYBRIDPS_WITH_NCCL; otherwise they fail with Unimplemented): one
// communicator over all workers, on the device of the first GPU tensor this worker
// submits (a GPU tensor on another device is refused at submission). Rank 0 makes the
// NCCL id at Create (when it sees a GPU) and passes it through the rendezvous store; the
// communicator itself is created by the executor on the first GPU collective, which every
// rank reaches at the same point of the negotiated order.
//
// Operations run in the same order on every rank whatever order each rank submitted
// them in: a background executor negotiates, Horovod-style, what every rank has ready
// (worker/node/negotiation.h). Each cycle (Options::cycle_time, only while some rank has work
// pending) the ranks exchange the lists of their ready operations (one small exchange,
// GlooComm::AllgatherBytes; a round that repeats the last one reuses its plan,
// negotiation::RoundCache); an operation ready everywhere runs, small push_pulls
// fused into one allreduce per dtype (Options::fusion_bytes; CPU tensors over
// Options::fusion_max_tensor_bytes, 128 KiB at most in shared memory, run alone, in place;
// rank 0's values for every rank),
// tiny ones computed from the lists themselves (their data rides along, so a small
// push_pull costs one collective, not two). An operation whose ranks
// disagree on its size, dtype, kind or root fails on every rank with an error naming them;
// one that some ranks never submit is logged after Options::stall_warning, naming the
// missing ranks, and fails at its deadline (Options::op_timeout).
//
// Threading:
// - user threads submit (validate, queue under mu_, wake the executor);
// - "hps-ar-exec", the executor, runs the negotiation rounds, the collectives they
//   decide and handle completion. A thread waiting on a handle (Handle::Wait) runs a
//   round that is due itself while no other thread is in one (Options::caller_rounds,
//   CPU-only stores): an isolated operation then costs no hand-off to the executor and
//   back. One thread at a time holds the round (round_busy_) and with it the Gloo and
//   NCCL communicators and the Op fields marked "round holder". While threads wait on
//   their operations (callers_active_: one waited since the executor last ran a round
//   for work nobody claimed), the executor leaves a new CPU operation to them for
//   kCallerGrace before it runs the round itself, and a submission does not wake it
//   while it polls the queue each cycle (exec_polling_; an operation nobody waits on
//   thus starts within a cycle and the grace): a woken executor competes for the cores
//   with the ranks' waiting threads (on one core it preempts the thread it should leave
//   the round to), and the ranks then settle into 5-30 microseconds per small operation
//   instead of two. When nobody claims an operation within the grace (callers that never
//   Wait, such as MXNet's engine, which only takes completion callbacks), callers_active_
//   ends and submissions wake the executor at once again; a waiting thread that could
//   not help (declined_) has the executor run its round as soon as one is due.
//   GPU collectives of a round are enqueued on the NCCL stream as they come (CPU ones
//   run meanwhile) and waited for at the end of the round (polling events, with the
//   deadline; a broken store aborts the NCCL communicator);
// - "hps-ar-io" owns the scheduler client once the store has started: heartbeats,
//   barriers, finalisation, and the scheduler's notices (a peer died, the job ended),
//   which break the store (Break).
// Until the I/O thread starts (in Start, before the eager probe), the constructing thread
// owns the scheduler client and pumps it itself (registration, the Gloo rendezvous).
//
// Leaving: Shutdown finishes this rank's pending operations (bounded by their deadlines)
// and announces, in a last round, that the rank leaves; the ranks that are not leaving
// then fail their later operations with an error naming who left.
#ifndef HYBRIDPS_WORKER_ALLREDUCE_ALLREDUCE_STORE_H_
#define HYBRIDPS_WORKER_ALLREDUCE_ALLREDUCE_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/control_client.h"
#include "common/options.h"
#include "common/timeline.h"
#include "common/transport.h"
#include "worker/kvstore.h"
#include "worker/node/negotiation.h"
#include "worker/allreduce/cpu_collectives.h"
#include "worker/allreduce/eager_probe.h"
#include "worker/node/node_layout.h"
#include "worker/node/shm_allreduce.h"

namespace hybridps {

class GlooComm;
class NcclComm;

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
  int cross_rank() const override { return cross_.rank; }
  int cross_size() const override { return cross_.size; }

  absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor,
                                        int root_rank, int priority) override;
  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority) override;
  absl::Status Barrier() override;
  bool IsCapable(Capability capability) const override { return false; }
  absl::Status Shutdown() override;
  absl::Status StartTimeline(const std::string& path) override;
  absl::Status StopTimeline() override;

  // What the executor did so far (tests and benchmarks read it).
  struct Stats {
    uint64_t rounds = 0;         // negotiation rounds
    uint64_t caller_rounds = 0;  // of which run by a thread waiting on a handle
    uint64_t allreduces = 0;     // Gloo allreduce calls
    uint64_t fused_tensors = 0;  // push_pulls that went through a fusion buffer
    uint64_t cached_plans = 0;   // rounds that ran the last round's plan (RoundCache)
    uint64_t eager = 0;          // operations computed from the negotiation data
    uint64_t two_shots = 0;      // push_pulls run as two-shots (negotiation.h)
    uint64_t shm_allreduces = 0;  // allreduces run in shared memory (one host, or a node)
    uint64_t direct_allreduces = 0;  // allreduces sent directly between every pair (Gloo)
    uint64_t broadcasts = 0;     // Gloo broadcast calls
    uint64_t nccl_groups = 0;    // NCCL launches (a group of a fused bucket counts once)
    uint64_t nccl_tensors = 0;   // GPU tensors reduced or broadcast through NCCL
    uint64_t eager_probes = 0;   // 1 when the eager probe ran at the start
    uint64_t largest_slot = 0;   // the negotiation's largest slot (bytes per rank) so far
    absl::Duration negotiating;  // rounds' listing and exchanges
    absl::Duration executing;    // running what the rounds decided
  };
  Stats stats() const;
  // The largest push_pull (bytes) that goes eagerly: Options::eager_bytes / (workers - 1),
  // 64 KiB at most in shared memory, lowered by the eager probe where it ran.
  size_t eager_limit() const;
  // The largest CPU push_pull that is fused (Decide's max_tensor_bytes): rank 0's
  // Options::fusion_max_tensor_bytes, 128 KiB at most in shared memory.
  size_t fusion_max_tensor_bytes() const;

  struct Op;  // an operation in progress (allreduce_op.h)
  // The smallest negotiation slot (bytes per rank in a round's allgather).
  static constexpr size_t kMinSlotBytes = 4096;
  // How long the executor leaves a new CPU operation to a thread that may wait on it
  // while waiting threads run the rounds (callers_active_; at most Options::cycle_time).
  static constexpr absl::Duration kCallerGrace = absl::Microseconds(200);
  // How long after the last submission the executor polls the queue each cycle instead of
  // sleeping until a submission wakes it (while callers_active_).
  static constexpr absl::Duration kPollWindow = absl::Milliseconds(10);

 private:
  // Whether the CPU collectives run in shared memory (every worker on one host, not
  // hierarchical): the same on every rank once Start has chosen them.
  bool InSharedMemory() const;
  AllreduceStore(std::shared_ptr<Context> ctx, const Options& options);
  absl::Status Start();
  // Start: rank 0's value under `prefix` in the scheduler's rendezvous store, on every
  // rank (rank 0 makes it with `make`, and stores it).
  absl::StatusOr<std::string> FromRankZero(const std::string& prefix,
                                           const std::function<std::string()>& make);
  // Start: chooses cpu_: shared memory when rank 0 wants it, the whole job is one node
  // (or, with hierarchical_allreduce, per node with a Gloo mesh between the nodes) and
  // every rank could set it up; otherwise Gloo, saying why in the log.
  absl::Status SetUpSharedMemory(const wire::Welcome& welcome);
  // Start: every rank takes rank 0's fusion settings (Options::fusion_bytes,
  // fusion_max_tensor_bytes), so that all plan alike; a rank whose own differ warns.
  absl::Status ShareFusionSettings();
  // Start: the eager probe (Options::eager_probe, eager_probe.h), where it applies; sets
  // eager_cap_.
  absl::Status ProbeEager(const wire::Welcome& welcome);
  // Each size's runs in the eager probe, eagerly and through the allreduce.
  static constexpr int kEagerProbeReps = 5;
  // OK for a tensor this build and this worker can reduce; else an error naming it.
  absl::Status CheckTensor(absl::string_view name, const TensorView& t,
                           absl::string_view what);
  absl::StatusOr<Handle> Submit(std::shared_ptr<Op> op);
  // Any thread: fails every queued operation the executor is not running, and every
  // later one, with `status`. The first status wins.
  void Break(const absl::Status& status);
  void BreakLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The executor thread.
  void ExecLoop();
  // Waits until the next round is due and no other thread holds the round (or the store
  // broke); then holds it (round_busy_, from *claimed). False: stop.
  bool WaitForRound(absl::Time* claimed);
  // When the next round is due (InfinitePast: now), for a waiting thread (`caller`) or
  // the executor (which leaves new CPU work to waiting threads for kCallerGrace).
  absl::Time NextRoundLocked(bool caller) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the executor leaves new work to waiting threads for a while (kCallerGrace):
  // while they run the rounds (callers_active_), on a store without GPU tensors (those
  // are the executor's).
  bool LeavesWorkToCallersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return callers_active_ && !declined_ && gpu_device_ < 0;
  }
  // The calling thread holds the round from `now` (round_busy_, last_round_).
  void ClaimRoundLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one round as the holder (round_busy_ set, at `claimed`), then lets the round go.
  // False: stop. `caller`: a waiting thread, not the executor.
  bool HoldRound(bool caller, absl::Time claimed);
  // Sets wake_, and wakes the executor if it sleeps until it is set (not while it sleeps
  // until a due round: there a submission need not wake it).
  void WakeExecutorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    wake_ = true;
    if (exec_awaits_wake_) wake_cv_.Signal();
  }
  // A thread waiting on `state` (Options::caller_rounds): runs the rounds that are due
  // while the round is free (waiting up to kCallerGrace for a held one to be let go),
  // until the operation completed or it cannot help.
  void HelpWith(HandleState* state);
  void ExpireDeadlines(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One round, claimed at `now`: list, exchange, decide, run. False: stop. A `caller`
  // (HelpWith) lists no GPU operation.
  bool RunRound(bool caller, absl::Time now, bool* job_active);
  // RunRound's parts: the oldest operation of each name, taken into the round (true: this
  // rank is leaving and has nothing left); this rank's list with the payloads that go
  // along; every rank's list, gathered and parsed (and the next round's slot size; the
  // exchange ends at *t1); what the plan runs.
  bool ListHeads(bool caller, absl::Time now, std::vector<std::shared_ptr<Op>>* listed);
  void ListMine(const std::vector<std::shared_ptr<Op>>& listed, absl::Time now,
                negotiation::RankList* mine);
  // ListMine's part for a direct two-shot (Options::direct_two_shot): scattered_ and the
  // room this rank asks for.
  void ListDirectTwoShot(const std::vector<std::shared_ptr<Op>>& listed, size_t eager_tensor,
                         negotiation::RankList* mine);
  absl::Status GatherLists(negotiation::RankList* mine,
                           std::vector<negotiation::RankList>* lists, absl::Time* t1);
  absl::Status RunPlan(const negotiation::Plan& plan,
                       const std::vector<std::shared_ptr<Op>>& listed);
  absl::Status Execute(const negotiation::Action& action,
                       const std::vector<std::shared_ptr<Op>>& listed);
  // Whether push_pulls may send their shares with the negotiation (ListDirectTwoShot):
  // Options::direct_two_shot, over Gloo alone, 3 workers or more.
  bool DirectTwoShots() const;
  // Records how the push_pull of `name` ran (ran_alone_).
  void NoteRun(const std::string& name, bool alone_and_direct);
  // A kTwoShot action (CPU): sums this rank's chunk, shares it with every peer.
  absl::Status ExecuteTwoShot(const negotiation::Action& action, Op* op);
  void Warn(const negotiation::Plan& plan, const std::vector<std::shared_ptr<Op>>& listed,
            absl::Time now);
  // Completes `op` with `status` and counts it in `counter` (when given), under one lock.
  void Finish(Op* op, absl::Status status, uint64_t Stats::*counter = nullptr);
  // Ends an action of one operation: explains a failure (ExplainFailure), counts the
  // action in `counter`, and finishes the operation; returns the status.
  absl::Status FinishCounted(Op* op, absl::Status s, uint64_t Stats::*counter);
#if HYBRIDPS_WITH_NCCL
  // allreduce_gpu.cc.
  absl::Status ShareNcclId();  // Start: rank 0's id to everyone
  absl::Status CheckGpuTensor(absl::string_view name, const TensorView& t,
                              absl::string_view what);
  // Enqueues a GPU action on the NCCL stream (creating the communicator the first time).
  absl::Status ExecuteGpu(const negotiation::Action& action,
                          const std::vector<std::shared_ptr<Op>>& listed);
  // End of a round: waits for the GPU work ExecuteGpu enqueued and finishes its
  // operations; after a `failure` aborts it instead. Returns the round's status.
  absl::Status FinishGpu(absl::Status failure);
  // At the executor's end: closes the NCCL communicator (aborts it if `broken`).
  void CloseGpu(bool broken);
  absl::Status BrokenStatus() ABSL_LOCKS_EXCLUDED(mu_);  // NCCL waits poll it
#endif
  // After a transport failure: waits (at most the heartbeat timeout and a little more)
  // for the scheduler to say which peer died.
  // At most once per round (verdict_awaited_).
  void AwaitPeerVerdict() ABSL_LOCKS_EXCLUDED(mu_);
  // A failed collective's status: the store's broken_ when it broke meanwhile (after
  // AwaitPeerVerdict for a transport failure), else `s`.
  absl::Status ExplainFailure(absl::Status s) ABSL_LOCKS_EXCLUDED(mu_);

  // The I/O thread.
  void IoLoop();

  std::shared_ptr<Context> ctx_;
  const Options options_;
  const absl::Duration idle_tick_;
  // The timeout of each Gloo wait (one transfer of a collective, a round's exchange):
  // twice the heartbeat timeout, at most op_timeout. By then the scheduler has named
  // any dead or hung peer and Break has shut the connections down; but this Gloo's tcp
  // transport does not wake a send it had queued on a connection that then failed (it
  // only signals bound buffers there), so such a send waited for its own timeout: the
  // whole op_timeout, 120 s by default, after the job had already failed.
  const absl::Duration gloo_timeout_;
  int rank_ = -1;
  int num_workers_ = 0;
  std::string gloo_host_, gloo_iface_;
  size_t fusion_bytes_ = 0;             // rank 0's Options::fusion_bytes (Start)
  size_t fusion_max_tensor_bytes_ = 0;  // rank 0's Options::fusion_max_tensor_bytes (Start)
  size_t direct_allreduce_bytes_ = 0;   // rank 0's Options::direct_allreduce_bytes (Start)
  int eager_probe_ = 0;                 // rank 0's Options::eager_probe (Start)
  size_t probe_eager_bytes_ = 0;        // rank 0's Options::eager_bytes, for the probe
  // The largest push_pull that goes eagerly, as the eager probe found (Start); SIZE_MAX
  // when it did not run.
  size_t eager_cap_ = SIZE_MAX;

  // The constructing thread until Start starts the I/O thread, then that thread only.
  std::unique_ptr<ControlClient> control_;
  CrossPlace cross_;  // set when the store connects
  // Records with HYBRIDPS_TIMELINE, or between StartTimeline and StopTimeline (any
  // thread: the Timeline locks itself). Set when the store connects.
  std::unique_ptr<Timeline> timeline_;
  // A user's StopTimeline reads control_'s clock offset; Shutdown resets control_ under it.
  absl::Mutex timeline_mu_;
  // The round holder only (and Shutdown, after it has joined the executor).
  std::unique_ptr<GlooComm> comm_;
  // The CPU collectives, of the kind chosen at Start (cpu_collectives.h). Set at Start;
  // the round holder uses it, Break aborts it (any thread); over comm_.
  std::unique_ptr<CpuCollectives> cpu_;
  size_t slot_bytes_;
  std::deque<size_t> recent_sizes_;  // largest negotiation message or room of the last rounds
  std::string fusion_;  // the fusion buffer
  std::string msg_;     // a round's negotiation message, framed (AllgatherFramed), when it
                        // does not go in place (CpuCollectives::ExchangeRoom)
  // A round's lists, kept with their memory from round to round (RunRound): this rank's
  // operations in it, its list, everyone's messages and everyone's lists parsed.
  std::vector<std::shared_ptr<Op>> listed_;
  negotiation::RankList mine_;
  // The entry of mine_ (and listed_) whose shares go to every peer with a message of its
  // own (the direct two-shot, Options::direct_two_shot), or none.
  std::optional<size_t> scattered_;
  // The names whose last push_pull ran alone and directly (a direct allreduce of its own,
  // or a direct two-shot): from the plans, so the same on every rank. Only these send
  // their shares along: a tensor that runs fused or through the ring would waste them.
  absl::flat_hash_set<std::string> ran_alone_;
  std::vector<size_t> per_peer_bytes_;  // the messages' lengths, by peer
  std::vector<absl::string_view> gathered_;
  std::vector<negotiation::RankList> lists_;
  // Parses the messages that repeat the last round's and reuses its plan (the steady
  // state); the round holder only, like lists_, whose entries it updates.
  negotiation::RoundCache round_cache_;
  bool verdict_awaited_ = false;  // in this round (AwaitPeerVerdict)
  absl::flat_hash_map<std::string, absl::Time> foreign_warned_;  // name -> next warning
#if HYBRIDPS_WITH_NCCL
  std::string nccl_id_;           // set at Start; empty: no GPU tensors (nccl_unavailable_)
  std::string nccl_unavailable_;  // why not
  std::unique_ptr<NcclComm> nccl_;  // the executor only (GPU stores never run caller rounds)
  struct GpuWork {                  // enqueued in this round, not yet waited for
    uint64_t ticket = 0;
    std::vector<Op*> ops;
    absl::Time deadline;
  };
  std::vector<GpuWork> gpu_work_;  // the executor only
#endif

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Op>> queued_ ABSL_GUARDED_BY(mu_);  // by submission
  absl::flat_hash_map<std::string, uint32_t> occurrences_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;      // a submission since the executor looked
  // The executor sleeps on these (WaitForRound), not on conditions of mu_, which every
  // unlock of mu_ by the threads that submit and run the rounds would evaluate:
  // wake_cv_ is signalled with wake_ while the executor waits for it (exec_awaits_wake_,
  // WakeExecutorLocked), round_free_cv_ when a round is let go, both when the store
  // breaks.
  absl::CondVar wake_cv_;
  absl::CondVar round_free_cv_;
  bool exec_awaits_wake_ ABSL_GUARDED_BY(mu_) = false;
  // A thread waited on its operation (HelpWith) since the executor last ran a round for
  // work nobody claimed within kCallerGrace: see the threading notes.
  bool callers_active_ ABSL_GUARDED_BY(mu_) = false;
  // A waiting thread could not run a round (another thread held it, none was due, or the
  // store is stopping) and sleeps: until the queue is empty after a round, the executor
  // runs rounds as soon as they are due, without a grace.
  bool declined_ ABSL_GUARDED_BY(mu_) = false;
  // The executor sleeps until a round it computed from the queue is due, or polls the
  // queue each cycle within kPollWindow of the last submission: a submission need not
  // wake it. Otherwise (it sleeps until the idle tick) a submission wakes it.
  bool exec_polling_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_submit_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown was called
  bool exec_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);    // non-OK: no operation can run any more
  bool peers_left_ ABSL_GUARDED_BY(mu_) = false;  // broken_ says other ranks shut down
  absl::Status closed_ ABSL_GUARDED_BY(mu_);    // non-OK after Shutdown
  std::vector<std::shared_ptr<HandleState>> barriers_ ABSL_GUARDED_BY(mu_);  // for the I/O thread
  std::shared_ptr<HandleState> finalize_ ABSL_GUARDED_BY(mu_);
  bool round_busy_ ABSL_GUARDED_BY(mu_) = false;  // a thread holds the round
  absl::Time last_round_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool job_active_ ABSL_GUARDED_BY(mu_) = false;  // the last round left work pending somewhere
  // Handles' wait helpers reach the store through this (closed when it is destroyed).
  std::shared_ptr<WaitHelperGate<AllreduceStore>> gate_ =
      std::make_shared<WaitHelperGate<AllreduceStore>>(&AllreduceStore::HelpWith);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  int gpu_device_ ABSL_GUARDED_BY(mu_) = -1;  // the first GPU tensor's device

  Waker io_waker_;
  std::atomic<bool> io_exit_{false};
  std::thread exec_thread_;
  std::thread io_thread_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_ALLREDUCE_ALLREDUCE_STORE_H_
