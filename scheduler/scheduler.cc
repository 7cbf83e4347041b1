#include "scheduler/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/wire.h"

namespace hybridps {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const Context& ctx,
                                                             const Options& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Scheduler> s(new Scheduler(options));
  ASSIGN_OR_RETURN(s->socket_, Socket::Create(ctx, SocketType::kRouter, 64 << 20));
  RETURN_IF_ERROR(EncryptAsServer(*s->socket_, options, options.SchedulerEndpoint()));
  ASSIGN_OR_RETURN(s->endpoint_, s->socket_->Bind(options.SchedulerEndpoint()));
  if (!options.port_file.empty()) {
    auto colon = s->endpoint_.rfind(':');
    std::string port = s->endpoint_.substr(colon + 1);
    std::string tmp = options.port_file + ".tmp";
    {
      std::ofstream f(tmp);
      f << port << "\n";
      if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
    if (std::rename(tmp.c_str(), options.port_file.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ",
                                              options.port_file));
    }
  }
  return s;
}

Scheduler::~Scheduler() = default;

void Scheduler::Stop() {
  stop_.store(true);
  stop_waker_.Wake();
}

std::string Scheduler::NodeName(const Node& n) const {
  std::string name = absl::StrCat(WireRoleName(n.role), " ", n.rank);
  if (n.registered) absl::StrAppend(&name, " (host ", n.reg.host(), ", pid ", n.reg.pid(), ")");
  return name;
}

size_t Scheduler::Count(wire::NodeRole role, bool registered_only) const {
  size_t c = 0;
  for (const auto& [peer, n] : nodes_) {
    if (n.role == role && (!registered_only || n.registered)) ++c;
  }
  return c;
}

void Scheduler::Reply(const std::string& peer, const wire::Envelope& env) {
  Message msg = Encode(peer, env);
  if (auto s = socket_->Send(msg); !s.ok()) {
    HPS_LOG(DEBUG) << "reply to a departed peer dropped: " << s;
  }
}

void Scheduler::ReplyError(const std::string& peer, uint64_t id, const absl::Status& status) {
  Reply(peer, MakeError(id, status));
}

void Scheduler::Broadcast(const wire::Envelope& env) {
  for (const auto& [peer, n] : nodes_) {
    if (n.registered && !n.dead) Reply(peer, env);
  }
}

absl::Status Scheduler::Run() {
  SetLogTag("scheduler");
  HPS_LOG(INFO) << "listening on " << endpoint_ << " for " << options_.num_workers
                << " workers and " << options_.num_servers << " servers"
                << LauncherNote(options_);
  start_time_ = absl::Now();
  Poller poller;
  int sock_idx = poller.Add(socket_.get());
  poller.AddFd(stop_waker_.fd());
  while (!done_) {
    if (stop_.load()) {
      job_status_ = absl::CancelledError("the scheduler was stopped");
      wire::Envelope env;
      env.mutable_shutdown()->set_reason("the scheduler was stopped");
      env.mutable_shutdown()->set_failed(true);
      Broadcast(env);
      break;
    }
    absl::Time now = absl::Now();
    absl::Duration wait = options_.heartbeat_interval;
    for (const auto& w : kv_waiters_) wait = std::min(wait, w.deadline - now);
    auto n = poller.Poll(wait);
    if (!n.ok()) return n.status();
    if (poller.Readable(sock_idx)) {
      while (true) {
        auto msg = socket_->TryRecv();
        if (!msg.ok()) return msg.status();
        if (!*msg) break;
        HandleMessage(std::move(**msg));
      }
    }
    now = absl::Now();
    ServeKvWaiters(now);
    if (!welcomed_ && now - start_time_ > options_.start_timeout) {
      job_status_ = absl::DeadlineExceededError(absl::StrCat(
          "only ", Count(wire::ROLE_WORKER, true), " of ", options_.num_workers,
          " workers and ", Count(wire::ROLE_SERVER, true), " of ", options_.num_servers,
          " servers registered within ", absl::FormatDuration(options_.start_timeout)));
      HPS_LOG(ERROR) << job_status_.message();
      wire::Envelope env;
      env.mutable_shutdown()->set_reason(std::string(job_status_.message()));
      env.mutable_shutdown()->set_failed(true);
      Broadcast(env);
      break;
    }
    if (welcomed_) CheckHeartbeats(now);
    WarnBarrierStalls(now);
  }
  if (job_status_.ok()) {
    HPS_LOG(INFO) << "job finished";
  } else {
    HPS_LOG(ERROR) << "job failed: " << job_status_.message();
  }
  return job_status_;
}

void Scheduler::HandleMessage(Message raw) {
  auto d = Decode(std::move(raw), true);
  if (!d.ok()) {
    HPS_LOG_EVERY_SEC(WARNING, 1) << "rejected a message: " << d.status().message();
    return;
  }
  const std::string& peer = d->peer;
  wire::Envelope& env = d->env;
  auto it = nodes_.find(peer);
  // The job-token handshake (common/auth.h): nothing is kept for a connection, and
  // nothing else it sends is accepted, until its Auth checks out.
  if (env.body_case() == wire::Envelope::kHello) {
    if (auto s = CheckHello(env.hello(), "the scheduler"); !s.ok()) {
      HPS_LOG_EVERY_SEC(WARNING, 1) << "refused a connection: " << s.message();
      ReplyError(peer, env.id(), s);
      return;
    }
    if (it == nodes_.end()) {
      wire::Envelope ack = gate_.Challenge(peer, env.hello());
      ack.mutable_hello_ack()->set_time_us(absl::ToUnixMicros(absl::Now()));
      Reply(peer, ack);
    }
    return;
  }
  if (env.body_case() == wire::Envelope::kAuth) {
    const wire::Auth& auth = env.auth();
    absl::Status s = it != nodes_.end()
                         ? absl::FailedPreconditionError("this connection is authenticated")
                     : auth.role() != wire::ROLE_WORKER && auth.role() != wire::ROLE_SERVER
                         ? absl::PermissionDeniedError("only workers and servers connect")
                         : gate_.Verify(peer, auth);
    if (!s.ok()) {
      HPS_LOG_EVERY_SEC(WARNING, 1) << "refused a connection: " << s.message();
      ReplyError(peer, env.id(), s);
      return;
    }
    Node& n = nodes_[peer];
    n.peer = peer;
    n.role = auth.role();
    n.claimed_rank = auth.rank();
    n.last_seen = absl::Now();
    return;
  }
  if (it == nodes_.end()) {
    HPS_LOG_EVERY_SEC(WARNING, 1)
        << "rejected a message from a connection that has not authenticated";
    ReplyError(peer, env.id(), absl::PermissionDeniedError(
                                   "the job-token handshake (Hello, Auth) must come first"));
    return;
  }
  Node& node = it->second;
  node.last_seen = absl::Now();
  switch (env.body_case()) {
    case wire::Envelope::kRegister:
      HandleRegister(node, env.id(), env.register_());
      break;
    case wire::Envelope::kHeartbeat:
      env.mutable_heartbeat()->set_scheduler_us(absl::ToUnixMicros(absl::Now()));
      Reply(peer, env);
      break;
    case wire::Envelope::kBarrier:
      HandleBarrier(node, env.id(), env.barrier().group());
      break;
    case wire::Envelope::kFinalize: {
      node.finalized = true;
      wire::Envelope ack;
      ack.set_id(env.id());
      ack.mutable_finalize_ack();
      Reply(peer, ack);
      HPS_LOG(INFO) << NodeName(node) << " finished";
      if (node.role == wire::ROLE_WORKER) AnnounceLeft(node);
      CompleteBarriers();  // one it has not reached can no longer complete
      MaybeFinish();
      break;
    }
    case wire::Envelope::kKvSet: {
      const wire::KvSet& set = env.kv_set();
      auto old = kv_.find(set.key());
      const size_t held = old == kv_.end() ? 0 : old->first.size() + old->second.size();
      const size_t after = kv_bytes_ - held + set.key().size() + set.value().size();
      if (after > kMaxKvBytes) {
        ReplyError(peer, env.id(), absl::ResourceExhaustedError(absl::StrCat(
            "the scheduler's key-value store would hold ", after, " bytes with '", set.key(),
            "' (", set.value().size(), " bytes); it holds rendezvous data, at most ",
            kMaxKvBytes, " bytes")));
        break;
      }
      kv_bytes_ = after;
      kv_[set.key()] = set.value();
      wire::Envelope r;
      r.set_id(env.id());
      r.mutable_kv_reply()->set_found(true);
      Reply(peer, r);
      ServeKvWaiters(absl::Now());
      break;
    }
    case wire::Envelope::kKvGet: {
      wire::Envelope r;
      r.set_id(env.id());
      auto kv = kv_.find(env.kv_get().key());
      r.mutable_kv_reply()->set_found(kv != kv_.end());
      if (kv != kv_.end()) r.mutable_kv_reply()->add_values(kv->second);
      Reply(peer, r);
      break;
    }
    case wire::Envelope::kKvWait:
      HandleKvWait(node, env.id(), env.kv_wait());
      break;
    default:
      HPS_LOG_EVERY_SEC(WARNING, 1) << "rejected an unexpected message (body "
                                    << env.body_case() << ") from " << NodeName(node);
      ReplyError(peer, env.id(), absl::InvalidArgumentError("unexpected message"));
  }
}

void Scheduler::HandleRegister(Node& node, uint64_t id, const wire::Register& reg) {
  auto fail = [&](absl::Status s) {
    HPS_LOG_EVERY_SEC(WARNING, 1) << "refused a registration: " << s.message();
    ReplyError(node.peer, id, s);
    if (!node.registered) nodes_.erase(node.peer);  // a registered node stays registered
  };
  if (node.registered) {
    return fail(absl::FailedPreconditionError("this node has already registered"));
  }
  if (welcomed_) {
    return fail(absl::FailedPreconditionError(
        "the job has already started; a node cannot join it now"));
  }
  if (reg.role() != wire::ROLE_WORKER && reg.role() != wire::ROLE_SERVER) {
    return fail(absl::InvalidArgumentError("only workers and servers register"));
  }
  if (reg.role() != node.role || reg.requested_rank() != node.claimed_rank) {
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "this connection authenticated as ", WireRoleName(node.role), " ", node.claimed_rank,
        " and cannot register as ", WireRoleName(reg.role()), " ", reg.requested_rank())));
  }
  if (absl::Status s = CheckSettings(reg); !s.ok()) {
    // A process of this job (it has the job's token) that cannot take part: the job
    // cannot start, so every process hears why now instead of at the start timeout.
    fail(s);
    job_status_ = absl::Status(s.code(), absl::StrCat("the job cannot start: ", s.message()));
    wire::Envelope env;
    env.mutable_shutdown()->set_reason(std::string(job_status_.message()));
    env.mutable_shutdown()->set_failed(true);
    Broadcast(env);
    done_ = true;
    return;
  }
  const bool worker = reg.role() == wire::ROLE_WORKER;
  const size_t want = worker ? options_.num_workers : options_.num_servers;
  if (Count(reg.role(), true) >= want) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "already have ", want, " ", WireRoleName(reg.role()), "s; this job was started "
        "with HYBRIDPS_NUM_", worker ? "WORKERS" : "SERVERS", "=", want)));
  }
  if (reg.requested_rank() >= 0) {
    if (reg.requested_rank() >= static_cast<int>(want)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          WireRoleName(reg.role()), " rank ", reg.requested_rank(), " is out of range [0, ",
          want, ")")));
    }
    for (const auto& [p, n] : nodes_) {
      if (n.registered && n.role == reg.role() &&
          n.reg.requested_rank() == reg.requested_rank()) {
        return fail(absl::AlreadyExistsError(absl::StrCat(
            WireRoleName(reg.role()), " rank ", reg.requested_rank(),
            " is already taken by the process on ", n.reg.host(), " pid ", n.reg.pid())));
      }
    }
  }
  if (!worker && reg.data_endpoint().empty()) {
    return fail(absl::InvalidArgumentError("a server must give its data endpoint"));
  }
  node.role = reg.role();
  node.reg = reg;
  node.registered = true;
  node.register_id = id;
  node.rank = -1 - register_order_++;  // Registration order until ranks are given.
  HPS_LOG(INFO) << WireRoleName(reg.role()) << " registered from " << reg.host() << " pid "
                << reg.pid() << " (" << Count(wire::ROLE_WORKER, true) << "/"
                << options_.num_workers << " workers, " << Count(wire::ROLE_SERVER, true)
                << "/" << options_.num_servers << " servers)";
  if (Count(wire::ROLE_WORKER, true) == static_cast<size_t>(options_.num_workers) &&
      Count(wire::ROLE_SERVER, true) == static_cast<size_t>(options_.num_servers)) {
    AssignRanksAndWelcome();
  }
}

absl::Status Scheduler::CheckSettings(const wire::Register& reg) const {
  const std::string who =
      absl::StrCat("the ", WireRoleName(reg.role()), " on ", reg.host(), " pid ", reg.pid());
  if (!reg.has_settings()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " sent no job settings: it runs another version of hybridps than the scheduler"));
  }
  const wire::JobSettings& s = reg.settings();
  auto differs = [&](absl::string_view var, const auto& theirs, const auto& job,
                     absl::string_view whose) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " has ", var, "=", theirs, ", but ", whose, " has ", job, ": every process of "
        "a job needs the same value (hybridrun passes the environment it was started with "
        "to all of them)"));
  };
  const std::string scheduler = absl::StrCat("the job (its scheduler at ", endpoint_, ")");
  if (s.backend() != settings_.backend()) {
    return differs("HYBRIDPS_BACKEND", s.backend(), settings_.backend(), scheduler);
  }
  if (s.num_workers() != settings_.num_workers()) {
    return differs("HYBRIDPS_NUM_WORKERS", s.num_workers(), settings_.num_workers(), scheduler);
  }
  if (s.num_servers() != settings_.num_servers()) {
    return differs("HYBRIDPS_NUM_SERVERS", s.num_servers(), settings_.num_servers(), scheduler);
  }
  if (s.deployment() != settings_.deployment()) {
    return differs("HYBRIDPS_DEPLOYMENT", s.deployment(), settings_.deployment(), scheduler);
  }
  if (s.extra_servers() != settings_.extra_servers()) {
    return differs("HYBRIDPS_EXTRA_SERVERS", s.extra_servers(), settings_.extra_servers(),
                   scheduler);
  }
  // The workers' data layout: every worker as the first that registered. Servers take
  // what the workers send, but each refuses messages larger than its own limit.
  const Node* first_worker = nullptr;
  for (const auto& [peer, n] : nodes_) {
    if (n.registered && n.role == wire::ROLE_WORKER &&
        (first_worker == nullptr || n.rank > first_worker->rank)) {  // -1, -2, ...: order
      first_worker = &n;
    }
  }
  auto largest_frame = [](const wire::JobSettings& w) {
    Options o;
    o.partition_bytes = w.partition_bytes();
    o.wire_chunk_bytes = w.wire_chunk_bytes();
    return o.LargestDataFrame() + Options::kMessageHeadroom;
  };
  auto too_small = [&](const wire::Register& server, const wire::JobSettings& w,
                       absl::string_view workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the server on ", server.host(), " pid ", server.pid(), " accepts messages of at most ",
        server.settings().max_message_bytes(), " bytes (HYBRIDPS_MAX_MESSAGE_BYTES), but ",
        workers, " send", workers == "the workers" ? "" : "s", " data messages of up to ",
        largest_frame(w), " bytes (HYBRIDPS_WIRE_CHUNK_BYTES=", w.wire_chunk_bytes(),
        ", HYBRIDPS_PARTITION_BYTES=", w.partition_bytes(), ", with headers)"));
  };
  if (reg.role() == wire::ROLE_SERVER) {
    if (first_worker != nullptr &&
        reg.settings().max_message_bytes() < largest_frame(first_worker->reg.settings())) {
      return too_small(reg, first_worker->reg.settings(), "the workers");
    }
    return absl::OkStatus();
  }
  if (first_worker != nullptr) {
    const wire::Register& f = first_worker->reg;
    const std::string whose =
        absl::StrCat("the job's first worker (on ", f.host(), " pid ", f.pid(), ")");
    if (s.partition_bytes() != f.settings().partition_bytes()) {
      return differs("HYBRIDPS_PARTITION_BYTES", s.partition_bytes(),
                     f.settings().partition_bytes(), whose);
    }
    if (s.wire_chunk_bytes() != f.settings().wire_chunk_bytes()) {
      return differs("HYBRIDPS_WIRE_CHUNK_BYTES", s.wire_chunk_bytes(),
                     f.settings().wire_chunk_bytes(), whose);
    }
    if (s.gpu_local_reduce() != f.settings().gpu_local_reduce()) {
      return differs("HYBRIDPS_GPU_LOCAL_REDUCE", s.gpu_local_reduce(),
                     f.settings().gpu_local_reduce(), whose);
    }
    return absl::OkStatus();
  }
  for (const auto& [peer, n] : nodes_) {
    if (n.registered && n.role == wire::ROLE_SERVER &&
        n.reg.settings().max_message_bytes() < largest_frame(s)) {
      return too_small(n.reg, s, who);
    }
  }
  return absl::OkStatus();
}

// Workers with local_size > 1 that name the same node form one node; a worker with
// local_size 1 is a node of its own. Nodes are numbered in the order of their lowest rank.
// (Workers check that each node is complete and consistent: see worker/ps/local/local_reduce.cc.)
std::vector<int> Scheduler::GroupNodes(const std::vector<Node*>& workers) {
  std::vector<std::string> group(options_.num_workers);
  for (Node* n : workers) {
    group[n->rank] = n->reg.local_size() > 1
                         ? absl::StrCat("node:", n->reg.node(), "/", n->reg.local_size())
                         : absl::StrCat("rank:", n->rank);
  }
  std::vector<int> node_of(options_.num_workers, -1);
  absl::flat_hash_map<std::string, int> index;
  for (int r = 0; r < options_.num_workers; ++r) {
    auto [it, inserted] = index.emplace(group[r], static_cast<int>(index.size()));
    node_of[r] = it->second;
  }
  return node_of;
}

void Scheduler::AssignRanksAndWelcome() {
  std::vector<Node*> workers, servers;
  for (auto& [p, n] : nodes_) {
    if (!n.registered) continue;
    (n.role == wire::ROLE_WORKER ? workers : servers).push_back(&n);
  }
  auto by_order = [](Node* a, Node* b) { return a->rank > b->rank; };  // -1, -2, ...
  std::sort(workers.begin(), workers.end(), by_order);
  std::sort(servers.begin(), servers.end(), by_order);
  // Requested ranks first, the others fill the gaps in order of registration.
  auto assign = [](std::vector<Node*>& nodes) {
    std::vector<bool> taken(nodes.size(), false);
    for (Node* n : nodes) {
      if (n->reg.requested_rank() >= 0) taken[n->reg.requested_rank()] = true;
    }
    size_t next = 0;
    for (Node* n : nodes) {
      if (n->reg.requested_rank() >= 0) {
        n->rank = n->reg.requested_rank();
        continue;
      }
      while (taken[next]) ++next;
      n->rank = static_cast<int>(next);
      taken[next] = true;
    }
  };
  assign(workers);
  assign(servers);
  wire::Welcome w;
  const std::vector<int> node_of = GroupNodes(workers);
  w.set_num_nodes(node_of.empty() ? 0 : *std::max_element(node_of.begin(), node_of.end()) + 1);
  w.set_job_id(absl::Uniform<uint64_t>(absl::BitGen()) | 1);
  w.set_num_workers(options_.num_workers);
  w.set_num_servers(options_.num_servers);
  w.mutable_workers()->Reserve(options_.num_workers);
  for (int i = 0; i < options_.num_workers; ++i) w.add_workers();
  for (int i = 0; i < options_.num_servers; ++i) w.add_servers();
  // HYBRIDPS_GPU_LOCAL_REDUCE per node (the workers agree on the setting: CheckSettings):
  // "auto" is NCCL where each of the node's ranks sees a GPU per local rank.
  std::vector<bool> node_nccl(w.num_nodes(), true);
  for (Node* n : workers) {
    const int local_size = std::max(1, n->reg.local_size());
    const std::string& mode = n->reg.settings().gpu_local_reduce();
    const bool nccl = local_size > 1 && (mode == "nccl" || (mode == "auto" &&
                                                            n->reg.nccl_gpus() >= local_size));
    if (!nccl) node_nccl[node_of[n->rank]] = false;
  }
  for (Node* n : workers) {
    auto* info = w.mutable_workers(n->rank);
    info->set_gpu_reduce_nccl(node_nccl[node_of[n->rank]]);
    info->set_role(wire::ROLE_WORKER);
    info->set_rank(n->rank);
    info->set_host(n->reg.host());
    info->set_pid(n->reg.pid());
    info->set_node(node_of[n->rank]);
    info->set_local_rank(n->reg.local_size() > 1 ? n->reg.local_rank() : 0);
    info->set_local_size(std::max(1, n->reg.local_size()));
  }
  for (Node* n : servers) {
    auto* info = w.mutable_servers(n->rank);
    info->set_role(wire::ROLE_SERVER);
    info->set_rank(n->rank);
    info->set_endpoint(n->reg.data_endpoint());
    info->set_host(n->reg.host());
    info->set_pid(n->reg.pid());
  }
  absl::Time now = absl::Now();
  for (auto& [p, n] : nodes_) {
    if (!n.registered) continue;
    wire::Envelope env;
    env.set_id(n.register_id);
    *env.mutable_welcome() = w;
    env.mutable_welcome()->set_rank(n.rank);
    n.last_seen = now;
    Reply(p, env);
  }
  welcomed_ = true;
  HPS_LOG(INFO) << "all " << options_.num_workers << " workers and " << options_.num_servers
                << " servers registered; job started";
}

void Scheduler::HandleBarrier(Node& node, uint64_t id, wire::BarrierGroup group) {
  if (!welcomed_ || group == wire::GROUP_NONE || group > wire::GROUP_ALL) {
    ReplyError(node.peer, id, absl::InvalidArgumentError("bad barrier request"));
    return;
  }
  if (!job_status_.ok()) {
    ReplyError(node.peer, id, job_status_);
    return;
  }
  if (barriers_[group].empty()) barrier_clock_[group] = {absl::Now(), absl::InfinitePast()};
  barriers_[group][node.peer] = id;
  CompleteBarriers();
}

void Scheduler::CompleteBarriers() {
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    auto& arrived = it->second;
    bool complete = true;
    absl::Status impossible = job_status_;  // a member left without reaching it
    for (const auto& [p, n] : nodes_) {
      if (!n.registered) continue;
      bool member = (it->first & wire::GROUP_WORKERS && n.role == wire::ROLE_WORKER) ||
                    (it->first & wire::GROUP_SERVERS && n.role == wire::ROLE_SERVER);
      if (member && !arrived.count(p)) {
        complete = false;
        if (n.finalized && impossible.ok()) {
          impossible = absl::FailedPreconditionError(absl::StrCat(
              "barrier: ", NodeName(n), " left the job (shut down its store) without "
              "reaching it; it cannot complete"));
        }
      }
    }
    if (!complete && impossible.ok()) {
      ++it;
      continue;
    }
    for (const auto& [p, id] : arrived) {
      if (impossible.ok()) {
        wire::Envelope r;
        r.set_id(id);
        r.mutable_barrier_done();
        Reply(p, r);
      } else {
        ReplyError(p, id, impossible);
      }
    }
    barrier_clock_.erase(it->first);
    it = barriers_.erase(it);
  }
}

void Scheduler::WarnBarrierStalls(absl::Time now) {
  for (auto& [group, arrived] : barriers_) {
    auto& [opened, warned] = barrier_clock_[group];
    if (now - opened < options_.stall_warning || now - warned < options_.stall_warning) {
      continue;
    }
    warned = now;
    std::vector<std::string> missing;
    for (const auto& [p, n] : nodes_) {
      const bool member = (group & wire::GROUP_WORKERS && n.role == wire::ROLE_WORKER) ||
                          (group & wire::GROUP_SERVERS && n.role == wire::ROLE_SERVER);
      if (n.registered && member && !arrived.count(p)) missing.push_back(NodeName(n));
    }
    const std::string text = absl::StrCat(
        "the barrier has waited ",
        absl::FormatDuration(absl::Trunc(now - opened + absl::Milliseconds(50),
                                         absl::Milliseconds(100))),
        " for ", absl::StrJoin(missing, ", "));
    HPS_LOG(WARNING) << text;
    for (const auto& [p, id] : arrived) {
      wire::Envelope r;
      r.set_id(id);
      r.mutable_stall_notice()->set_text(text);
      Reply(p, r);
    }
  }
}

void Scheduler::HandleKvWait(Node& node, uint64_t id, const wire::KvWait& wait) {
  if (kv_waiters_.size() >= kMaxKvWaiters) {
    ReplyError(node.peer, id, absl::ResourceExhaustedError(absl::StrCat(
        "the scheduler already holds ", kMaxKvWaiters, " key-value waits")));
    return;
  }
  KvWaiter w{node.peer, id, {wait.keys().begin(), wait.keys().end()},
             absl::Now() + absl::Milliseconds(std::max<int64_t>(0, wait.timeout_ms()))};
  kv_waiters_.push_back(std::move(w));
  ServeKvWaiters(absl::Now());
}

void Scheduler::ServeKvWaiters(absl::Time now) {
  for (auto it = kv_waiters_.begin(); it != kv_waiters_.end();) {
    std::vector<std::string> missing;
    for (const auto& k : it->keys) {
      if (!kv_.count(k)) missing.push_back(k);
    }
    if (missing.empty()) {
      wire::Envelope r;
      r.set_id(it->id);
      r.mutable_kv_reply()->set_found(true);
      for (const auto& k : it->keys) r.mutable_kv_reply()->add_values(kv_[k]);
      Reply(it->peer, r);
    } else if (now >= it->deadline) {
      ReplyError(it->peer, it->id, absl::DeadlineExceededError(absl::StrCat(
          "rendezvous keys never set: ", absl::StrJoin(missing, ", "))));
    } else {
      ++it;
      continue;
    }
    it = kv_waiters_.erase(it);
  }
}

void Scheduler::CheckHeartbeats(absl::Time now) {
  for (auto& [p, n] : nodes_) {
    if (!n.registered || n.dead || n.finalized) continue;
    if (now - n.last_seen > options_.heartbeat_timeout) {
      DeclareDead(n, absl::StrCat("no heartbeat for ", absl::FormatDuration(now - n.last_seen)));
    }
  }
}

void Scheduler::DeclareDead(Node& node, const std::string& reason) {
  node.dead = true;
  std::string what = absl::StrCat(NodeName(node), " died: ", reason);
  HPS_LOG(ERROR) << what;
  if (job_status_.ok()) job_status_ = absl::UnavailableError(what);
  wire::Envelope env;
  auto* f = env.mutable_node_failed();
  f->set_role(node.role);
  f->set_rank(node.rank);
  f->set_reason(what);
  Broadcast(env);
  CompleteBarriers();
  MaybeFinish();
}

bool Scheduler::WorkersRunning() const {
  for (const auto& [p, n] : nodes_) {
    if (n.registered && n.role == wire::ROLE_WORKER && !n.finalized && !n.dead) return true;
  }
  return false;
}

void Scheduler::AnnounceLeft(const Node& node) {
  if (!WorkersRunning()) return;  // the last worker: MaybeFinish ends the job
  wire::Envelope env;
  auto* l = env.mutable_node_left();
  l->set_rank(node.rank);
  l->set_reason(absl::StrCat(NodeName(node), " left the job (shut down its store)"));
  Broadcast(env);
}

void Scheduler::MaybeFinish() {
  if (WorkersRunning()) return;
  wire::Envelope env;
  env.mutable_shutdown()->set_reason(job_status_.ok() ? "all workers finished"
                                                       : std::string(job_status_.message()));
  env.mutable_shutdown()->set_failed(!job_status_.ok());
  Broadcast(env);
  done_ = true;
}

}  // namespace hybridps
