// dist_hybrid's worker joining and leaving the job: registration, its data connections
// (lanes) to every server, in proportion to the server's byte share
// (Options::max_server_lanes), the handshakes, which lane each partition takes, and the
// shutdown.
#include <pthread.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/status.h"
#include "common/wire.h"
#include "worker/ps/ps_store.h"

namespace hybridps {

absl::Status PsStore::Start() {
  ControlClient::Callbacks cb;
  cb.node_failed = [this](const wire::NodeFailed& f) {
    Break(absl::UnavailableError(f.reason()));
  };
  cb.shutdown = [this](const wire::Shutdown& sd) {
    if (!finalize_sent_) {
      Break(absl::AbortedError(absl::StrCat("the job was shut down: ", sd.reason())));
    }
  };
  cb.scheduler_lost = [this](const absl::Status& s) { Break(s); };
  ASSIGN_OR_RETURN(control_, ControlClient::Connect(*ctx_, options_, std::move(cb)));
  ASSIGN_OR_RETURN(wire::Welcome welcome, control_->Register(""));
  rank_ = welcome.rank();
  num_workers_ = welcome.num_workers();
  num_servers_ = welcome.num_servers();
  servers_.assign(welcome.servers().begin(), welcome.servers().end());
  SetLogTag(absl::StrCat("worker ", rank_));
  ASSIGN_OR_RETURN(layout_, NodeLayoutFromWelcome(welcome, rank_));
  cross_ = CrossPlaceOf(welcome, rank_);
  if (num_servers_ < 1) {
    return absl::FailedPreconditionError("dist_hybrid needs at least one server");
  }
  std::vector<std::string> lanes = {"operations"};
  for (int s = 0; s < num_servers_; ++s) lanes.push_back(absl::StrCat("to server ", s));
  const int node_lane = static_cast<int>(lanes.size());
  if (layout_.local_size > 1) lanes.push_back("node: local reduce, local broadcast");
  timeline_ = Timeline::OpenOrDormant(options_.timeline, absl::StrCat("worker ", rank_),
                                       100 + rank_, std::move(lanes));
  RETURN_IF_ERROR(ConnectServers());
  if (layout_.local_size > 1) {
    // Events come from inside Pump, on the I/O thread, which takes them right after, or
    // from the reducer thread, which wakes the I/O thread then.
    ASSIGN_OR_RETURN(local_, LocalReducer::Create(
                                 options_, layout_,
                                 [this](LocalReducer::Event e) {
                                   absl::MutexLock lock(&local_mu_);
                                   local_events_.push_back(std::move(e));
                                 },
                                 [this] { credits_->waker.Wake(); }, timeline_.get(),
                                 node_lane));
  }
  // Not on a node of several local ranks: they reduce through their I/O turns, and a
  // rank's turns must not wait for its user to come back while the others wait for it.
  caller_turns_ = options_.caller_rounds != 0 && !local_;
  io_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hps-worker-io");
    IoLoop();
  });
  io_thread_id_ = io_thread_.get_id();
  gate_->Open(this);
  HPS_LOG(INFO) << "joined the job as worker " << rank_ << " of " << num_workers_ << " with "
                << num_servers_ << " servers"
                << (local_ ? absl::StrCat(", local rank ", layout_.local_rank, " of ",
                                          layout_.local_size, " on node ", layout_.node, " of ",
                                          layout_.num_nodes)
                           : std::string())
                << LauncherNote(options_);
  return absl::OkStatus();
}

absl::Status PsStore::Shutdown() {
  auto state = std::make_shared<HandleState>();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    stopping_ = true;
    closed_ = absl::FailedPreconditionError("the store was shut down");
    commands_.push_back(Command{nullptr, nullptr, state, nullptr});
    CallIoLocked();
  }
  absl::Status s;
  if (io_thread_.joinable()) {
    credits_->waker.Wake();
    s = state->Wait();
    io_exit_.store(true);
    {
      absl::MutexLock lock(&mu_);
      CallIoLocked();  // the I/O thread takes the turns for the last requests
    }
    credits_->waker.Wake();  // a waiting thread's turn ends
    io_thread_.join();
  }
  if (timeline_ && control_) {
    if (absl::Status s = StopTimeline(); !s.ok()) HPS_LOG(WARNING) << s.message();
    timeline_->WriteAndLog(control_->clock_offset());
  }
  absl::MutexLock timeline_lock(&timeline_mu_);  // a user's StopTimeline reads control_
  local_.reset();
  data_.clear();
  control_.reset();
  return s;
}

absl::Status PsStore::ConnectServers() {
  Poller poller;
  const ServerPlacement placement{num_servers_, options_.extra_servers};
  const JobKey key(options_.job_token);
  std::vector<ClientHandshake> handshakes;  // by lane (common/auth.h)
  for (int s = 0; s < num_servers_; ++s) {
    const bool tcp = absl::StartsWith(servers_[s].endpoint(), "tcp://");
    inproc_.push_back(absl::StartsWith(servers_[s].endpoint(), "inproc://"));
    lane_first_.push_back(static_cast<int>(data_.size()));
    lane_count_.push_back(tcp ? ServerLanes(placement, s, options_.max_server_lanes) : 1);
    for (int l = 0; l < lane_count_[s]; ++l) {
      ASSIGN_OR_RETURN(auto sock,
                       Socket::Create(*ctx_, SocketType::kDealer, options_.max_message_bytes));
      RETURN_IF_ERROR(EncryptAsClient(*sock, options_, servers_[s].endpoint()));
      RETURN_IF_ERROR(sock->Connect(servers_[s].endpoint()));
      // Servers count pushes per node: a lane speaks for its worker's node.
      handshakes.emplace_back(key, wire::ROLE_WORKER, layout_.node);
      Message hello = Encode("", handshakes.back().Hello());
      RETURN_IF_ERROR(sock->Send(hello));
      poller.Add(sock.get());
      data_.push_back(std::move(sock));
      lane_server_.push_back(s);
    }
  }
  // A window per connection: a server with a larger byte share, and so more lanes, may
  // have as many more bytes unanswered (Options::server_window_bytes).
  std::vector<size_t> windows;
  for (int s = 0; s < num_servers_; ++s) {
    windows.push_back(options_.server_window_bytes * static_cast<size_t>(lane_count_[s]));
  }
  windows_ = ServerWindows(std::move(windows));
  pushes_per_lane_.reset(new std::atomic<uint64_t>[data_.size()]);
  for (size_t i = 0; i < data_.size(); ++i) pushes_per_lane_[i] = 0;
  std::vector<bool> acked(data_.size(), false);
  size_t pending = data_.size();
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  while (pending > 0) {
    absl::Time now = absl::Now();
    if (now >= deadline) {
      std::vector<std::string> missing;
      for (int s = 0; s < num_servers_; ++s) {
        bool all = true;
        for (int l = 0; l < lane_count_[s]; ++l) all = all && acked[lane_first_[s] + l];
        if (!all) missing.push_back(absl::StrCat(s, " (", servers_[s].endpoint(), ")"));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "no handshake from servers ", absl::StrJoin(missing, ", "), " within ",
          absl::FormatDuration(options_.start_timeout)));
    }
    ASSIGN_OR_RETURN(int n, poller.Poll(deadline - now));
    if (n == 0) continue;
    for (size_t i = 0; i < data_.size(); ++i) {
      if (!poller.Readable(static_cast<int>(i))) continue;
      ASSIGN_OR_RETURN(auto msg, data_[i]->TryRecv());
      if (!msg) continue;
      ASSIGN_OR_RETURN(Decoded d, Decode(std::move(*msg), false));
      const int s = lane_server_[i];
      if (d.env.body_case() == wire::Envelope::kError) {
        return absl::FailedPreconditionError(absl::StrCat(
            "server ", s, " (", servers_[s].endpoint(), ") refused the handshake: ",
            d.env.error().message()));
      }
      if (d.env.body_case() == wire::Envelope::kHelloAck && !acked[i]) {
        ASSIGN_OR_RETURN(wire::Envelope auth,
                         handshakes[i].Answer(d.env.hello_ack(),
                                              absl::StrCat("server ", s, " (",
                                                           servers_[s].endpoint(), ")")));
        Message m = Encode("", auth);
        RETURN_IF_ERROR(data_[i]->Send(m));
        acked[i] = true;
        --pending;
      }
    }
  }
  return absl::OkStatus();
}

std::vector<uint32_t> PsStore::AssignLanes(uint64_t key,
                                           const std::vector<Partition>& parts) const {
  std::vector<uint32_t> lanes(parts.size());
  std::vector<uint64_t> next(num_servers_, key);
  for (size_t i = 0; i < parts.size(); ++i) {
    const int s = parts[i].server;
    lanes[i] = static_cast<uint32_t>(lane_first_[s]) +
               static_cast<uint32_t>(next[s]++ % static_cast<uint64_t>(lane_count_[s]));
  }
  return lanes;
}

std::vector<std::vector<uint64_t>> PsStore::PushesPerLane() const {
  std::vector<std::vector<uint64_t>> v(num_servers_);
  for (int s = 0; s < num_servers_; ++s) {
    for (int l = 0; l < lane_count_[s]; ++l) v[s].push_back(pushes_per_lane_[lane_first_[s] + l]);
  }
  return v;
}

std::vector<uint64_t> PsStore::PushesPerServer() const {
  std::vector<uint64_t> v(num_servers_, 0);
  for (size_t i = 0; i < lane_server_.size(); ++i) v[lane_server_[i]] += pushes_per_lane_[i];
  return v;
}

absl::Status PsStore::StartTimeline(const std::string& path) {
  if (!timeline_) return absl::FailedPreconditionError("the store is not connected");
  return timeline_->Start(path);
}

absl::Status PsStore::StopTimeline() {
  if (!timeline_) return absl::OkStatus();
  absl::MutexLock lock(&timeline_mu_);
  return timeline_->Stop(control_ ? control_->clock_offset() : absl::ZeroDuration());
}

}  // namespace hybridps

