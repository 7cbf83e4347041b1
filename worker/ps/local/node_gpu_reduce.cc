#include "worker/ps/local/node_gpu_reduce.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/byte_io.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/node/negotiation.h"

namespace hybridps {

namespace ng = negotiation;

namespace {
// The negotiation phase in which an operation is listed once its push_pull (step 3) has
// ended (phase 0: ready for step 2).
constexpr uint8_t kPushedPhase = 1;
// A round's message stays well under ShmAllreduce::kExchangeBytes; what does not fit is
// listed in a later round.
constexpr size_t kListBudget = ShmAllreduce::kExchangeBytes / 2;
// A round's message: the negotiation's list, then the errors of the pushes that failed
// at this rank (by listed name), so that the node's other ranks can report them.
std::string PackRound(absl::string_view list,
                      const std::vector<std::pair<std::string, absl::Status>>& errors) {
  std::string out;
  auto put_bytes = [&out](absl::string_view b) {
    Put(&out, static_cast<uint32_t>(b.size()));
    out.append(b.data(), b.size());
  };
  put_bytes(list);
  Put(&out, static_cast<uint32_t>(errors.size()));
  for (const auto& [name, status] : errors) {
    put_bytes(name);
    Put(&out, static_cast<uint32_t>(status.code()));
    put_bytes(status.message().substr(0, 1000));
  }
  return out;
}

// The list's bytes and the errors; false when malformed.
bool UnpackRound(absl::string_view bytes, absl::string_view* list,
                 std::map<std::string, absl::Status>* errors) {
  ByteReader in(bytes);
  auto get_bytes = [&in](absl::string_view* b) {
    uint32_t n = 0;
    return in.Get(&n) && in.Take(n, b);
  };
  uint32_t n = 0;
  if (!get_bytes(list) || !in.Get(&n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    absl::string_view name, text;
    uint32_t code = 0;
    if (!get_bytes(&name) || !in.Get(&code) || !get_bytes(&text) || code == 0 ||
        code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      return false;
    }
    (*errors)[std::string(name)] = absl::Status(static_cast<absl::StatusCode>(code), text);
  }
  return in.left() == 0;
}
}  // namespace

struct NodeGpuReducer::Op {
  std::string name;
  TensorView in, out;
  int priority = 0;
  uint32_t occurrence = 0;
  std::vector<NodePart> parts;
  absl::Time submitted, deadline;
  bool reduced = false;  // step 2 done, step 3 submitted (the loop thread only)
  StagingCache::Buffer staging;  // step 3's host memory (the loop thread only)
  absl::Status push_status;        // written before `pushed`
  std::atomic<bool> pushed{false};  // step 3 ended with push_status
  std::shared_ptr<HandleState> handle = std::make_shared<HandleState>();

  std::string Describe() const {
    return absl::StrCat("push_pull of '", name, "' (", in.count, " ", DTypeName(in.dtype),
                        " elements on GPU ", in.device_id, ")");
  }
};

NodeGpuReducer::NodeGpuReducer(const Options& options, const NodeLayout& layout,
                               std::unique_ptr<DeviceCopier> copier)
    : options_(options),
      layout_(layout),
      copier_(std::move(copier)),
      cache_([c = copier_.get()](size_t bytes) { return c->AllocHost(bytes); },
             [c = copier_.get()](void* data) { c->FreeHost(data); }) {}

absl::StatusOr<std::unique_ptr<NodeGpuReducer>> NodeGpuReducer::Create(
    const Options& options, const NodeLayout& layout, std::unique_ptr<DeviceCopier> copier,
    NodeSumSink* store, const MakeCollectives& make_collectives) {
  std::unique_ptr<NodeGpuReducer> r(new NodeGpuReducer(options, layout, std::move(copier)));
  r->store_ = store;
  r->idle_tick_ = std::clamp(options.heartbeat_timeout / 20, absl::Milliseconds(1),
                             absl::Milliseconds(10));
  const std::string name = absl::StrCat("/hps-ng-", layout.job_id, "-n", layout.node, "-",
                                        layout.pids.empty() ? 0 : layout.pids[0]);
  auto exchange = ShmAllreduce::Open(name, layout.local_rank, layout.local_size,
                                     /*chunk_bytes=*/4096, absl::Now() + options.start_timeout);
  if (!exchange.ok()) {
    return absl::Status(exchange.status().code(),
                        absl::StrCat("the node's GPU reduction (HYBRIDPS_GPU_LOCAL_REDUCE=nccl, "
                                     "which every local rank must set alike) could not start: ",
                                     exchange.status().message()));
  }
  r->exchange_ = std::move(*exchange);
  r->collectives_ = make_collectives(r->exchange_.get(), r->layout_);
  r->thread_ = std::thread([p = r.get()] {
    pthread_setname_np(pthread_self(), "hps-node-gpu");
    p->Loop();
  });
  return r;
}

NodeGpuReducer::~NodeGpuReducer() { Shutdown(); }

absl::StatusOr<Handle> NodeGpuReducer::PushPullAsync(absl::string_view name, TensorView in,
                                                     TensorView out, int priority) {
  if (name.empty() || name.size() >= ng::kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push_pull of '", name, "': a tensor name must be 1 to ", ng::kMaxNameBytes - 1,
        " bytes"));
  }
  // Device rules, as the staging layer's: one GPU per worker, real device memory.
  {
    absl::MutexLock lock(&mu_);
    if (submit_device_ < 0) submit_device_ = in.device_id;
    if (in.device_id != submit_device_ || out.device_id != submit_device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push_pull of '", name, "': its tensors are on GPU ", in.device_id, " and ",
          out.device_id, ", but this worker reduces GPU tensors on GPU ", submit_device_,
          " (the device of its first GPU tensor)"));
    }
  }
  for (const TensorView* t : {&in, &out}) {
    absl::Status s = CheckTensorShape(t->shape, t->count);
    if (s.ok()) s = copier_->CheckPointer(t->data, t->device_id);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("push_pull of '", name, "': ",
                                                     t == &in ? "the input" : "the output",
                                                     ": ", s.message()));
    }
  }
  auto op = std::make_shared<Op>();
  op->name = std::string(name);
  op->in = in;
  op->out = out;
  op->priority = priority;
  op->parts = store_->NodePartsOf(name, in.count, in.dtype);
  op->submitted = absl::Now();
  op->deadline = op->submitted + options_.op_timeout;
  // Its push to the servers, which may start just before this deadline, has a store
  // operation's bound of its own (op_timeout, and PsStore's ten seconds to fail cleanly).
  op->handle->SetDeadline(
      op->deadline + options_.op_timeout + absl::Seconds(10) + options_.wait_grace,
      op->Describe());
  Handle h(op->handle);
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) {  // named like the operations it failed
    return absl::Status(broken_.code(),
                        absl::StrCat(op->Describe(), " failed: ", broken_.message()));
  }
  if (stopping_) {
    return absl::FailedPreconditionError(
        absl::StrCat(op->Describe(), ": the store was shut down"));
  }
  op->occurrence = occurrences_[op->name]++;
  ++unfinished_[op->name];
  incoming_.push_back(std::move(op));
  ++outstanding_;
  bell_->Ring();
  return h;
}

void NodeGpuReducer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  bell_->Ring();
  absl::MutexLock join(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

NodeGpuReducer::Stats NodeGpuReducer::stats() {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void NodeGpuReducer::Loop() {
  absl::Time stop_by = absl::InfiniteFuture();
  while (true) {
    absl::Time at;
    {
      absl::MutexLock lock(&mu_);
      if (!broken_.ok()) return;
      if (stopping_ && stop_by == absl::InfiniteFuture()) {
        stop_by = absl::Now() + options_.op_timeout;
      }
      const bool busy = pending_ || outstanding_ > 0 || stopping_;
      at = !incoming_.empty() ? absl::InfinitePast()
                              : last_round_ + (busy ? options_.cycle_time : idle_tick_);
    }
    bell_->Wait(at);
    if (absl::Now() > stop_by) {
      return Break(absl::DeadlineExceededError(absl::StrCat(
          "the store was shut down and its GPU push_pulls did not finish within ",
          absl::FormatDuration(options_.op_timeout))));
    }
    if (!Round()) break;
  }
  // Every local rank left together (or the reducer broke: then nothing is left).
  FailAll(absl::CancelledError("the store was shut down"), /*abort=*/false);
}

bool NodeGpuReducer::Round() {
  const bool leaving = TakeIncoming();
  // Deadlines, checked before the round so that a rank that lost a peer does not wait in
  // the exchange on top.
  const absl::Time now = absl::Now();
  if (!CheckDeadlines(now)) return false;
  RoundLists r;
  ListMine(now, leaving, &r);
  if (!Exchange(&r)) return false;
  ng::Plan plan = ng::Decide(r.all, layout_.local_rank, /*fusion_bytes=*/0);
  {
    absl::MutexLock lock(&mu_);
    ++stats_.rounds;
  }
  missing_.clear();
  for (const ng::Missing& m : plan.missing) {
    missing_[r.mine.entries[m.entry].name] = m.ranks;
  }
  if (!RunPlan(plan, r)) return false;
  {
    absl::MutexLock lock(&mu_);
    pending_ = plan.pending;
  }
  if (plan.leaving.empty()) return true;
  // This rank's work is done and the others know it: it goes. When another rank left,
  // nothing can run on the node any more (its collectives need every local rank): what is
  // pending and what comes fails, naming it, as on the CPU path.
  if (leaving) return false;
  const absl::Status left = absl::FailedPreconditionError(
      absl::StrCat(Who(plan.leaving), " of this node left the job (shut down its store); no "
                   "GPU push_pull of the node can run without ",
                   plan.leaving.size() == 1 ? "it" : "them"));
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = left;
  }
  FailAll(left, /*abort=*/false);
  return false;
}

bool NodeGpuReducer::TakeIncoming() {
  absl::MutexLock lock(&mu_);
  for (OpPtr& op : incoming_) by_name_[op->name].push_back(std::move(op));
  incoming_.clear();
  return stopping_ && outstanding_ == 0;
}

bool NodeGpuReducer::CheckDeadlines(absl::Time now) {
  for (auto& [name, q] : by_name_) {
    const OpPtr& op = q.front();
    if (now > op->deadline) {
      auto it = missing_.find(name);
      Break(absl::DeadlineExceededError(absl::StrCat(
          op->Describe(), " did not complete within ",
          absl::FormatDuration(options_.op_timeout),
          it == missing_.end() ? std::string(" on this node")
                               : absl::StrCat(": ", Who(it->second), " of this node ",
                                              it->second.size() == 1 ? "has" : "have",
                                              " not submitted it"))));
      return false;
    }
  }
  return true;
}

void NodeGpuReducer::ListMine(absl::Time now, bool leaving, RoundLists* r) {
  r->mine.leaving = leaving;
  size_t budget = kListBudget;
  for (auto& [name, q] : by_name_) {
    const OpPtr& op = q.front();
    ng::Entry e;
    e.kind = ng::OpKind::kPushPull;
    e.name = name;
    if (op->reduced) {
      if (!op->pushed.load(std::memory_order_acquire)) continue;  // step 3 still runs
      e.phase = kPushedPhase;
      // A push that failed here is listed as a broadcast, so that the node's ranks
      // disagree and all fail the operation (RunPlan).
      if (!op->push_status.ok()) {
        e.kind = ng::OpKind::kBroadcast;
        e.root = layout_.local_rank;
        r->my_errors.emplace_back(e.name, op->push_status);
      }
    }
    const size_t entry_bytes = e.name.size() + 64 + 8 * op->in.shape.ndim;
    if (entry_bytes > budget) break;
    budget -= entry_bytes;
    e.occurrence = op->occurrence;
    e.dtype = op->in.dtype;
    e.count = op->in.count;
    e.shape = op->in.shape;
    e.gpu = true;
    e.priority = op->priority;
    e.age_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(now - op->submitted));
    r->mine.entries.push_back(std::move(e));
    r->listed.push_back(op);
  }
}

bool NodeGpuReducer::Exchange(RoundLists* r) {
  std::string list;
  ng::Serialize(r->mine, layout_.local_rank, &list);
  // Twice the heartbeat timeout: a dead or hung local rank is named by the scheduler
  // first (the store then aborts the rounds with that); this bound is for a rank whose
  // process lives on but whose reducer thread stopped.
  auto views =
      exchange_->Allgather(PackRound(list, r->my_errors), 2 * options_.heartbeat_timeout);
  last_round_ = absl::Now();
  if (!views.ok()) {
    Break(absl::Status(views.status().code(),
                       absl::StrCat("the node's GPU reduction stopped: ",
                                    views.status().message())));
    return false;
  }
  r->errors.resize(layout_.local_size);
  for (int lr = 0; lr < layout_.local_size; ++lr) {
    absl::string_view bytes;
    absl::StatusOr<ng::RankList> l = absl::InvalidArgumentError("malformed message");
    if (UnpackRound((*views)[lr], &bytes, &r->errors[lr])) l = ng::Parse(bytes, lr);
    if (!l.ok()) {
      Break(absl::InternalError(absl::StrCat("the node's GPU reduction got a bad list from ",
                                             Who({lr}), ": ", l.status().message())));
      return false;
    }
    r->all.push_back(std::move(*l));
  }
  return true;
}

// The round's steps 2 and 4 each run as one NCCL group, in plan order (the same on every
// rank): the operations finishing first, then the new ones.
bool NodeGpuReducer::RunPlan(const ng::Plan& plan, const RoundLists& r) {
  std::vector<OpPtr> firsts, seconds;
  for (const ng::Action& a : plan.actions) {
    for (size_t idx : a.entries) {
      const OpPtr& op = r.listed[idx];
      if (a.type == ng::Action::Type::kAllreduce && a.entries.size() == 1) {
        (op->reduced ? seconds : firsts).push_back(op);
        continue;
      }
      if (a.type != ng::Action::Type::kFail) {
        Break(absl::InternalError(absl::StrCat(op->Describe(),
                                               ": unexpected plan step for the node")));
        return false;
      }
      const std::string& listed_name = r.mine.entries[idx].name;
      if (op->reduced) {
        Finish(op, FailedPush(op, listed_name, r.errors));
      } else {
        FailDisagreement(op, listed_name, r.all, a.error);
      }
    }
  }
  if (!seconds.empty()) RunSecond(seconds);
  if (!firsts.empty() && broken().ok()) RunFirst(firsts);
  return broken().ok();
}

void NodeGpuReducer::FailDisagreement(const OpPtr& op, const std::string& listed_name,
                                      const std::vector<negotiation::RankList>& lists,
                                      const absl::Status& error) {
  const absl::Status why(error.code(),
                         absl::StrCat("the node's local ranks disagree: ", error.message()));
  // Every rank fails its servers' rounds, so that the other nodes' workers hear of it at
  // once too; split as the shape with the most partitions any local rank sent, so that
  // every partition the other nodes push is failed, once (by its pusher).
  uint64_t count = op->in.count;
  DType dtype = op->in.dtype;
  size_t most = 0;
  for (const ng::RankList& l : lists) {
    for (const ng::Entry& e : l.entries) {
      if (e.name != listed_name || e.phase != 0) continue;
      const size_t n = store_->NodePartsOf(listed_name, e.count, e.dtype).size();
      if (n > most) {
        most = n;
        count = e.count;
        dtype = e.dtype;
      }
    }
  }
  (void)store_->FailNodeRoundAsync(op->name, count, dtype, why.message());
  Finish(op, why);
}

absl::Status NodeGpuReducer::FailedPush(
    const OpPtr& op, const std::string& listed_name,
    const std::vector<std::map<std::string, absl::Status>>& errors) const {
  if (!op->push_status.ok()) return op->push_status;
  for (int lr = 0; lr < layout_.local_size; ++lr) {
    auto it = errors[lr].find(listed_name);
    if (it != errors[lr].end()) {
      return absl::Status(it->second.code(),
                          absl::StrCat(it->second.message(), " (the push of ", Who({lr}),
                                       " of this node)"));
    }
  }
  return absl::InternalError("a push failed at another local rank");
}

absl::Status NodeGpuReducer::broken() {
  absl::MutexLock lock(&mu_);
  return broken_;
}

namespace {
// "push_pull of 'a' (…)", or "push_pulls of 'a' (…) and 3 others" for a group.
template <typename OpPtrs>
std::string DescribeGroup(const OpPtrs& ops) {
  if (ops.size() == 1) return ops[0]->Describe();
  return absl::StrCat(ops[0]->Describe(), " and ", ops.size() - 1, " other",
                      ops.size() == 2 ? "" : "s", " in one NCCL group");
}
}  // namespace

void NodeGpuReducer::RunSecond(const std::vector<OpPtr>& ops) {
  auto fail = [&](absl::string_view what, const absl::Status& s) {
    Break(absl::Status(s.code(),
                       absl::StrCat(DescribeGroup(ops), ": ", what, ": ", s.message())));
  };
  std::vector<uint64_t> tickets;
  absl::Time deadline = absl::InfiniteFuture();
  for (const OpPtr& op : ops) {
    deadline = std::min(deadline, op->deadline);
    if (!op->push_status.ok()) continue;  // (the node agreed it is fine everywhere)
    absl::Status s = StartCopies(op, DeviceCopier::Direction::kToDevice, &tickets);
    if (!s.ok()) return fail("copying the result back to the GPU", s);
  }
  absl::Status s = WaitCopies(tickets, deadline);
  if (!s.ok()) return fail("copying the result back to the GPU", s);
  std::vector<NodeTensor> tensors;
  for (const OpPtr& op : ops) {
    cache_.Release(op->name, op->staging);
    op->staging = {};
    tensors.push_back(NodeTensor{op->out.dtype, op->out.data, op->out.data, &op->parts});
  }
  s = collectives_->Broadcast(tensors, deadline);
  if (!s.ok()) return fail("broadcasting the result to the node's GPUs", s);
  {
    absl::MutexLock lock(&mu_);
    stats_.broadcasts += ops.size();
    ++stats_.groups;
  }
  for (const OpPtr& op : ops) Finish(op, absl::OkStatus());
}

void NodeGpuReducer::RunFirst(const std::vector<OpPtr>& ops) {
  auto fail = [&](absl::string_view what, const absl::Status& s) {
    Break(absl::Status(s.code(),
                       absl::StrCat(DescribeGroup(ops), ": ", what, ": ", s.message())));
  };
  if (device_ < 0) {
    device_ = ops[0]->in.device_id;
    absl::Status s = copier_->Bind(device_);
    if (s.ok()) s = collectives_->Open(device_, absl::Now() + options_.start_timeout);
    if (!s.ok()) {
      return Break(absl::Status(
          s.code(), absl::StrCat("the node's GPU communicator on GPU ", device_,
                                 " could not be set up: ", s.message())));
    }
  }
  std::vector<NodeTensor> tensors;
  absl::Time deadline = absl::InfiniteFuture();
  for (const OpPtr& op : ops) {
    deadline = std::min(deadline, op->deadline);
    tensors.push_back(NodeTensor{op->in.dtype, op->in.data, op->out.data, &op->parts});
  }
  absl::Status s = collectives_->Reduce(tensors, deadline);
  if (!s.ok()) return fail("summing on the node's GPUs", s);
  {
    absl::MutexLock lock(&mu_);
    stats_.reduces += ops.size();
    ++stats_.groups;
  }
  std::vector<uint64_t> tickets;
  for (const OpPtr& op : ops) {
    auto staging = cache_.Acquire(op->name, op->out.bytes());
    if (!staging.ok()) return fail("allocating pinned host memory", staging.status());
    op->staging = *staging;
    s = StartCopies(op, DeviceCopier::Direction::kToHost, &tickets);
    if (!s.ok()) return fail("copying to the host", s);
  }
  s = WaitCopies(tickets, deadline);
  if (!s.ok()) return fail("copying to the host", s);
  for (const OpPtr& op : ops) {
    op->reduced = true;
    TensorView host{op->staging.data, op->out.count, op->out.dtype};
    host.shape = op->in.shape;
    auto h = store_->PushPullNodeSumAsync(op->name, host, host, op->priority);
    if (!h.ok()) {
      op->push_status = h.status();
      op->pushed.store(true, std::memory_order_release);
      continue;
    }
    h->OnComplete([bell = bell_, op](const absl::Status& status) {
      op->push_status = status;
      op->pushed.store(true, std::memory_order_release);
      bell->Ring();
    });
  }
}

absl::Status NodeGpuReducer::StartCopies(const OpPtr& op, DeviceCopier::Direction direction,
                                         std::vector<uint64_t>* tickets) {
  const size_t es = DTypeSize(op->out.dtype);
  const bool to_host = direction == DeviceCopier::Direction::kToHost;
  for (const NodePart& p : op->parts) {
    if (p.pusher != layout_.local_rank || p.count == 0) continue;
    char* dev = static_cast<char*>(op->out.data) + p.offset * es;
    char* host = static_cast<char*>(op->staging.data) + p.offset * es;
    ASSIGN_OR_RETURN(uint64_t t, copier_->Start(direction, to_host ? host : dev,
                                                to_host ? dev : host, p.count * es));
    tickets->push_back(t);
  }
  absl::MutexLock lock(&mu_);
  stats_.host_allocations = cache_.allocations();
  return absl::OkStatus();
}

absl::Status NodeGpuReducer::WaitCopies(const std::vector<uint64_t>& tickets,
                                        absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    stats_.copies += tickets.size();
  }
  absl::Duration pause = absl::Microseconds(5);
  for (uint64_t t : tickets) {
    while (true) {
      ASSIGN_OR_RETURN(bool done, copier_->Poll(t));
      if (done) break;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the copy did not finish within ", absl::FormatDuration(options_.op_timeout)));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Microseconds(100));
    }
  }
  return absl::OkStatus();
}

void NodeGpuReducer::Finish(const OpPtr& op, const absl::Status& status) {
  if (op->staging.data != nullptr) cache_.Release(op->name, op->staging);
  op->staging = {};
  auto it = by_name_.find(op->name);
  if (it != by_name_.end() && !it->second.empty() && it->second.front() == op) {
    it->second.pop_front();
    if (it->second.empty()) by_name_.erase(it);
  }
  Completed(op, status);
}

void NodeGpuReducer::Completed(const OpPtr& op, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    auto it = unfinished_.find(op->name);
    if (--it->second == 0) unfinished_.erase(it);
  }
  op->handle->Complete(status.ok() ? status
                                   : absl::Status(status.code(),
                                                  absl::StrCat(op->Describe(), " failed: ",
                                                               status.message())));
}

void NodeGpuReducer::Abort(const absl::Status& status) {
  // Both are safe from any thread; the loop thread's waits end with an error and it
  // breaks (naming what it was doing); the cause is logged here.
  HPS_LOG(WARNING) << "stopping the node's GPU reduction: " << status.message();
  collectives_->Abort(status);
  exchange_->Abort(status);
  bell_->Ring();
}

bool NodeGpuReducer::Unfinished(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  return unfinished_.find(name) != unfinished_.end();
}

void NodeGpuReducer::FailAll(const absl::Status& status, bool abort) {
  {
    absl::MutexLock lock(&mu_);
    if (abort && broken_.ok()) broken_ = status;
    for (OpPtr& op : incoming_) by_name_[op->name].push_back(std::move(op));
    incoming_.clear();
  }
  if (abort) {
    HPS_LOG(ERROR) << status.message();
    collectives_->Abort(status);
    exchange_->Abort(status);
  }
  for (auto& [name, q] : by_name_) {
    for (const OpPtr& op : q) {
      // Its staging memory may still be written (a copy cut short, or step 3's push_pull,
      // which ends by its own deadline): it is not reused. `out` is only written by this
      // thread, so the handle can complete now.
      if (op->staging.data != nullptr) cache_.Abandon(op->staging);
      op->staging = {};
      Completed(op, status);
    }
  }
  by_name_.clear();
}

std::string NodeGpuReducer::Who(const std::vector<int>& local_ranks) const {
  std::vector<std::string> who;
  for (int lr : local_ranks) {
    who.push_back(absl::StrCat(lr, " (worker ", layout_.members.empty() ? lr : layout_.members[lr],
                               ")"));
  }
  return absl::StrCat(local_ranks.size() == 1 ? "local rank " : "local ranks ",
                      absl::StrJoin(who, ", "));
}

}  // namespace hybridps
