// The client side of the scheduler's control protocol, used by servers and workers:
// handshake, registration, heartbeats, barriers, the rendezvous store, finalisation, and
// the scheduler's notices (a node failed, shut down).
//
// Threading: the client belongs to its owner's I/O thread, which polls socket() and calls
// OnReadable() and Tick(). Every callback runs on that thread.
#ifndef HYBRIDPS_COMMON_CONTROL_CLIENT_H_
#define HYBRIDPS_COMMON_CONTROL_CLIENT_H_

#include <functional>
#include <atomic>
#include <deque>
#include <map>
#include <utility>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/hybridps.pb.h"
#include "common/options.h"
#include "common/transport.h"

namespace hybridps {

class ControlClient {
 public:
  using Reply = std::function<void(absl::StatusOr<wire::Envelope>)>;
  struct Callbacks {
    std::function<void(const wire::NodeFailed&)> node_failed;
    std::function<void(const wire::NodeLeft&)> node_left;  // optional
    std::function<void(const wire::Shutdown&)> shutdown;
    // The scheduler stopped answering heartbeats, or the link failed.
    std::function<void(const absl::Status&)> scheduler_lost;
  };

  // Connects (does not block) to options.SchedulerEndpoint().
  static absl::StatusOr<std::unique_ptr<ControlClient>> Connect(const Context& ctx,
                                                                const Options& options,
                                                                Callbacks callbacks);

  // Handshake and registration; blocks the owner thread until the scheduler's Welcome
  // (the whole job has registered) or options.start_timeout. `data_endpoint`: servers'
  // bound endpoint.
  absl::StatusOr<wire::Welcome> Register(const std::string& data_endpoint);

  // Sends a request (Barrier, KvSet, KvGet, KvWait, Finalize); `on_reply` is called exactly
  // once: with the reply, with the scheduler's Error, or DeadlineExceeded at `deadline`.
  void Request(wire::Envelope env, absl::Time deadline, Reply on_reply);

  void OnReadable();
  // Heartbeats and deadlines. Call at least at NextTick().
  void Tick(absl::Time now);
  absl::Time NextTick() const;

  Socket* socket() { return socket_.get(); }
  // Requests waiting for their replies (owner thread).
  bool HasPending() const { return !pending_.empty(); }
  // This process's clock minus the scheduler's, measured in the handshake (Register).
  // Estimated from the handshake and the heartbeats' echoes (the shortest round trip among
  // the last kClockSamples); safe to read from any thread.
  absl::Duration clock_offset() const {
    return absl::Microseconds(clock_offset_.load(std::memory_order_relaxed));
  }
  // Fails every pending request with `status` (the owner is shutting down).
  void FailAll(const absl::Status& status);

 private:
  // The job-token handshake (common/auth.h), before anything else is sent.
  absl::Status Authenticate(absl::Time deadline);
  // The scheduler's next decodable message before the Welcome, or DeadlineExceeded.
  absl::StatusOr<wire::Envelope> NextBeforeWelcome(absl::Time deadline);
  ControlClient(const Options& options, Callbacks callbacks)
      : options_(options), callbacks_(std::move(callbacks)) {}
  void Handle(wire::Envelope env);
  void Send(const wire::Envelope& env);

  struct Pending {
    absl::Time deadline;
    Reply reply;
    std::string stall;  // the scheduler's last StallNotice about it
  };
  Options options_;
  Callbacks callbacks_;
  std::unique_ptr<Socket> socket_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> pending_;
  void SampleClock(absl::Time sent, absl::Time received, absl::Time scheduler);
  std::atomic<int64_t> clock_offset_{0};  // µs
  static constexpr size_t kClockSamples = 64;  // about a minute of heartbeats
  std::deque<std::pair<absl::Duration, int64_t>> clock_samples_;  // (round trip, offset µs)
  absl::Time last_heard_ = absl::InfinitePast();
  absl::Time next_heartbeat_ = absl::InfinitePast();
  bool lost_ = false;
};

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_CONTROL_CLIENT_H_
