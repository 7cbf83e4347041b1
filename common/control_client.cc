#include "common/control_client.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/status.h"
#include "common/wire.h"

namespace hybridps {

absl::StatusOr<std::unique_ptr<ControlClient>> ControlClient::Connect(const Context& ctx,
                                                                      const Options& options,
                                                                      Callbacks callbacks) {
  std::unique_ptr<ControlClient> c(new ControlClient(options, std::move(callbacks)));
  ASSIGN_OR_RETURN(c->socket_, Socket::Create(ctx, SocketType::kDealer, 64 << 20));
  RETURN_IF_ERROR(EncryptAsClient(*c->socket_, options, options.SchedulerEndpoint()));
  RETURN_IF_ERROR(c->socket_->Connect(options.SchedulerEndpoint()));
  return c;
}

void ControlClient::SampleClock(absl::Time sent, absl::Time received,
                                absl::Time scheduler) {
  // The scheduler read its clock somewhere between our send and our receipt: halfway,
  // to within half the round trip, so the shortest round trip gives the best estimate;
  // among the last kClockSamples only, so that the estimate follows the clocks' drift.
  const absl::Duration rtt = received - sent;
  if (rtt < absl::ZeroDuration()) return;
  clock_samples_.emplace_back(rtt, absl::ToInt64Microseconds(sent + rtt / 2 - scheduler));
  if (clock_samples_.size() > kClockSamples) clock_samples_.pop_front();
  const auto best = std::min_element(clock_samples_.begin(), clock_samples_.end());
  clock_offset_.store(best->second, std::memory_order_relaxed);
}

void ControlClient::Send(const wire::Envelope& env) {
  Message msg = Encode("", env);
  if (auto s = socket_->Send(msg); !s.ok()) {
    HPS_LOG(WARNING) << "send to scheduler failed: " << s;
  }
}

absl::StatusOr<wire::Envelope> ControlClient::NextBeforeWelcome(absl::Time deadline) {
  Poller poller;
  poller.Add(socket_.get());
  while (true) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no answer from the scheduler at ", options_.SchedulerEndpoint(), " within ",
          absl::FormatDuration(options_.start_timeout), " (is it running, and have all ",
          options_.num_workers, " workers and ", options_.num_servers,
          " servers started? A scheduler of another HYBRIDPS_ENCRYPT setting, or one that "
          "encrypts with another job's token, does not answer either)"));
    }
    ASSIGN_OR_RETURN(int n, poller.Poll(std::min(deadline - now, absl::Milliseconds(200))));
    if (n == 0) continue;
    ASSIGN_OR_RETURN(auto msg, socket_->TryRecv());
    if (!msg) continue;
    auto d = Decode(std::move(*msg), false);
    if (!d.ok()) {
      HPS_LOG_EVERY_SEC(WARNING, 1) << "rejected a message from the scheduler: " << d.status();
      continue;
    }
    last_heard_ = absl::Now();
    return std::move(d->env);
  }
}

absl::Status ControlClient::Authenticate(absl::Time deadline) {
  const ClientHandshake hs(JobKey(options_.job_token), ToWire(options_.role), options_.rank);
  const absl::Time sent = absl::Now();
  Send(hs.Hello());
  const std::string scheduler = absl::StrCat("the scheduler at ", options_.SchedulerEndpoint());
  while (true) {
    ASSIGN_OR_RETURN(wire::Envelope env, NextBeforeWelcome(deadline));
    if (env.body_case() == wire::Envelope::kError) {
      absl::Status refused = FromWire(env.error());
      return absl::Status(refused.code(),
                          absl::StrCat(scheduler, " refused this process: ", refused.message()));
    }
    if (env.body_case() != wire::Envelope::kHelloAck) continue;
    ASSIGN_OR_RETURN(wire::Envelope auth, hs.Answer(env.hello_ack(), scheduler));
    Send(auth);
    if (env.hello_ack().time_us() != 0) {
      SampleClock(sent, absl::Now(), absl::FromUnixMicros(env.hello_ack().time_us()));
    }
    return absl::OkStatus();
  }
}

absl::StatusOr<wire::Welcome> ControlClient::Register(const std::string& data_endpoint) {
  // A little longer than the scheduler's own start timeout, so that when the job does not
  // come together, its explanation (who is missing) arrives before we give up.
  const absl::Time deadline =
      absl::Now() + options_.start_timeout + options_.heartbeat_timeout;
  RETURN_IF_ERROR(Authenticate(deadline));
  wire::Envelope env;
  env.set_id(next_id_++);
  auto* r = env.mutable_register_();
  r->set_role(ToWire(options_.role));
  r->set_requested_rank(options_.rank);
  r->set_data_endpoint(data_endpoint);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  r->set_host(host);
  r->set_pid(static_cast<uint32_t>(getpid()));
  r->set_local_rank(options_.local_rank);
  r->set_local_size(options_.local_size);
  r->set_node(options_.node_id.empty() ? std::string(host) : options_.node_id);
  r->set_nccl_gpus(options_.nccl_gpus);
  *r->mutable_settings() = JobSettingsOf(options_);
  Send(env);
  while (true) {
    ASSIGN_OR_RETURN(wire::Envelope reply, NextBeforeWelcome(deadline));
    switch (reply.body_case()) {
      case wire::Envelope::kWelcome:
        next_heartbeat_ = absl::Now();
        return reply.welcome();
      case wire::Envelope::kError:
        return FromWire(reply.error());
      case wire::Envelope::kShutdown:
        return absl::AbortedError(
            absl::StrCat("the scheduler shut the job down: ", reply.shutdown().reason()));
      default:
        HPS_LOG(DEBUG) << "ignored before welcome: " << reply.body_case();
    }
  }
}

void ControlClient::Request(wire::Envelope env, absl::Time deadline, Reply on_reply) {
  if (lost_) {
    on_reply(absl::UnavailableError("the scheduler is unreachable"));
    return;
  }
  uint64_t id = next_id_++;
  env.set_id(id);
  pending_.emplace(id, Pending{deadline, std::move(on_reply), {}});
  Send(env);
}

void ControlClient::OnReadable() {
  while (true) {
    auto msg = socket_->TryRecv();
    if (!msg.ok()) {
      HPS_LOG(WARNING) << "receive from scheduler failed: " << msg.status();
      return;
    }
    if (!*msg) return;
    auto d = Decode(std::move(**msg), false);
    if (!d.ok()) {
      HPS_LOG_EVERY_SEC(WARNING, 1) << "rejected a message from the scheduler: " << d.status();
      continue;
    }
    last_heard_ = absl::Now();
    Handle(std::move(d->env));
  }
}

void ControlClient::Handle(wire::Envelope env) {
  switch (env.body_case()) {
    case wire::Envelope::kHeartbeat:
      if (env.heartbeat().scheduler_us() != 0 && env.heartbeat().sent_us() != 0) {
        const absl::Time sent = absl::FromUnixMicros(env.heartbeat().sent_us());
        SampleClock(sent, absl::Now(), absl::FromUnixMicros(env.heartbeat().scheduler_us()));
      }
      return;
    case wire::Envelope::kHelloAck:
      return;
    case wire::Envelope::kNodeFailed:
      if (callbacks_.node_failed) callbacks_.node_failed(env.node_failed());
      return;
    case wire::Envelope::kNodeLeft:
      if (callbacks_.node_left) callbacks_.node_left(env.node_left());
      return;
    case wire::Envelope::kShutdown:
      if (callbacks_.shutdown) callbacks_.shutdown(env.shutdown());
      return;
    default:
      break;
  }
  auto it = pending_.find(env.id());
  if (it == pending_.end()) {
    HPS_LOG(DEBUG) << "reply to unknown request " << env.id() << " dropped";
    return;
  }
  if (env.body_case() == wire::Envelope::kStallNotice) {  // not the reply: it still waits
    HPS_LOG(WARNING) << "the scheduler says: " << env.stall_notice().text();
    it->second.stall = env.stall_notice().text();
    return;
  }
  Reply reply = std::move(it->second.reply);
  pending_.erase(it);
  if (env.body_case() == wire::Envelope::kError) {
    reply(FromWire(env.error()));
  } else {
    reply(std::move(env));
  }
}

void ControlClient::Tick(absl::Time now) {
  if (lost_) return;
  if (now >= next_heartbeat_) {
    wire::Envelope hb;
    hb.mutable_heartbeat()->set_sent_us(absl::ToUnixMicros(now));
    Send(hb);
    next_heartbeat_ = now + options_.heartbeat_interval;
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now >= it->second.deadline) {
      Reply reply = std::move(it->second.reply);
      const std::string stall = std::move(it->second.stall);
      it = pending_.erase(it);
      reply(absl::DeadlineExceededError(
          absl::StrCat("no reply from the scheduler before the deadline",
                       stall.empty() ? "" : absl::StrCat(": ", stall))));
    } else {
      ++it;
    }
  }
  if (last_heard_ != absl::InfinitePast() && now - last_heard_ > options_.heartbeat_timeout) {
    lost_ = true;
    // What is still queued for the dead scheduler (heartbeats) must not hold the process
    // at exit for the socket's linger: it is to end within the heartbeat timeout.
    int zero = 0;
    zmq_setsockopt(socket_->raw(), ZMQ_LINGER, &zero, sizeof zero);
    absl::Status s = absl::UnavailableError(absl::StrCat(
        "the scheduler at ", options_.SchedulerEndpoint(), " has not answered for ",
        absl::FormatDuration(now - last_heard_), " (heartbeat timeout ",
        absl::FormatDuration(options_.heartbeat_timeout), ")"));
    FailAll(s);
    if (callbacks_.scheduler_lost) callbacks_.scheduler_lost(s);
  }
}

absl::Time ControlClient::NextTick() const {
  absl::Time t = next_heartbeat_;
  for (const auto& [id, p] : pending_) t = std::min(t, p.deadline);
  return t;
}

void ControlClient::FailAll(const absl::Status& status) {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending) p.reply(status);
}

}  // namespace hybridps
