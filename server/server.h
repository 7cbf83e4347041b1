// A server: owns the partitions placed on it, sums each round's pushes and answers with
// the result. One I/O thread (Run) owns the data socket, the scheduler link and the round
// bookkeeping (KeyStore), and sums small payloads itself, so a small push_pull costs no
// thread hand-off; large sums go to engine threads, each partition always to the same
// one, so its sums keep their order while different partitions are summed in parallel.
#ifndef HYBRIDPS_SERVER_SERVER_H_
#define HYBRIDPS_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/control_client.h"
#include "common/options.h"
#include "common/timeline.h"
#include "common/transport.h"
#include "server/engine.h"
#include "server/optimizer_host.h"

namespace hybridps {

class Server {
 public:
  struct Stats {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> rejected{0};  // malformed, unexpected or unauthenticated
    std::atomic<uint64_t> data_requests{0};  // partitions pushed or pulled (one per node)
  };

  // Binds the data endpoint (see Options::interface / transport) and connects to the
  // scheduler; does not block.
  static absl::StatusOr<std::unique_ptr<Server>> Create(const Context& ctx,
                                                        const Options& options);
  ~Server();

  // Registers, then serves until the scheduler shuts the job down (OK) or the scheduler
  // is lost or Stop() was called (an error). Runs on the calling thread.
  absl::Status Run();
  void Stop();  // any thread

  const std::string& endpoint() const { return endpoint_; }
  int rank() const { return rank_; }
  const Stats& stats() const { return stats_; }

 private:
  struct Peer {  // an authenticated connection
    int node = -1;  // the worker node it speaks for (its handshake)
  };
  explicit Server(const Options& options) : options_(options) {}
  void HandleData(Message msg);
  void TakeSumsDone();
  void Reject(const std::string& peer, uint64_t id, const absl::Status& why);
  void HandleOptimizer(const std::string& peer, uint64_t id,
                       const wire::OptimizerRequest& req);
  // An update of one tensor's partitions, from the closed rounds to UpdateDone.
  struct PendingUpdate {
    OptimizerHost::Job job;
    absl::Status error;  // a partition could not join: the whole update fails with it
    uint64_t round = 0;
    uint32_t num_parts = 1;
    std::vector<uint32_t> parts;
    std::vector<std::unique_ptr<Frame>> sums;  // by position in `parts` (stable addresses)
  };
  absl::StatusOr<bool> StartUpdate(const wire::DataRequest& req, std::optional<Frame>* sum);
  void PostUpdate(uint64_t key, std::shared_ptr<PendingUpdate> u);

  Options options_;
  std::unique_ptr<Socket> data_;
  std::unique_ptr<ControlClient> control_;
  std::string endpoint_;
  int rank_ = -1;
  std::vector<int> node_of_;  // worker rank -> its node (from the Welcome)
  std::vector<std::string> worker_names_;  // by rank: "worker 3 (host h, pid p)"
  std::unique_ptr<Timeline> timeline_;     // HYBRIDPS_TIMELINE; null: off
  absl::Time next_stall_check_ = absl::InfinitePast();
  // HYBRIDPS_SUMMARY_EVERY_MS: the traffic at the start of the interval, and its start.
  void LogSummary(absl::Time now);
  absl::Time next_summary_ = absl::InfinitePast();
  absl::Time summary_from_;
  KeyStore::Traffic summary_base_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::unique_ptr<KeyStore> store_;  // I/O thread
  OptimizerHost optimizer_;          // I/O thread (updates run on engines)
  // LAMB/LARS: the partitions of a tensor's round that closed so far, by key.
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingUpdate>> groups_;
  absl::flat_hash_map<std::string, Peer> peers_;  // by routing id, once authenticated
  const Gatekeeper gate_{JobKey(options_.job_token)};  // the job-token handshake
  Waker waker_;  // engines' completions and Stop()
  std::atomic<bool> stop_{false};
  absl::Status exit_status_;
  bool done_ = false;
  Stats stats_;
  struct SumDone {
    uint64_t key;
    uint32_t part;
    uint64_t round;
  };
  // Sums finished by engine threads, taken by the I/O thread.
  absl::Mutex done_mu_;
  std::vector<SumDone> sums_done_ ABSL_GUARDED_BY(done_mu_);
  struct UpdateDone {
    uint64_t key;
    uint32_t part;
    uint64_t round;
    absl::Status status;
    std::optional<Frame> weights;
  };
  std::vector<UpdateDone> updates_done_ ABSL_GUARDED_BY(done_mu_);
};

}  // namespace hybridps

#endif  // HYBRIDPS_SERVER_SERVER_H_
