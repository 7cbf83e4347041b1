#include "server/server.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/spin.h"
#include "common/status.h"
#include "common/wire.h"

namespace hybridps {
namespace {

std::string DataBindEndpoint(const Options& o) {
  static std::atomic<int> counter{0};
  if (o.transport == "inproc") {
    return absl::StrCat("inproc://hybridps-server-", getpid(), "-", counter++);
  }
  if (o.transport == "ipc") {
    // Linux's abstract namespace ("@"): no file to leave behind, even when killed.
    return absl::StrCat("ipc://@hybridps-server-", getpid(), "-", counter++);
  }
  return PeerBindEndpoint(o.interface, o.SchedulerEndpoint());
}

// Engine thread of a partition: a hash of (key, part). Uses the low bits of the key.
size_t EngineOf(uint64_t key, uint32_t part, size_t engines) {
  uint64_t h = key ^ (static_cast<uint64_t>(part) * 0x9e3779b97f4a7c15ull);
  return static_cast<size_t>(h % engines);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const Context& ctx,
                                                       const Options& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Server> s(new Server(options));
  ASSIGN_OR_RETURN(s->data_,
                   Socket::Create(ctx, SocketType::kRouter, options.max_message_bytes));
  const std::string bind = DataBindEndpoint(options);
  RETURN_IF_ERROR(EncryptAsServer(*s->data_, options, bind));
  ASSIGN_OR_RETURN(const std::string bound, s->data_->Bind(bind));
  s->endpoint_ = DialableEndpoint(bound);
  ControlClient::Callbacks cb;
  Server* self = s.get();
  cb.node_failed = [self](const wire::NodeFailed& f) {
    HPS_LOG(WARNING) << "told: " << f.reason();
    if (self->store_) self->store_->FailAll(absl::UnavailableError(f.reason()));
  };
  cb.node_left = [self](const wire::NodeLeft& l) {
    HPS_LOG(INFO) << "told: " << l.reason();
    if (!self->store_ || l.rank() < 0 || l.rank() >= static_cast<int>(self->node_of_.size())) {
      return;
    }
    self->store_->Leave(self->node_of_[l.rank()], l.reason());
  };
  cb.shutdown = [self](const wire::Shutdown& sd) {
    HPS_LOG(INFO) << "shutting down: " << sd.reason();
    // A failed job's server fails too (its exit status is what launchers see).
    if (sd.failed() && self->exit_status_.ok()) {
      self->exit_status_ = absl::AbortedError(absl::StrCat("the job failed: ", sd.reason()));
    }
    self->done_ = true;
  };
  cb.scheduler_lost = [self](const absl::Status& st) {
    HPS_LOG(ERROR) << st.message();
    self->exit_status_ = st;
    self->done_ = true;
  };
  ASSIGN_OR_RETURN(s->control_, ControlClient::Connect(ctx, options, std::move(cb)));
  return s;
}

Server::~Server() {
  engines_.clear();
  store_.reset();
}

void Server::Stop() {
  stop_.store(true);
  waker_.Wake();
}

absl::Status Server::Run() {
  ASSIGN_OR_RETURN(wire::Welcome welcome, control_->Register(endpoint_));
  rank_ = welcome.rank();
  for (const wire::NodeInfo& w : welcome.workers()) {
    node_of_.push_back(welcome.num_nodes() > 0 ? w.node() : w.rank());
    worker_names_.push_back(
        absl::StrCat("worker ", w.rank(), " (host ", w.host(), ", pid ", w.pid(), ")"));
  }
  SetLogTag(absl::StrCat("server ", rank_));
  int threads = options_.server_threads;
  if (threads == 0) {
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
  }
  for (int i = 0; i < threads; ++i) {
    engines_.push_back(std::make_unique<Engine>(i, [this](uint64_t key, uint32_t part,
                                                          uint64_t round) {
      {
        absl::MutexLock lock(&done_mu_);
        sums_done_.push_back(SumDone{key, part, round});
      }
      waker_.Wake();
    }));
  }
  // A round collects one push per node: the local ranks of a node reduce first.
  std::vector<std::vector<int>> workers_of_node;
  for (int r = 0; r < static_cast<int>(node_of_.size()); ++r) {
    if (node_of_[r] < 0 || node_of_[r] >= static_cast<int>(node_of_.size())) continue;
    if (workers_of_node.size() <= static_cast<size_t>(node_of_[r])) {
      workers_of_node.resize(node_of_[r] + 1);
    }
    workers_of_node[node_of_[r]].push_back(r);
  }
  store_ = std::make_unique<KeyStore>(
      welcome.num_nodes() > 0 ? welcome.num_nodes() : welcome.num_workers(),
      [this](KeyStore::Reply r) {
        Message msg = Encode(r.peer, r.env, std::move(r.payload));
        if (auto s = data_->Send(msg); !s.ok()) {
          HPS_LOG(WARNING) << "reply to a departed worker dropped: " << s.message();
        }
      },
      [this](KeyStore::SumTask t) {
        engines_[EngineOf(t.key, t.part, engines_.size())]->Post(std::move(t));
      },
      std::move(workers_of_node));
  timeline_ = Timeline::Open(options_.timeline, absl::StrCat("server ", rank_), 1000 + rank_,
                             {"rounds: first to last push", "rounds: last push to replies"});
  if (timeline_) {
    store_->SetRoundHook([this](const std::string& name, uint32_t part, uint64_t round,
                                const KeyStore::RoundTimes& at) {
      const std::string what = absl::StrCat("'", name, "' partition ", part);
      const std::string args = absl::StrCat("\"round\": ", round);
      timeline_->Span(what, "waiting for the nodes' pushes", at.opened, at.all_arrived, 0,
                      args);
      if (!at.broadcast) {
        timeline_->Span(what, "sum", at.all_arrived, at.summed, 1, args);
        if (optimizer_.active()) {
          timeline_->Span(what, "optimizer update", at.summed, at.updated, 1, args);
        }
      }
      timeline_->Span(what, "replies", at.updated, absl::Now(), 1, args);
    });
  }
  store_->SetOptimizerHooks(
      [this](const wire::DataRequest& req, std::optional<Frame>* sum) -> absl::StatusOr<bool> {
        if (!optimizer_.active()) return false;
        return StartUpdate(req, sum);
      },
      [this](const wire::DataRequest& req, const void* value) {
        optimizer_.StoreBroadcast(req, value);
      });
  HPS_LOG(INFO) << "serving on " << endpoint_ << " with " << threads << " engine threads"
                << LauncherNote(options_);
  Poller poller;
  PollSpin spin(options_.spin);  // Options::spin
  const int data_idx = poller.Add(data_.get());
  const int ctl_idx = poller.Add(control_->socket());
  const int wake_idx = poller.AddFd(waker_.fd());
  while (!done_) {
    if (stop_.load()) {
      exit_status_ = absl::CancelledError("the server was stopped");
      break;
    }
    absl::Time now = absl::Now();
    absl::Time until = std::min(control_->NextTick(), next_stall_check_);
    if (options_.summary_every > absl::ZeroDuration()) until = std::min(until, next_summary_);
    ASSIGN_OR_RETURN(int n, poller.Poll(spin.Timeout(now, until - now)));
    spin.Polled(n);
    if (poller.Readable(wake_idx)) waker_.Drain();
    TakeSumsDone();
    if (poller.Readable(data_idx)) {
      // Bounded batch so the control link and replies are never starved.
      for (int i = 0; i < 256; ++i) {
        auto msg = data_->TryRecv();
        if (!msg.ok()) return msg.status();
        if (!*msg) break;
        HandleData(std::move(**msg));
      }
    }
    if (poller.Readable(ctl_idx)) control_->OnReadable();
    now = absl::Now();
    control_->Tick(now);
    if (options_.summary_every > absl::ZeroDuration() && now >= next_summary_) {
      if (next_summary_ != absl::InfinitePast()) LogSummary(now);
      summary_from_ = now;
      summary_base_ = store_->traffic();
      next_summary_ = now + options_.summary_every;
    }
    if (now >= next_stall_check_) {  // HYBRIDPS_STALL_WARNING_MS: name who rounds wait for
      store_->WarnStalls(now, options_.stall_warning, worker_names_);
      next_stall_check_ =
          now + std::clamp(options_.stall_warning, absl::Milliseconds(100), absl::Seconds(1));
    }
  }
  engines_.clear();  // Joins the engine threads.
  store_.reset();
  if (timeline_) timeline_->WriteAndLog(control_->clock_offset());
  return exit_status_;
}

void Server::LogSummary(absl::Time now) {
  const KeyStore::Traffic& t = store_->traffic();
  const double s = std::max(1e-9, absl::ToDoubleSeconds(now - summary_from_));
  std::vector<std::pair<uint64_t, int>> last;  // (rounds, node), the slowest first
  uint64_t total = 0;
  for (size_t n = 0; n < t.last_push.size(); ++n) {
    const uint64_t before = n < summary_base_.last_push.size() ? summary_base_.last_push[n] : 0;
    if (t.last_push[n] > before) last.emplace_back(t.last_push[n] - before, static_cast<int>(n));
    total += t.last_push[n] - before;
  }
  std::sort(last.rbegin(), last.rend());
  std::string slowest;
  for (size_t i = 0; i < last.size() && i < 3; ++i) {
    absl::StrAppend(&slowest, i ? ", " : "; the last push of a round: ",
                    store_->NodeLabel(last[i].second, worker_names_), " ",
                    absl::StrFormat("%.0f%%", 100.0 * last[i].first / total));
  }
  HPS_LOG(INFO) << absl::StrFormat("summary: %.1f rounds/s, in %.3f GB/s, out %.3f GB/s",
                                   (t.rounds - summary_base_.rounds) / s,
                                   (t.bytes_in - summary_base_.bytes_in) / s / 1e9,
                                   (t.bytes_out - summary_base_.bytes_out) / s / 1e9)
                << slowest;
}

void Server::TakeSumsDone() {
  std::vector<SumDone> done;
  std::vector<UpdateDone> updated;
  {
    absl::MutexLock lock(&done_mu_);
    done.swap(sums_done_);
    updated.swap(updates_done_);
  }
  for (const SumDone& d : done) store_->SumDone(d.key, d.part, d.round);
  for (UpdateDone& u : updated) {
    store_->UpdateDone(u.key, u.part, u.round, u.status, std::move(u.weights));
  }
}

absl::StatusOr<bool> Server::StartUpdate(const wire::DataRequest& req,
                                         std::optional<Frame>* sum) {
  const bool grouped = optimizer_.needs_tensor_norms() && req.num_parts() > 1;
  if (!grouped && (*sum)->size() < KeyStore::kInlineSumBytes) {
    // Small: update on this thread, like small sums, and let the round close as usual
    // with the new weights in the sum's buffer (no thread hand-off).
    ASSIGN_OR_RETURN(OptimizerHost::Job job, optimizer_.MakeJob(req, (*sum)->data()));
    RETURN_IF_ERROR(OptimizerHost::Run(job));
    return false;
  }
  std::shared_ptr<PendingUpdate> u;
  if (grouped) {
    std::shared_ptr<PendingUpdate>& g = groups_[req.key()];
    // A group of an earlier round is stale: the key store abandoned those rounds.
    if (!g || g->round != req.round()) g = std::make_shared<PendingUpdate>();
    u = g;
  } else {
    u = std::make_shared<PendingUpdate>();
  }
  u->round = req.round();
  u->num_parts = grouped ? req.num_parts() : 1;
  // The frame moves to the heap first: a small frame's bytes live inside it.
  u->sums.push_back(std::make_unique<Frame>(std::move(**sum)));
  sum->reset();
  u->parts.push_back(req.part());
  void* grad = u->sums.back()->data();
  if (u->error.ok()) {
    absl::Status s;
    if (u->job.rule) {
      s = optimizer_.AddToJob(u->job, req, grad);
    } else if (auto job = optimizer_.MakeJob(req, grad); job.ok()) {
      u->job = std::move(*job);
    } else {
      s = job.status();
    }
    if (!s.ok() && !grouped) return s;  // fails the round now
    if (!s.ok()) u->error = s;           // fails the whole group once it is complete
  }
  if (u->parts.size() < u->num_parts) return true;  // the group waits for the rest
  if (grouped) groups_.erase(req.key());
  PostUpdate(req.key(), std::move(u));
  return true;
}

void Server::PostUpdate(uint64_t key, std::shared_ptr<PendingUpdate> u) {
  const uint32_t first = *std::min_element(u->parts.begin(), u->parts.end());
  engines_[EngineOf(key, first, engines_.size())]->Post([this, key, u] {
    const absl::Status status = u->error.ok() ? OptimizerHost::Run(u->job) : u->error;
    {
      absl::MutexLock lock(&done_mu_);
      for (size_t i = 0; i < u->parts.size(); ++i) {
        updates_done_.push_back(
            UpdateDone{key, u->parts[i], u->round, status, std::move(*u->sums[i])});
      }
    }
    waker_.Wake();
  });
}

void Server::HandleOptimizer(const std::string& peer, uint64_t id,
                             const wire::OptimizerRequest& req) {
  wire::Envelope reply;
  reply.set_id(id);
  wire::OptimizerResponse* resp = reply.mutable_optimizer_response();
  absl::Status s;
  switch (req.body_case()) {
    case wire::OptimizerRequest::kConfigure:
      s = optimizer_.Configure(req.configure(), req.validate_only());
      if (s.ok() && !req.validate_only()) {
        groups_.clear();
        HPS_LOG(INFO) << "optimizer set: " << req.configure().rule();
      }
      break;
    case wire::OptimizerRequest::kSetParam:
      s = optimizer_.SetParam(req.set_param(), req.validate_only());
      break;
    case wire::OptimizerRequest::kDumpFrom:
      optimizer_.Dump(req.dump_from(), std::min<size_t>(64 << 20, options_.max_message_bytes / 4),
                      resp);
      break;
    case wire::OptimizerRequest::kLoad:
      s = optimizer_.Load(req.load());
      break;
    default:
      s = absl::InvalidArgumentError("an optimizer request without a body");
  }
  if (!s.ok()) {
    HPS_LOG(WARNING) << "optimizer request refused: " << s.message();
    reply = MakeError(id, s);
  }
  Message msg = Encode(peer, reply);
  if (auto st = data_->Send(msg); !st.ok()) {
    HPS_LOG(WARNING) << "optimizer reply to a departed worker dropped: " << st.message();
  }
}

void Server::Reject(const std::string& peer, uint64_t id, const absl::Status& why) {
  stats_.rejected.fetch_add(1, std::memory_order_relaxed);
  HPS_LOG_EVERY_SEC(WARNING, 1) << "rejected a message: " << why.message();
  if (peer.empty()) return;
  Message msg = Encode(peer, MakeError(id, why));
  (void)data_->Send(msg);
}

void Server::HandleData(Message raw) {
  stats_.requests.fetch_add(1, std::memory_order_relaxed);
  std::string peer_id = raw.empty() ? "" : std::string(raw[0].view());
  auto d = Decode(std::move(raw), true);
  if (!d.ok()) return Reject(peer_id, 0, d.status());
  wire::Envelope& env = d->env;
  // The job-token handshake (common/auth.h): nothing is kept for a connection, and
  // nothing else it sends is accepted, until its Auth checks out.
  auto it = peers_.find(d->peer);
  if (env.body_case() == wire::Envelope::kHello) {
    if (auto s = CheckHello(env.hello(), "this server"); !s.ok()) {
      return Reject(d->peer, env.id(), s);
    }
    if (env.hello().role() != wire::ROLE_WORKER) {
      return Reject(d->peer, env.id(),
                    absl::PermissionDeniedError("only workers talk to a server's data port"));
    }
    if (it != peers_.end()) return;
    wire::Envelope ack = gate_.Challenge(d->peer, env.hello());
    ack.set_id(env.id());
    Message msg = Encode(d->peer, ack);
    (void)data_->Send(msg);
    return;
  }
  if (env.body_case() == wire::Envelope::kAuth) {
    const wire::Auth& auth = env.auth();
    if (it != peers_.end()) {
      return Reject(d->peer, env.id(),
                    absl::FailedPreconditionError("this connection is authenticated"));
    }
    if (auth.role() != wire::ROLE_WORKER) {
      return Reject(d->peer, env.id(),
                    absl::PermissionDeniedError("only workers talk to a server's data port"));
    }
    if (absl::Status s = gate_.Verify(d->peer, auth); !s.ok()) {
      return Reject(d->peer, env.id(), s);
    }
    peers_[d->peer].node = auth.rank();  // a worker's data connection speaks for its node
    return;
  }
  if (it == peers_.end()) {
    return Reject(d->peer, env.id(), absl::PermissionDeniedError(
                                         "the job-token handshake (Hello, Auth) must come first"));
  }
  if (env.body_case() == wire::Envelope::kOptimizerRequest) {
    return HandleOptimizer(d->peer, env.id(), env.optimizer_request());
  }
  if (env.body_case() != wire::Envelope::kDataRequest) {
    return Reject(d->peer, env.id(), absl::InvalidArgumentError(absl::StrCat(
        "unexpected message (body ", env.body_case(), ") on the data port")));
  }
  const wire::DataRequest& req = env.data_request();
  if (auto s = ValidateDataRequest(req, d->payload); !s.ok()) {
    return Reject(d->peer, env.id(), absl::InvalidArgumentError(absl::StrCat(
        "tensor '", req.name(), "' partition ", req.part(), ": ", s.message())));
  }
  // A compressed push unpacks to 16 times its size: no more than a message may hold.
  if (req.compression() != 0 && req.count() > options_.max_message_bytes / sizeof(float)) {
    return Reject(d->peer, env.id(), absl::InvalidArgumentError(absl::StrCat(
        "tensor '", req.name(), "' partition ", req.part(), ": a compressed push of ",
        req.count(), " elements unpacks to more than a message may hold (",
        options_.max_message_bytes, " bytes)")));
  }
  stats_.data_requests.fetch_add(1, std::memory_order_relaxed);
  store_->Handle(d->peer, it->second.node, env.id(), req, std::move(d->payload));
}

}  // namespace hybridps
