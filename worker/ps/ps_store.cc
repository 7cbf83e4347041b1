#include "worker/ps/ps_store.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/spin.h"
#include "common/status.h"
#include "common/wire.h"

namespace hybridps {

struct PsStore::Op {
  std::string name;
  uint64_t key = 0;
  wire::DataOp kind = wire::OP_NONE;
  TensorView in, out;
  int root = -1;
  int priority = 0;
  uint64_t seq = 0;
  absl::Time deadline;
  std::vector<Partition> parts;
  std::vector<uint32_t> lanes;   // per partition: its data connection (AssignLanes)
  std::vector<uint64_t> rounds;  // per partition, set when activated
  size_t remaining = 0;          // partitions not yet finished
  std::atomic<int> zc_pending{0};  // payload frames ZeroMQ has not released yet
  absl::Status status;
  bool activated = false;
  bool completed = false;
  bool local = false;       // reduced across the node's local ranks first
  bool node_sum = false;    // `in` holds the node's sum already (PushPullNodeSumAsync)
  GradientCompression compression;  // of its pushes (SetGradientCompression, by name)
  std::string node_fail;    // FailNodeRoundAsync: its pushed partitions fail their rounds
  bool in_failing = false;  // listed in PsStore::failing_
  bool burst = false;       // submitted within burst_gather of the previous operation
  absl::Time stall_logged = absl::InfinitePast();  // the last StallNotice logged
  int local_pending = 0;    // partitions the local reducer still works on (it may touch
                            // in/out until it reports them done)
  std::shared_ptr<HandleState> handle = std::make_shared<HandleState>();

  std::string Describe() const {
    return absl::StrCat(kind == wire::OP_BROADCAST ? "broadcast" : "push_pull", " of '", name,
                        "' (", in.count, " ", DTypeName(in.dtype), " elements)");
  }
};

absl::StatusOr<std::unique_ptr<PsStore>> PsStore::Create(std::shared_ptr<Context> ctx,
                                                         const Options& options,
                                                         OnBroken on_broken) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<PsStore> s(new PsStore(std::move(ctx), options, std::move(on_broken)));
  RETURN_IF_ERROR(s->Start());
  return s;
}

PsStore::~PsStore() {
  absl::Status s = Shutdown();
  if (!s.ok()) HPS_LOG(WARNING) << "shutdown: " << s.message();
  gate_->Close();  // after the helpers in progress returned
}

absl::StatusOr<Handle> PsStore::BroadcastAsync(absl::string_view name, TensorView tensor,
                                               int root_rank, int priority) {
  if (name.empty()) return absl::InvalidArgumentError("a tensor name must not be empty");
  RETURN_IF_ERROR(CheckCpuTensor(name, tensor, "the tensor"));
  if (root_rank < 0 || root_rank >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast of '", name, "': root rank ",
                                                   root_rank, " is out of range [0, ",
                                                   num_workers_, ")"));
  }
  auto op = std::make_shared<Op>();
  op->name = std::string(name);
  op->kind = wire::OP_BROADCAST;
  op->in = op->out = tensor;
  op->root = root_rank;
  op->priority = priority;
  return Submit(std::move(op));
}

absl::StatusOr<Handle> PsStore::PushPullAsync(absl::string_view name, TensorView in,
                                              TensorView out, int priority) {
  return SubmitPushPull(name, in, out, priority, /*node_sum=*/false);
}

absl::StatusOr<Handle> PsStore::SubmitPushPull(absl::string_view name, TensorView in,
                                               TensorView out, int priority, bool node_sum) {
  if (name.empty()) return absl::InvalidArgumentError("a tensor name must not be empty");
  RETURN_IF_ERROR(CheckCpuTensor(name, in, "the input"));
  RETURN_IF_ERROR(CheckCpuTensor(name, out, "the output"));
  if (in.count != out.count || in.dtype != out.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push_pull of '", name, "': the input has ", in.count, " ", DTypeName(in.dtype),
        " elements but the output ", out.count, " ", DTypeName(out.dtype), " elements"));
  }
  auto op = std::make_shared<Op>();
  op->name = std::string(name);
  op->kind = wire::OP_PUSHPULL;
  op->in = in;
  op->out = out;
  op->priority = priority;
  op->node_sum = node_sum;
  if (in.dtype == DType::kFloat32 && any_compression_.load(std::memory_order_acquire)) {
    op->compression = CompressionOf(name);
  }
  return Submit(std::move(op));
}

std::vector<NodePart> PsStore::NodePartsOf(absl::string_view name, size_t count,
                                           DType dtype) const {
  const uint64_t key = TensorKey(name);
  std::vector<NodePart> parts;
  for (const Partition& p : Place(key, count, dtype)) {
    parts.push_back(NodePart{p.offset, p.count,
                             NodePusherOf(key, p.index, layout_.local_size)});
  }
  return parts;
}

absl::StatusOr<Handle> PsStore::PushPullNodeSumAsync(absl::string_view name, TensorView in,
                                                     TensorView out, int priority) {
  return SubmitPushPull(name, in, out, priority, /*node_sum=*/true);
}

absl::StatusOr<Handle> PsStore::FailNodeRoundAsync(absl::string_view name, size_t count,
                                                   DType dtype, absl::string_view why) {
  auto op = std::make_shared<Op>();
  op->name = std::string(name);
  op->kind = wire::OP_PUSHPULL;
  op->in = op->out = TensorView{nullptr, count, dtype};
  op->node_sum = true;
  op->node_fail = why.empty() ? std::string("the node's local ranks disagree") : std::string(why);
  return Submit(std::move(op));
}

absl::StatusOr<Handle> PsStore::Submit(std::shared_ptr<Op> op) {
  op->key = TensorKey(op->name);
  op->parts = Place(op->key, op->in.count, op->in.dtype);
  op->lanes = AssignLanes(op->key, op->parts);
  op->remaining = op->parts.size();
  op->deadline = absl::Now() + options_.op_timeout;
  // Past its deadline the store breaks, waits a second more for a node's local ranks and
  // up to five for ZeroMQ to let go of the input (MaybeComplete, CheckDeadlines).
  op->handle->SetDeadline(op->deadline + absl::Seconds(10) + options_.wait_grace,
                          op->Describe());
  if (caller_turns_) {
    WaitHelperGate<PsStore>::Install(gate_, op->handle.get());
  }
  Handle h(op->handle);
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    op->seq = next_seq_++;
    const absl::Time now = absl::Now();
    op->burst = now - last_submit_ < options_.burst_gather;
    last_submit_ = now;
    commands_.push_back(Command{std::move(op), nullptr, nullptr, nullptr});
  }
  credits_->waker.Wake();
  return h;
}

absl::Status PsStore::Barrier() {
  auto state = std::make_shared<HandleState>();
  // The scheduler's answer is due within op_timeout of the request (TakeCommands).
  state->SetDeadline(absl::Now() + options_.op_timeout + absl::Seconds(1) + options_.wait_grace,
                     "the barrier");
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    commands_.push_back(Command{nullptr, state, nullptr, nullptr});
    CallIoLocked();
  }
  credits_->waker.Wake();
  return state->Wait();
}

bool PsStore::IoTurn(PollSpin* spin, bool caller) {
  Poller poller;
  std::vector<int> data_idx(data_.size(), -1);
  for (size_t i = 0; i < data_.size(); ++i) {
    if (data_[i]) data_idx[i] = poller.Add(data_[i].get());
  }
  const int ctl_idx = poller.Add(control_->socket());
  poller.AddFd(credits_->waker.fd());
  if (local_) poller.AddFd(local_->wake_fd());
  absl::Time now = absl::Now();
  absl::Time until = control_->NextTick();
  if (local_) until = std::min(until, local_next_);
  if (!active_.empty()) until = std::min(until, active_.begin()->second->deadline);
  for (const auto& [id, call] : server_calls_) until = std::min(until, call.deadline);
  if (!failing_.empty()) until = std::min(until, now + absl::Milliseconds(1));
  if (holding_since_ != absl::InfiniteFuture()) {
    until = std::min(until, now + options_.burst_gather);
  }
  if (windowed_waiting_) until = std::min(until, last_send_ + options_.server_window_patience);
  auto polled = poller.Poll(spin->Timeout(now, until - now));
  if (!polled.ok()) {
    Break(polled.status());
    absl::SleepFor(absl::Milliseconds(1));
  } else {
    spin->Polled(*polled);
  }
  credits_->waker.Drain();
  const bool left_for_io = TakeCommands(caller);
  for (size_t i = 0; i < data_.size(); ++i) {
    if (data_idx[i] < 0 || !poller.Readable(data_idx[i])) continue;
    while (data_[i]) {
      auto msg = data_[i]->TryRecv();
      if (!msg.ok() || !*msg) break;
      HandleReply(lane_server_[i], std::move(**msg));
    }
  }
  if (poller.Readable(ctl_idx)) control_->OnReadable();
  now = absl::Now();
  control_->Tick(now);
  CheckDeadlines(now);
  std::vector<std::shared_ptr<Op>> retry;
  retry.swap(failing_);
  for (auto& op : retry) {
    op->in_failing = false;
    MaybeComplete(op.get());  // lists it again if it still waits
  }
  ReleaseHeld(now, !broken_.ok());  // a gathered burst whose end has come
  // The local reduction runs here, on this thread: a partition whose node contributions
  // are all in is summed and dispatched in this same turn, a reply copied out and
  // completed without a hand-off. Dispatch may hand the reducer a failed send.
  do {
    PumpLocal();
    Dispatch();
  } while (local_ && local_->queued());
  if (finalize_ && active_.empty() && !finalize_sent_) {
    finalize_sent_ = true;
    // Even after a failure the scheduler hears that we are done, so the job ends now
    // rather than a heartbeat timeout later (a lost scheduler answers at once).
    wire::Envelope env;
    env.mutable_finalize();
    auto fin = finalize_;
    control_->Request(std::move(env), absl::Now() + options_.heartbeat_timeout,
                      [fin, broken = broken_](absl::StatusOr<wire::Envelope> r) {
                        fin->Complete(broken.ok() ? r.status() : broken);
                      });
  }
  // Threads waiting for the turns (HelpWith) look again when mu_ is let go: one of them
  // may have been waiting on an operation this turn completed.
  // (The fence pairs with HelpWith's count: a completion before it and a helper's count
  // after it cannot both go unseen.)
  if (caller_turns_) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (helpers_waiting_.load(std::memory_order_relaxed) > 0) absl::MutexLock lock(&mu_);
  }
  return left_for_io;
}

bool PsStore::WatchedWorkLeft() const {
  for (const auto& [seq, op] : active_) {
    if (op->handle->watched()) return true;
  }
  for (const Command& c : commands_) {
    if (c.op && c.op->handle->watched()) return true;
  }
  return false;
}

void PsStore::StartOp(std::shared_ptr<Op> op) {
  if (!broken_.ok()) {  // named like the operations the break itself failed (Break)
    op->handle->Complete(absl::Status(
        broken_.code(), absl::StrCat(op->Describe(), " failed: ", broken_.message())));
    return;
  }
  // A burst that arrives while earlier work is in flight is gathered (Activate holds its
  // partitions): the link is busy meanwhile, and the burst then leaves in priority order.
  if (op->burst && !active_.empty() && holding_since_ == absl::InfiniteFuture()) {
    holding_since_ = absl::Now();
  }
  Op* raw = op.get();
  active_.emplace(op->seq, op);
  auto& queue = per_key_[op->key];
  queue.push_back(std::move(op));
  if (queue.size() == 1) Activate(raw);
}

void PsStore::Activate(Op* op) {
  op->activated = true;
  // One round number per operation on a name, shared by all its partitions: after a
  // failed round that some partitions never closed, the next operation's requests carry a
  // later round and the server abandons the stale ones instead of mixing their data in.
  const uint64_t round = rounds_[op->key]++;
  op->rounds.assign(op->parts.size(), round);
  if (local_ && !op->node_sum) return SubmitLocal(op);
  const bool hold = holding_since_ != absl::InfiniteFuture();
  for (const Partition& p : op->parts) {
    PartTask t{op->priority, op->seq, p.index, active_.at(op->seq), false, nullptr, ""};
    t.skip = op->node_sum &&
             NodePusherOf(op->key, p.index, layout_.local_size) != layout_.local_rank;
    t.fail = op->node_fail;
    if (hold) {
      held_.push_back(std::move(t));
    } else {
      ready_.push(std::move(t));
    }
  }
}

void PsStore::ReleaseHeld(absl::Time now, bool force) {
  if (holding_since_ == absl::InfiniteFuture()) return;
  absl::Time last;
  {
    absl::MutexLock lock(&mu_);
    last = last_submit_;
  }
  if (!force && now - last < options_.burst_gather &&
      now - holding_since_ < 10 * options_.burst_gather) {
    return;  // the burst goes on
  }
  for (PartTask& t : held_) ready_.push(std::move(t));
  held_.clear();
  holding_since_ = absl::InfiniteFuture();
}

namespace {
struct SendHint {
  std::shared_ptr<PsStore::Op> op;
  std::shared_ptr<PsStore::Credits> credits;
  size_t bytes;
};
}  // namespace

void PsStore::ReleaseFrame(void* /*data*/, void* hint) {
  // ZeroMQ's I/O thread: it has written the payload out. The I/O thread polls failing ops
  // for zc_pending; credit waiters are woken.
  auto* h = static_cast<SendHint*>(hint);
  h->credits->queued.fetch_sub(h->bytes);
  h->op->zc_pending.fetch_sub(1, std::memory_order_acq_rel);
  if (h->credits->blocked.exchange(false)) h->credits->waker.Wake();
  delete h;
}

void PsStore::Dispatch() {
  // Partitions for servers whose window is full wait aside (ServerWindows) and go back
  // into ready_ at the end, in their order.
  std::vector<PartTask> windowed;
  bool past_window = false;  // patience ran out: the next partition goes whatever its window
  while (true) {
    if (ready_.empty()) {
      // Only windowed partitions are left: once nothing has been sent for
      // server_window_patience, the best of them goes (a safety net; the shared order
      // keeps windows from waiting on each other).
      if (windowed.empty() || past_window ||
          absl::Now() - last_send_ < options_.server_window_patience) {
        break;
      }
      for (PartTask& w : windowed) ready_.push(std::move(w));
      windowed.clear();
      past_window = true;
      continue;
    }
    PartTask t = ready_.top();
    Op* op = t.op.get();
    if (t.skip || ((op->completed || !op->status.ok()) && t.fail.empty())) {
      ready_.pop();
      if (!t.local) FinishPart(op, absl::OkStatus());  // else the reducer reports it
      continue;
    }
    const Partition& part = op->parts[t.part];
    const size_t bytes = PushedBytes(*op, part);
    const GlobalOrder order{-static_cast<int64_t>(t.priority), op->key, part.index};
    if (!past_window && t.fail.empty() && !windows_.Admits(part.server, order, bytes)) {
      ready_.pop();
      windowed.push_back(std::move(t));
      continue;
    }
    if (!HasCredit(bytes)) break;
    past_window = false;
    ready_.pop();
    SendPart(t, order);
  }
  windowed_waiting_ = !windowed.empty();
  for (PartTask& w : windowed) ready_.push(std::move(w));
}

absl::Status PsStore::SetGradientCompression(const GradientCompression& compression,
                                             absl::string_view name_prefix) {
  RETURN_IF_ERROR(CheckGradientCompression(compression));
  absl::MutexLock lock(&compression_mu_);
  auto it = std::find_if(compressions_.begin(), compressions_.end(),
                         [&](const auto& c) { return c.first == name_prefix; });
  if (it == compressions_.end()) {
    compressions_.emplace_back(std::string(name_prefix), compression);
  } else {
    it->second = compression;
  }
  any_compression_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

GradientCompression PsStore::CompressionOf(absl::string_view name) {
  absl::MutexLock lock(&compression_mu_);
  const std::pair<std::string, GradientCompression>* best = nullptr;
  for (const auto& c : compressions_) {
    if (absl::StartsWith(name, c.first) && (!best || c.first.size() > best->first.size())) {
      best = &c;
    }
  }
  return best ? best->second : GradientCompression{};
}

// The bytes a push of `part` carries: 2bit-packed or as it is.
size_t PsStore::PushedBytes(const Op& op, const Partition& part) {
  if (op.compression.type == Compression::kTwoBit && op.kind == wire::OP_PUSHPULL &&
      op.in.dtype == DType::kFloat32) {
    return part.count == 0 ? 0 : TwoBitBytes(part.count);
  }
  return part.count * DTypeSize(op.in.dtype);
}

void PsStore::SendPart(const PartTask& t, const GlobalOrder& order) {
  Op* op = t.op.get();
  const Partition& part = op->parts[t.part];
  const size_t es = DTypeSize(op->in.dtype);
  const size_t bytes = part.count * es;
  wire::Envelope env;
  const uint64_t id = next_request_id_++;
  env.set_id(id);
  auto* req = env.mutable_data_request();
  req->set_key(op->key);
  req->set_part(part.index);
  req->set_round(op->rounds[part.index]);
  req->set_op(op->kind);
  req->set_dtype(static_cast<uint32_t>(op->in.dtype));
  req->set_count(part.count);
  req->set_total_count(op->in.count);
  for (int d = 0; d < op->in.shape.ndim; ++d) req->add_shape(op->in.shape.dims[d]);
  req->set_root(op->root >= 0 ? layout_.node_of[op->root] : op->root);
  req->set_name(op->name);
  req->set_offset(part.offset);
  req->set_num_parts(static_cast<uint32_t>(op->parts.size()));
  req->set_fail(t.fail);
  std::optional<Frame> payload;
  const bool pushes_data = op->kind == wire::OP_PUSHPULL ||
                           (t.local ? t.data != nullptr : rank_ == op->root);
  const GradientCompression& compression = op->compression;
  if (pushes_data && t.fail.empty()) {
    char* base = t.local ? const_cast<char*>(t.data)
                         : static_cast<char*>(op->in.data) + part.offset * es;
    if (compression.type == Compression::kTwoBit && op->kind == wire::OP_PUSHPULL &&
        op->in.dtype == DType::kFloat32 && bytes > 0) {
      // Packed now, from the residual this worker keeps for the partition.
      std::vector<float>& residual = residuals_[{op->key, part.index}];
      if (residual.size() != part.count) residual.assign(part.count, 0.0f);
      payload.emplace(Frame::Allocate(TwoBitBytes(part.count)));
      TwoBitQuantize(reinterpret_cast<const float*>(base), part.count, compression.threshold,
                     residual.data(), static_cast<char*>(payload->data()));
      req->set_compression(static_cast<uint32_t>(compression.type));
      req->set_threshold(compression.threshold);
    } else if (bytes == 0) {
      payload.emplace(absl::string_view());  // an empty tensor still takes part
    } else if (inproc_[part.server]) {
      // inproc:// hands the receiver our very buffer; the server keeps and sums into
      // what it receives, so it must get memory of its own.
      payload.emplace(absl::string_view(base, bytes));
    } else {
      op->zc_pending.fetch_add(1, std::memory_order_acq_rel);
      credits_->queued.fetch_add(bytes);
      payload.emplace(base, bytes, &PsStore::ReleaseFrame,
                      new SendHint{active_.at(op->seq), credits_, bytes});
    }
  }
  const size_t lane = op->lanes[t.part];
  Socket* sock = data_[lane].get();
  Message msg = Encode("", env, std::move(payload));
  const absl::Time sent = absl::Now();  // before the server can have it (the timeline)
  absl::Status s = sock ? sock->Send(msg) : broken_;
  if (!s.ok()) {
    absl::Status err = absl::UnavailableError(
        absl::StrCat("send to server ", part.server, " failed: ", s.message()));
    if (!t.local) {
      FinishPart(op, err);
    } else if (t.fail.empty()) {
      local_->Publish(op, part.index, err, std::nullopt);
    }
    return;
  }
  if (!t.fail.empty()) {  // its answer is the failure every node gets
    if (!t.local) FinishPart(op, absl::AbortedError(t.fail));
    return;
  }
  pushes_per_lane_[lane].fetch_add(1, std::memory_order_relaxed);
  const size_t pushed = pushes_data ? PushedBytes(*op, part) : 0;
  if (pushed > 0) {
    windows_.Sent(part.server, order, pushed);
    const size_t unanswered = windows_.unanswered(part.server);
    if (unanswered > max_unanswered_.load(std::memory_order_relaxed)) {
      max_unanswered_.store(unanswered, std::memory_order_relaxed);
    }
  }
  last_send_ = sent;
  in_flight_.emplace(id, InFlight{active_.at(op->seq), part.index, op->rounds[part.index],
                                  part.server, pushed, order, {}, sent});
}

bool PsStore::HasCredit(size_t bytes) {
  size_t queued = credits_->queued.load();
  if (queued == 0 || queued + bytes <= options_.credit_bytes) return true;
  // Ask ZeroMQ's thread to wake us when it releases some, then look again so a release
  // that happened meanwhile is not missed.
  credits_->blocked.store(true);
  queued = credits_->queued.load();
  return queued == 0 || queued + bytes <= options_.credit_bytes;
}

void PsStore::HandleReply(int server, Message raw) {
  auto d = Decode(std::move(raw), false);
  if (!d.ok()) {
    HPS_LOG(WARNING) << "rejected a reply from server " << server << ": "
                     << d.status().message();
    return;
  }
  const wire::Envelope& env = d->env;
  if (env.body_case() == wire::Envelope::kHelloAck) return;
  if (env.body_case() == wire::Envelope::kStallNotice) {
    auto it = in_flight_.find(env.id());
    if (it == in_flight_.end()) return;
    Op* op = it->second.op.get();
    const absl::Time now = absl::Now();
    if (now - op->stall_logged >= options_.stall_warning) {  // once per operation and period
      op->stall_logged = now;
      HPS_LOG(WARNING) << op->Describe() << ": server " << server << " says: "
                       << env.stall_notice().text();
    }
    it->second.stall = env.stall_notice().text();
    return;
  }
  if (auto call = server_calls_.find(env.id()); call != server_calls_.end()) {
    auto done = std::move(call->second.done);
    server_calls_.erase(call);
    if (env.body_case() == wire::Envelope::kError) return done(FromWire(env.error()));
    return done(std::move(d->env));
  }
  auto it = in_flight_.find(env.id());
  if (it == in_flight_.end()) {
    if (env.body_case() == wire::Envelope::kError) {
      HPS_LOG(WARNING) << "server " << server << " refused a message: "
                       << env.error().message();
    }
    return;  // A reply to an operation that already failed.
  }
  std::shared_ptr<Op> op = std::move(it->second.op);
  const uint32_t pi = it->second.part;
  if (Recording(timeline_)) {
    const Partition& tp = op->parts[pi];
    std::string what = absl::StrCat("'", op->name, "' partition ", pi);
    std::string args = absl::StrCat("\"bytes\": ", tp.count * DTypeSize(op->in.dtype),
                                    ", \"round\": ", it->second.round);
    // Before its send: queued behind the server's window and the credits, and on a node
    // of several local ranks the local reduction (its own span on the node's lane).
    timeline_->Span(what, "queued, waiting for credit", op->deadline - options_.op_timeout,
                    it->second.sent, 1 + it->second.server, args);
    timeline_->Span(std::move(what), "push, server, reply", it->second.sent, absl::Now(),
                    1 + it->second.server, std::move(args));
  }
  if (it->second.bytes > 0) {
    windows_.Answered(it->second.server, it->second.order, it->second.bytes);
  }
  in_flight_.erase(it);
  const Partition& part = op->parts[pi];
  const size_t es = DTypeSize(op->in.dtype);
  // A local rank that pushed for its node hands the answer to the reducer, which shares
  // it with the node and reports the partition done.
  auto finish = [&](const absl::Status& status, std::optional<Frame> payload = std::nullopt) {
    if (op->local) return local_->Publish(op.get(), pi, status, std::move(payload));
    FinishPart(op.get(), status);
  };
  if (env.body_case() == wire::Envelope::kError) return finish(FromWire(env.error()));
  auto bad = [&](std::string why) {
    finish(absl::InternalError(absl::StrCat("server ", server,
                                            " sent a malformed reply for partition ", pi,
                                            ": ", why)));
  };
  if (env.body_case() != wire::Envelope::kDataResponse) return bad("not a data response");
  const wire::DataResponse& resp = env.data_response();
  if (resp.count() != part.count || resp.dtype() != static_cast<uint32_t>(op->in.dtype)) {
    return bad(absl::StrCat(resp.count(), " elements of dtype ", resp.dtype(), " instead of ",
                            part.count, " ", DTypeName(op->in.dtype)));
  }
  const bool expect_payload = !(op->kind == wire::OP_BROADCAST && rank_ == op->root);
  if (expect_payload) {
    if (!d->payload || d->payload->size() != part.count * es) {
      return bad(absl::StrCat("payload of ", d->payload ? d->payload->size() : 0,
                              " bytes instead of ", part.count * es));
    }
    if (!op->local && !op->completed && op->status.ok() && part.count > 0) {
      std::memcpy(static_cast<char*>(op->out.data) + part.offset * es, d->payload->data(),
                  part.count * es);
    }
  }
  finish(absl::OkStatus(), std::move(d->payload));
}

void PsStore::FinishPart(Op* op, const absl::Status& status) {
  if (!status.ok() && op->status.ok()) {
    op->status = absl::Status(status.code(),
                              absl::StrCat(op->Describe(), " failed: ", status.message()));
    if (op->local_pending > 0) local_->Cancel(op, op->status);
  }
  if (op->remaining > 0) --op->remaining;
  MaybeComplete(op);
}

void PsStore::MaybeComplete(Op* op) {
  if (op->completed) return;
  if (op->remaining > 0) {
    if (op->status.ok()) return;
    // Failed with partitions still out: complete once ZeroMQ no longer reads our input
    // (their late replies are dropped), or after a grace period once sockets were closed.
    if (op->local_pending > 0 || (op->zc_pending.load(std::memory_order_acquire) > 0 &&
                                  absl::Now() < broken_at_ + absl::Seconds(5))) {
      if (!op->in_failing) {
        op->in_failing = true;
        failing_.push_back(active_.at(op->seq));
      }
      return;
    }
    // Its partitions still out are abandoned: their late replies are dropped.
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (it->second.op.get() == op) {
        in_flight_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  op->completed = true;
  if (Recording(timeline_)) {
    timeline_->Span(op->Describe(), op->status.ok() ? "operation" : "failed operation",
                    op->deadline - options_.op_timeout, absl::Now(), 0,
                    absl::StrCat("\"bytes\": ", op->in.count * DTypeSize(op->in.dtype),
                                 ", \"partitions\": ", op->parts.size()));
  }
  op->handle->Complete(op->status);
  auto& queue = per_key_[op->key];
  for (auto it = queue.begin(); it != queue.end(); ++it) {
    if (it->get() == op) {
      queue.erase(it);
      break;
    }
  }
  const uint64_t key = op->key;
  const uint64_t seq = op->seq;
  std::shared_ptr<Op> keep = std::move(active_[seq]);  // `op` stays valid until we return
  active_.erase(seq);
  if (queue.empty()) {
    per_key_.erase(key);
  } else if (!queue.front()->activated) {
    Activate(queue.front().get());
  }
}

void PsStore::CheckDeadlines(absl::Time now) {
  FailServerCalls(absl::OkStatus(), now);
  if (active_.empty() || active_.begin()->second->deadline > now) return;
  Op* op = active_.begin()->second.get();
  std::vector<std::string> waiting;
  for (const auto& [id, f] : in_flight_) {
    if (f.op.get() == op) {
      const int s = op->parts[f.part].server;
      waiting.push_back(absl::StrCat("server ", s, " (", servers_[s].endpoint(),
                                     ") partition ", f.part,
                                     f.stall.empty() ? "" : absl::StrCat(", whose ", f.stall)));
    }
  }
  // Waiting for the node's local ranks: the reducer names who is missing at the deadline.
  if (waiting.empty() && op->local_pending > 0 && now < op->deadline + absl::Seconds(1)) return;
  Break(absl::DeadlineExceededError(absl::StrCat(
      op->Describe(), " did not complete within ", absl::FormatDuration(options_.op_timeout),
      waiting.empty() ? std::string(" (it never started: an earlier operation on it is stuck)")
                      : absl::StrCat("; still waiting for ", absl::StrJoin(waiting, ", ")))));
}

void PsStore::Break(const absl::Status& status) {
  if (broken_.ok()) {
    broken_ = status;
    broken_at_ = absl::Now();
    HPS_LOG(ERROR) << "the store can no longer be used: " << status.message();
    if (local_) local_->Abort(status);
    if (on_broken_) on_broken_(status);
  }
  // Close the data sockets without linger: ZeroMQ drops what it still queues for the
  // servers and releases our zero-copy payloads, so failed operations can complete.
  for (auto& sock : data_) {
    if (!sock) continue;
    int zero = 0;
    zmq_setsockopt(sock->raw(), ZMQ_LINGER, &zero, sizeof zero);
    sock.reset();
  }
  FailServerCalls(status, absl::InfiniteFuture());
  std::vector<Op*> ops;
  for (auto& [seq, op] : active_) ops.push_back(op.get());
  for (Op* op : ops) {
    if (op->status.ok()) {
      // The operation that timed out is already named at the head of the message.
      op->status = absl::StartsWith(status.message(), op->Describe())
                       ? status
                       : absl::Status(status.code(), absl::StrCat(op->Describe(), " failed: ",
                                                                  status.message()));
    }
    if (!op->activated) op->remaining = 0;
    MaybeComplete(op);
  }
}

}  // namespace hybridps

namespace hybridps {

void PsStore::SubmitLocal(Op* op) {
  op->local = true;
  const size_t es = DTypeSize(op->in.dtype);
  for (const Partition& p : op->parts) {
    LocalReducer::Task t;
    t.owner = active_.at(op->seq);
    t.part = p.index;
    t.name = op->name;
    t.key = op->key;
    t.round = op->rounds[p.index];
    t.op = op->kind;
    t.dtype = op->in.dtype;
    t.count = p.count;
    t.offset = p.offset;
    t.total_count = op->in.count;
    t.shape = op->in.shape;
    t.root = op->root;
    t.in = static_cast<const char*>(op->in.data) + p.offset * es;
    t.out = static_cast<char*>(op->out.data) + p.offset * es;
    t.deadline = op->deadline;
    ++op->local_pending;
    local_->Submit(std::move(t));
  }
}

void PsStore::PumpLocal() {
  if (!local_) return;
  while (true) {
    local_next_ = local_->Pump();
    {
      absl::MutexLock lock(&local_mu_);
      if (local_events_.empty() && !local_->queued()) return;
    }
    TakeLocalEvents();  // may submit, publish or cancel: pump again
  }
}

void PsStore::TakeLocalEvents() {
  std::vector<LocalReducer::Event> events;
  {
    absl::MutexLock lock(&local_mu_);
    events.swap(local_events_);
  }
  for (LocalReducer::Event& e : events) {
    if (e.kind == LocalReducer::Event::kBroken) {
      Break(e.status);
      continue;
    }
    std::shared_ptr<Op> op = std::static_pointer_cast<Op>(std::move(e.owner));
    if (e.kind == LocalReducer::Event::kPush) {
      ready_.push(PartTask{op->priority, op->seq, e.part, std::move(op), true, e.data,
                           std::move(e.fail)});
      continue;
    }
    --op->local_pending;
    // A local rank that timed out breaks the store, as a server that did would.
    if (e.status.code() == absl::StatusCode::kDeadlineExceeded && broken_.ok()) {
      FinishPart(op.get(), e.status);
      Break(op->status);
      continue;
    }
    FinishPart(op.get(), e.status);
  }
}

}  // namespace hybridps
