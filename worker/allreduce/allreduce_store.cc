#include "worker/allreduce/allreduce_store.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/transport.h"
#include "worker/allreduce/allreduce_op.h"
#include "worker/comm/gloo_comm.h"
#include "worker/node/node_layout.h"
#if HYBRIDPS_WITH_NCCL
#include "worker/comm/nccl_comm.h"
#endif

namespace hybridps {

namespace nego = negotiation;



AllreduceStore::AllreduceStore(std::shared_ptr<Context> ctx, const Options& options)
    : ctx_(std::move(ctx)),
      options_(options),
      idle_tick_(std::clamp(std::min(options.op_timeout, options.stall_warning) / 10,
                            absl::Milliseconds(5), absl::Milliseconds(100))),
      gloo_timeout_(std::min(options.op_timeout, 2 * options.heartbeat_timeout)),
      slot_bytes_(kMinSlotBytes) {}

absl::StatusOr<std::unique_ptr<AllreduceStore>> AllreduceStore::Create(
    std::shared_ptr<Context> ctx, const Options& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<AllreduceStore> s(new AllreduceStore(std::move(ctx), options));
  RETURN_IF_ERROR(s->Start());
  return s;
}

namespace {

// Gloo writes to its TCP pairs without MSG_NOSIGNAL: when a peer dies, the next write
// raises SIGPIPE, whose default action kills this process before anything can report
// which peer died. Ignore it (only when nobody installed a handler; Python already
// ignores it), so the write fails with EPIPE and becomes an error naming the peer.
void IgnoreSigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

absl::Status AllreduceStore::Start() {
  IgnoreSigpipe();
  ControlClient::Callbacks cb;
  cb.node_failed = [this](const wire::NodeFailed& f) {
    Break(absl::UnavailableError(f.reason()));
  };
  cb.shutdown = [this](const wire::Shutdown& sd) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;  // the scheduler's answer to everyone finishing
    BreakLocked(absl::AbortedError(absl::StrCat("the job was shut down: ", sd.reason())));
  };
  cb.scheduler_lost = [this](const absl::Status& s) { Break(s); };
  ASSIGN_OR_RETURN(control_, ControlClient::Connect(*ctx_, options_, std::move(cb)));
  ASSIGN_OR_RETURN(wire::Welcome welcome, control_->Register(""));
  rank_ = welcome.rank();
  num_workers_ = welcome.num_workers();
  SetLogTag(absl::StrCat("worker ", rank_));
  cross_ = CrossPlaceOf(welcome, rank_);
  timeline_ = Timeline::OpenOrDormant(options_.timeline, absl::StrCat("worker ", rank_),
                                       100 + rank_,
                                       {"operations", "negotiation, collectives",
                                        "waiting for data"});
  // Gloo binds the scheduler-facing address: loopback for a local job.
  in_addr ip{};
  if (!options_.interface.empty()) {
    (inet_pton(AF_INET, options_.interface.c_str(), &ip) == 1 ? gloo_host_ : gloo_iface_) =
        options_.interface;
  } else {
    const std::string sched = EndpointHost(options_.SchedulerEndpoint());
    if (sched.empty() || absl::StartsWith(sched, "127.") || sched == "localhost") {
      gloo_host_ = "127.0.0.1";
    } else {
      // This host's name, resolved here: Gloo's own lookup of a name that has no address
      // of this host fails, or crashes, inside the library.
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      bool loopback_only = false;
      absl::StatusOr<std::string> address = LocalAddressOf(host, &loopback_only);
      if (!address.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "dist_allreduce cannot choose the address its peers connect to: ",
            address.status().message(), "; set HYBRIDPS_INTERFACE (hybridrun "
            "--network-interface) to the interface or address the workers reach each other "
            "on"));
      }
      // A loopback address serves a job on this host alone: the workers on other hosts
      // would never connect.
      for (const wire::NodeInfo& w : welcome.workers()) {
        if (!loopback_only || w.host() == host) continue;
        return absl::FailedPreconditionError(absl::StrCat(
            "dist_allreduce cannot choose the address its peers connect to: this host's "
            "name '", host, "' resolves to the loopback address ", *address, ", which "
            "worker ", w.rank(), " on host ", w.host(), " cannot reach; set "
            "HYBRIDPS_INTERFACE (hybridrun --network-interface) to the interface or "
            "address the workers reach each other on"));
      }
      gloo_host_ = *address;
    }
  }
  SchedulerStore store(control_.get(), "gloo/", absl::Now() + options_.start_timeout);
  auto comm = GlooComm::Connect(rank_, num_workers_, gloo_host_, gloo_iface_, store,
                                options_.start_timeout);
  if (!comm.ok()) {
    return store.status().ok() ? comm.status() : store.status();
  }
  comm_ = std::move(*comm);
  cpu_ = NewGlooCollectives(comm_.get());
  RETURN_IF_ERROR(ShareFusionSettings());
  RETURN_IF_ERROR(SetUpSharedMemory(welcome));
  cpu_->SetDirectBytes(direct_allreduce_bytes_);
#if HYBRIDPS_WITH_NCCL
  RETURN_IF_ERROR(ShareNcclId());
#endif
  gate_->Open(this);
  io_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hps-ar-io");
    IoLoop();
  });
  // With the I/O thread heartbeating (the probe takes seconds on slow links), and before
  // the executor, whose rounds would interleave with the probe's collectives.
  if (absl::Status s = ProbeEager(welcome); !s.ok()) {
    s = ExplainFailure(s);  // a peer that died: the scheduler names it
    io_exit_.store(true);
    io_waker_.Wake();
    io_thread_.join();
    return s;
  }
  exec_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hps-ar-exec");
    ExecLoop();
  });
  HPS_LOG(INFO) << "joined the job as worker " << rank_ << " of " << num_workers_
                << " (dist_allreduce, gloo on " << (gloo_iface_.empty() ? gloo_host_ : gloo_iface_)
                << (cpu_->kind() == CpuCollectives::Kind::kSharedMemory
                        ? "; CPU allreduces in shared memory"
                    : cpu_->kind() == CpuCollectives::Kind::kHierarchical
                        ? "; CPU allreduces hierarchical: shared memory in the node, gloo "
                          "between nodes"
                        : "")
                << ")" << LauncherNote(options_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> AllreduceStore::FromRankZero(
    const std::string& prefix, const std::function<std::string()>& make) {
  SchedulerStore store(control_.get(), prefix, absl::Now() + options_.start_timeout);
  try {
    if (rank_ == 0) {
      std::string value = make();
      store.set("rank0", std::vector<char>(value.begin(), value.end()));
      return value;
    }
    std::vector<char> v = store.get("rank0");
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    return store.status().ok() ? absl::UnavailableError(e.what()) : store.status();
  }
}

absl::Status AllreduceStore::SetUpSharedMemory(const wire::Welcome& welcome) {
  // Rank 0's "<local_allreduce> <hierarchical_allreduce>", e.g. "1 0".
  ASSIGN_OR_RETURN(std::string wanted, FromRankZero("local_allreduce/", [&] {
                     return absl::StrCat(options_.local_allreduce, " ",
                                         options_.hierarchical_allreduce);
                   }));
  if (!absl::StartsWith(wanted, "1 ") || num_workers_ < 2) return absl::OkStatus();
  // Every rank decides from the same welcome which case the job is; a rank that cannot
  // set its part up tells the others in the exchange below. One malformed node sends the
  // whole job through Gloo: every rank checks every node (once: the check depends on the
  // node only), so that all decide alike.
  if (welcome.workers_size() != num_workers_) return absl::OkStatus();  // Gloo, on every rank
  absl::flat_hash_set<int> checked;
  for (int r = 0; r < num_workers_; ++r) {
    if (!checked.insert(welcome.num_nodes() > 0 ? welcome.workers(r).node() : r).second) {
      continue;
    }
    if (auto bad = NodeLayoutFromWelcome(welcome, r); !bad.ok()) {
      if (rank_ == 0) {
        HPS_LOG(WARNING) << "CPU allreduces go through Gloo, not shared memory: "
                         << bad.status().message();
      }
      return absl::OkStatus();
    }
  }
  auto layout = NodeLayoutFromWelcome(welcome, rank_);
  if (!layout.ok()) return absl::OkStatus();
  const bool one_node = layout->num_nodes == 1 && layout->local_size == num_workers_;
  int largest_node = 1;
  for (const wire::NodeInfo& w : welcome.workers()) {
    largest_node = std::max(largest_node, w.local_size());
  }
  const bool hierarchical = !one_node && wanted == "1 1" && largest_node > 1;
  if (!one_node && !hierarchical) return absl::OkStatus();  // Gloo (the same on every rank)
  // A tensor larger than a region goes chunk by chunk, and in a hierarchical job the
  // leaders allreduce each chunk: every node cuts at the same sizes, from the largest node.
  const size_t per_region = std::clamp<size_t>(
      (size_t{64} << 20) / ((hierarchical ? largest_node : layout->local_size) + 1) / 4096 *
          4096,
      size_t{1} << 20, size_t{8} << 20);
  std::string why;
  std::unique_ptr<ShmAllreduce> node;
  if (layout->local_size > 1) {
    // Per job and node: the job id, the node, and the pid of local rank 0 (the creator).
    const std::string name =
        absl::StrFormat("/hps-ar-%016x-n%d-%u", layout->job_id, layout->node,
                        layout->pids.empty() ? 0u : layout->pids[0]);
    auto shm = ShmAllreduce::Open(name, layout->local_rank, layout->local_size, per_region,
                                  absl::Now() + options_.start_timeout);
    if (shm.ok()) {
      node = std::move(*shm);
    } else {
      why = std::string(shm.status().message());
    }
  }
  auto all = comm_->AllgatherBytes(why.empty() ? "ok" : why, kMinSlotBytes,
                                   options_.start_timeout);
  if (!all.ok()) return all.status();
  for (int r = 0; r < num_workers_; ++r) {
    if ((*all)[r] == "ok") continue;
    HPS_LOG(WARNING) << "CPU allreduces go through Gloo, not shared memory: worker " << r
                     << " could not set it up (" << (*all)[r] << ")";
    return absl::OkStatus();
  }
  if (!hierarchical) {
    cpu_ = NewSharedMemoryCollectives(comm_.get(), std::move(node), layout->members);
    return absl::OkStatus();
  }
  // The nodes' local ranks 0 connect a mesh of their own, ranked by node.
  std::unique_ptr<GlooComm> leaders;
  if (layout->local_rank == 0) {
    SchedulerStore store(control_.get(), "gloo-leaders/",
                         absl::Now() + options_.start_timeout);
    auto mesh = GlooComm::Connect(layout->node, layout->num_nodes, gloo_host_, gloo_iface_,
                                  store, options_.start_timeout);
    if (!mesh.ok()) return store.status().ok() ? mesh.status() : store.status();
    leaders = std::move(*mesh);
  }
  cpu_ = NewHierarchicalCollectives(comm_.get(), std::move(node), std::move(leaders),
                                    per_region);
  return absl::OkStatus();
}

absl::Status AllreduceStore::ShareFusionSettings() {
  const std::string mine = absl::StrCat(options_.fusion_bytes, " ",
                                        options_.fusion_max_tensor_bytes, " ",
                                        options_.direct_allreduce_bytes);
  // The eager probe's settings go along (a collective: every rank runs it or none does),
  // but a difference in them is not worth a warning.
  const std::string probe = absl::StrCat(options_.eager_probe, " ", options_.eager_bytes);
  ASSIGN_OR_RETURN(std::string both,
                   FromRankZero("fusion/", [&] { return absl::StrCat(mine, " ", probe); }));
  std::vector<std::string> parts = absl::StrSplit(both, ' ');
  if (parts.size() != 5 || !absl::SimpleAtoi(parts[0], &fusion_bytes_) ||
      !absl::SimpleAtoi(parts[1], &fusion_max_tensor_bytes_) ||
      !absl::SimpleAtoi(parts[2], &direct_allreduce_bytes_) ||
      !absl::SimpleAtoi(parts[3], &eager_probe_) ||
      !absl::SimpleAtoi(parts[4], &probe_eager_bytes_)) {
    return absl::DataLossError(
        absl::StrCat("rendezvous: malformed fusion settings from rank 0: '", both, "'"));
  }
  const std::string value = absl::StrJoin(parts.begin(), parts.begin() + 3, " ");
  if (value != mine) {
    HPS_LOG(WARNING) << "this worker's HYBRIDPS_FUSION_BYTES / HYBRIDPS_FUSION_MAX_TENSOR_BYTES"
                     << " / HYBRIDPS_DIRECT_ALLREDUCE_BYTES (" << mine
                     << ") differ from rank 0's (" << value
                     << "); every worker uses rank 0's, so that all plan alike";
  }
  return absl::OkStatus();
}

absl::Status AllreduceStore::ProbeEager(const wire::Welcome& welcome) {
  // Eager costs more than the allreduce's bytes only with 3 workers or more, and only
  // links between nodes can make that cost more than the step it saves. "Nodes" as the
  // scheduler groups workers: one host's workers launched with local sizes are one node;
  // workers that declare none are a node each, even on one host (where the probe times
  // loopback, and eager usually wins).
  const size_t largest = probe_eager_bytes_ / std::max(1, num_workers_ - 1);
  if (eager_probe_ != 1 || num_workers_ < 3 || welcome.num_nodes() < 2 ||
      InSharedMemory() || largest < EagerProbe::kSmallest) {
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(EagerProbe probe,
                   ProbeEagerLimit(cpu_.get(), largest, kEagerProbeReps, gloo_timeout_));
  eager_cap_ = probe.limit;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.eager_probes;
  }
  const std::string said = absl::StrCat(
      "the eager probe (", absl::FormatDuration(absl::Now() - start), "): push_pulls up to ",
      probe.limit, " bytes go with the negotiation, larger ones through the allreduce (",
      rank_ == 0 ? "" : "rank 0 decides; ", "this rank measured ", probe.Describe(), ")");
  if (rank_ == 0) {
    HPS_LOG(INFO) << said;
  } else {
    HPS_LOG(DEBUG) << said;
  }
  return absl::OkStatus();
}

AllreduceStore::~AllreduceStore() {
  absl::Status s = Shutdown();
  if (!s.ok()) HPS_LOG(WARNING) << "shutdown: " << s.message();
  gate_->Close();  // after the helpers in progress returned
}

AllreduceStore::Stats AllreduceStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

// ---- submission -------------------------------------------------------------------------

absl::StatusOr<Handle> AllreduceStore::BroadcastAsync(absl::string_view name, TensorView tensor,
                                                      int root_rank, int priority) {
  RETURN_IF_ERROR(CheckTensor(name, tensor, "the tensor"));
  if (root_rank < 0 || root_rank >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast of '", name, "': root rank ",
                                                   root_rank, " is out of range [0, ",
                                                   num_workers_, ")"));
  }
  auto op = std::make_shared<Op>();
  op->name = std::string(name);
  op->kind = nego::OpKind::kBroadcast;
  op->in = op->out = tensor;
  op->root = root_rank;
  op->priority = priority;
  return Submit(std::move(op));
}

absl::StatusOr<Handle> AllreduceStore::PushPullAsync(absl::string_view name, TensorView in,
                                                     TensorView out, int priority) {
  RETURN_IF_ERROR(CheckTensor(name, in, "the input"));
  RETURN_IF_ERROR(CheckTensor(name, out, "the output"));
  if (in.device != out.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push_pull of '", name, "': the input and the output must both be CPU or both GPU "
        "tensors"));
  }
  if (in.count != out.count || in.dtype != out.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push_pull of '", name, "': the input has ", in.count, " ", DTypeName(in.dtype),
        " elements but the output ", out.count, " ", DTypeName(out.dtype), " elements"));
  }
  auto op = std::make_shared<Op>();
  op->name = std::string(name);
  op->in = in;
  op->out = out;
  op->priority = priority;
  return Submit(std::move(op));
}

absl::Status AllreduceStore::CheckTensor(absl::string_view name, const TensorView& t,
                                         absl::string_view what) {
#if HYBRIDPS_WITH_NCCL
  if (t.device == Device::kGPU) {
    RETURN_IF_ERROR(CheckShape(name, t, what));  // CheckCpuTensor checks it for the rest
    return CheckGpuTensor(name, t, what);
  }
#endif
  return CheckCpuTensor(name, t, what);
}

absl::StatusOr<Handle> AllreduceStore::Submit(std::shared_ptr<Op> op) {
  if (op->name.empty()) return absl::InvalidArgumentError("a tensor name must not be empty");
  if (op->name.size() > nego::kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name of ", op->name.size(),
                                                   " bytes (at most ", nego::kMaxNameBytes, ")"));
  }
  op->submitted = WallNow();
  op->deadline = op->submitted + options_.op_timeout;
  // A negotiation exchange and a collective under way at the deadline run to their own
  // timeouts before the executor fails the operation. The description is formatted only
  // if Wait gives up (the handle's state lives in the Op).
  op->handle->SetDeadline(op->deadline + 2 * gloo_timeout_ + options_.wait_grace,
                          [op = op.get()] { return op->Describe(); });
  op->next_warning = op->submitted + options_.stall_warning;
  if (options_.caller_rounds) WaitHelperGate<AllreduceStore>::Install(gate_, op->handle);
  Handle h(std::shared_ptr<HandleState>(op, op->handle));
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  if (!broken_.ok()) {
    op->handle->Complete(absl::Status(
        broken_.code(), absl::StrCat(op->Describe(), " failed: ", broken_.message())));
    return h;
  }
  op->occurrence = occurrences_[op->name]++;
  op->seq = next_seq_++;
  // An executor that polls the queue (waiting threads run the rounds) looks at this one
  // within a cycle anyway; waking it now would only compete with the thread that may
  // wait on it.
  if (!exec_polling_ || op->in.device == Device::kGPU) WakeExecutorLocked();
  last_submit_ = op->submitted;
  queued_.emplace(op->seq, std::move(op));
  return h;
}

absl::Status AllreduceStore::Barrier() {
  auto state = std::make_shared<HandleState>();
  // The scheduler's answer is due within op_timeout of the request (the I/O thread).
  state->SetDeadline(absl::Now() + options_.op_timeout + absl::Seconds(1) + options_.wait_grace,
                     "the barrier");
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    if (!broken_.ok()) return broken_;
    barriers_.push_back(state);
  }
  io_waker_.Wake();
  return state->Wait();
}

absl::Status AllreduceStore::Shutdown() {
  auto fin = std::make_shared<HandleState>();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    stopping_ = true;
    closed_ = absl::FailedPreconditionError("the store was shut down");
    WakeExecutorLocked();
  }
  if (exec_thread_.joinable()) exec_thread_.join();  // finishes, then leaves the job
  absl::Status s;
  if (io_thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      finalize_ = fin;
    }
    io_waker_.Wake();
    s = fin->Wait();  // bounded: the finalize request has a deadline
    io_exit_.store(true);
    io_waker_.Wake();
    io_thread_.join();
  }
  cpu_.reset();
  comm_.reset();
  if (timeline_ && control_) {
    if (absl::Status s = StopTimeline(); !s.ok()) HPS_LOG(WARNING) << s.message();
    timeline_->WriteAndLog(control_->clock_offset());
  }
  absl::MutexLock timeline_lock(&timeline_mu_);  // a user's StopTimeline reads control_
  control_.reset();
  absl::MutexLock lock(&mu_);
  if (!broken_.ok() && !peers_left_) return broken_;
  return s;
}

void AllreduceStore::Break(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  BreakLocked(status);
}

void AllreduceStore::BreakLocked(const absl::Status& status) {
  if (broken_.ok()) {
    broken_ = status;
    if (!peers_left_) HPS_LOG(ERROR) << "the store can no longer be used: " << status.message();
    // A round in Gloo would wait for its timeout when a peer hangs rather than dies (its
    // sockets stay open): end it now, so its operations fail with this status.
    if (comm_) comm_->Abort();
    if (cpu_) cpu_->Abort(status);
  }
  for (auto it = queued_.begin(); it != queued_.end();) {
    if (it->second->in_round) {
      ++it;
      continue;
    }
    Op* op = it->second.get();
    op->handle->Complete(absl::Status(
        broken_.code(), absl::StrCat(op->Describe(), " failed: ", broken_.message())));
    it = queued_.erase(it);
  }
  for (auto& b : barriers_) b->Complete(broken_);
  barriers_.clear();
  wake_ = true;
  wake_cv_.Signal();  // whichever wait the executor is in
  round_free_cv_.Signal();
  io_waker_.Wake();
}

// ---- the I/O thread ---------------------------------------------------------------------

void AllreduceStore::IoLoop() {
  bool finalize_sent = false;
  while (!io_exit_.load()) {
    Poller poller;
    const int ctl = poller.Add(control_->socket());
    poller.AddFd(io_waker_.fd());
    auto polled = poller.Poll(control_->NextTick() - absl::Now());
    if (!polled.ok()) {
      Break(polled.status());
      absl::SleepFor(absl::Milliseconds(1));
    }
    io_waker_.Drain();
    std::vector<std::shared_ptr<HandleState>> barriers;
    std::shared_ptr<HandleState> fin;
    absl::Status broken;
    {
      absl::MutexLock lock(&mu_);
      barriers.swap(barriers_);
      if (exec_done_ && finalize_ && !finalize_sent) fin = finalize_;
      broken = peers_left_ ? absl::OkStatus() : broken_;
    }
    for (auto& b : barriers) {
      wire::Envelope env;
      env.mutable_barrier()->set_group(wire::GROUP_WORKERS);
      control_->Request(std::move(env), absl::Now() + options_.op_timeout,
                        [b](absl::StatusOr<wire::Envelope> r) { b->Complete(r.status()); });
    }
    if (fin) {
      // Even after a failure the scheduler hears that we are done, so the job ends now.
      finalize_sent = true;
      wire::Envelope env;
      env.mutable_finalize();
      control_->Request(std::move(env), absl::Now() + options_.heartbeat_timeout,
                        [fin, broken](absl::StatusOr<wire::Envelope> r) {
                          fin->Complete(broken.ok() ? r.status() : broken);
                        });
    }
    if (poller.Readable(ctl)) control_->OnReadable();
    control_->Tick(absl::Now());
  }
  control_->FailAll(absl::CancelledError("the store was shut down"));
}

absl::Status AllreduceStore::StartTimeline(const std::string& path) {
  if (!timeline_) return absl::FailedPreconditionError("the store is not connected");
  return timeline_->Start(path);
}

absl::Status AllreduceStore::StopTimeline() {
  if (!timeline_) return absl::OkStatus();
  absl::MutexLock lock(&timeline_mu_);
  return timeline_->Stop(control_ ? control_->clock_offset() : absl::ZeroDuration());
}

}  // namespace hybridps
