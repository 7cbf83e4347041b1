// The scheduler: rendezvous of a job. Registers W workers and S servers, assigns ranks,
// hands out the address book, runs barriers and the rendezvous key-value store, watches
// heartbeats (a node silent for heartbeat_timeout is declared dead and every node is
// told), and shuts the job down in order once every worker has finalised.
//
// Threading: Run() is the scheduler's single thread; it owns the socket. Stop() may be
// called from any thread.
#ifndef HYBRIDPS_SCHEDULER_SCHEDULER_H_
#define HYBRIDPS_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/hybridps.pb.h"
#include "common/wire.h"
#include "common/options.h"
#include "common/transport.h"

namespace hybridps {

class Scheduler {
 public:
  // Binds options.SchedulerEndpoint() (tcp port 0: ephemeral) and, when
  // options.port_file is set, writes the bound port there atomically.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const Context& ctx,
                                                           const Options& options);
  ~Scheduler();

  // Serves until the job ends. OK when every worker finalised and no node failed;
  // otherwise the reason the job failed (a node died, registration timed out, Stop()).
  absl::Status Run();
  // Ends Run() soon (any thread).
  void Stop();
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Node {
    std::string peer;  // routing id
    wire::NodeRole role = wire::ROLE_UNKNOWN;
    int rank = -1;
    int claimed_rank = -1;  // the rank its handshake claimed (-1: none yet)
    bool registered = false;
    bool finalized = false;
    bool dead = false;
    absl::Time last_seen;
    wire::Register reg;
    uint64_t register_id = 0;
  };
  struct KvWaiter {
    std::string peer;
    uint64_t id;
    std::vector<std::string> keys;
    absl::Time deadline;
  };

  Scheduler(const Options& options) : options_(options) {}
  void HandleMessage(Message msg);
  void HandleRegister(Node& node, uint64_t id, const wire::Register& reg);
  // OK when reg's settings agree with the job's (wire::JobSettings), else an error that
  // names the setting, this process's value and the job's.
  absl::Status CheckSettings(const wire::Register& reg) const;
  void AssignRanksAndWelcome();
  // Barriers that have waited stall_warning: tells the arrived whom they wait for.
  void WarnBarrierStalls(absl::Time now);
  std::vector<int> GroupNodes(const std::vector<Node*>& workers);
  void HandleBarrier(Node& node, uint64_t id, wire::BarrierGroup group);
  void CompleteBarriers();
  // A worker finalized while others still run: tells every node (servers then fail the
  // rounds that wait for its node).
  void AnnounceLeft(const Node& node);
  // Some registered worker has neither finalized nor died.
  bool WorkersRunning() const;
  void HandleKvWait(Node& node, uint64_t id, const wire::KvWait& wait);
  void ServeKvWaiters(absl::Time now);
  void CheckHeartbeats(absl::Time now);
  void DeclareDead(Node& node, const std::string& reason);
  void MaybeFinish();
  void Reply(const std::string& peer, const wire::Envelope& env);
  void ReplyError(const std::string& peer, uint64_t id, const absl::Status& status);
  void Broadcast(const wire::Envelope& env);
  std::string NodeName(const Node& node) const;
  size_t Count(wire::NodeRole role, bool registered_only) const;

  Options options_;
  std::unique_ptr<Socket> socket_;
  Waker stop_waker_;
  std::atomic<bool> stop_{false};
  std::string endpoint_;
  std::map<std::string, Node> nodes_;  // by routing id
  bool welcomed_ = false;
  const Gatekeeper gate_{JobKey(options_.job_token)};  // the job-token handshake
  const wire::JobSettings settings_ = JobSettingsOf(options_);  // the job's shape
  int register_order_ = 0;  // Registration order, kept in Node::rank until ranks are given.
  absl::Time start_time_;
  // Barrier arrivals per group: peer -> request id.
  std::map<int, std::map<std::string, uint64_t>> barriers_;
  // Per group with arrivals: when its first arrival came, and its last StallNotice.
  std::map<int, std::pair<absl::Time, absl::Time>> barrier_clock_;
  std::map<std::string, std::string> kv_;
  size_t kv_bytes_ = 0;  // keys and values held in kv_
  // Bounds on what the job's processes can make the scheduler hold (rendezvous data is a
  // few KiB): more is refused with a named error.
  static constexpr size_t kMaxKvBytes = 64 << 20;
  static constexpr size_t kMaxKvWaiters = 4096;
  std::vector<KvWaiter> kv_waiters_;
  absl::Status job_status_;
  bool done_ = false;
};

}  // namespace hybridps

#endif  // HYBRIDPS_SCHEDULER_SCHEDULER_H_
