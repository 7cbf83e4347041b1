#include "worker/ps/local/local_reduce.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/partition.h"
#include "common/reduce.h"
#include "common/status.h"
#include "worker/ps/local/local_reduce_shm.h"


namespace hybridps {

using namespace local_reduce_shm;  // NOLINT: this file's own internals

absl::Time LocalReducer::Run(int e) {
  const int me = layout_.local_rank;
  Exec& x = exec_[e];
  // Drain the doorbell first: a ring that comes while we step is seen at the next poll.
  char sink[256];
  while (read(x.bells[me], sink, sizeof sink) > 0) {
  }
  while (true) {
    shared_->beats[me].fetch_add(1, std::memory_order_relaxed);
    TakeInbox(e);
    bool progress = false;
    for (auto it = x.tasks.begin(); it != x.tasks.end();) {
      const Pending::Stage before = it->stage;
      if (Step(*it)) {
        it = x.tasks.erase(it);
        progress = true;
      } else {
        progress |= it->stage != before;
        ++it;
      }
    }
    const absl::Time now = absl::Now();
    CheckLiveness(e, now);
    const absl::Time next = FailOverdue(e, now);
    if (!progress) return next;
  }
}

// Takes what other threads queued for executor e: an abort, new tasks, the server's
// replies to the pusher, cancellations.
void LocalReducer::TakeInbox(int e) {
  Exec& x = exec_[e];
  Inbox in;
  {
    absl::MutexLock lock(&x.mu);
    std::swap(in, x.inbox);
    x.inbox.aborted = in.aborted;  // sticky
    x.queued.store(false, std::memory_order_release);
  }
  if (!in.aborted.ok() && x.broken.ok()) {
    x.broken = in.aborted;
    for (auto it = x.tasks.begin(); it != x.tasks.end(); it = x.tasks.erase(it)) {
      Leave(*it, x.broken);
    }
  }
  const int me = layout_.local_rank;
  for (Task& t : in.submitted) {
    Pending p;
    p.task = std::move(t);
    p.bytes = p.task.count * DTypeSize(p.task.dtype);
    p.pusher = PusherOf(p.task.key, p.task.part,
                        p.task.op == wire::OP_BROADCAST ? p.task.root : -1) == me;
    p.slot = -1;  // looked up in the slot table when it is first advanced
    p.exec = e;
    if (Recording(timeline_)) p.submitted = absl::Now();
    x.tasks.push_back(std::move(p));
    if (!x.broken.ok()) {
      Leave(x.tasks.back(), x.broken);
      x.tasks.pop_back();
    }
  }
  for (Inbox::Pub& pub : in.published) {
    bool mine = false;
    for (Pending& t : x.tasks) {
      if (t.task.owner.get() == pub.owner && t.task.part == pub.part && !t.published) {
        t.published = true;
        t.pub_status = std::move(pub.status);
        t.payload = std::move(pub.payload);
        mine = true;
        break;
      }
    }
    if (!mine && e == kInline) {
      Queue(kThreaded, [&](Inbox& to) { to.published.push_back(std::move(pub)); });
    }
  }
  for (auto& [owner, status] : in.cancelled) {
    for (auto it = x.tasks.begin(); it != x.tasks.end();) {
      if (it->task.owner.get() == owner) {
        Leave(*it, status);
        it = x.tasks.erase(it);
      } else {
        ++it;
      }
    }
  }
}

// The other local ranks pump at least every heartbeat interval: one whose beat has not
// moved for heartbeat_timeout died or hangs, and breaks executor e (every task fails). One
// that shut its store down left the job: that breaks the executor only once it has work
// (which needs every local rank), so that a rank that trains longer, or evaluates after
// training, is not failed while it does not use the store.
void LocalReducer::CheckLiveness(int e, absl::Time now) {
  Exec& x = exec_[e];
  const int me = layout_.local_rank;
  for (int lr = 0; lr < layout_.local_size && x.broken.ok(); ++lr) {
    const uint64_t b = shared_->beats[lr].load(std::memory_order_relaxed);
    if (lr == me || b != x.last_beat[lr]) {
      x.last_beat[lr] = b;
      x.last_change[lr] = now;
    } else if (now - x.last_change[lr] > options_.heartbeat_timeout) {
      const bool left = shared_->left[lr].load(std::memory_order_acquire) != 0;
      if (left && x.tasks.empty()) continue;
      x.broken = left ? absl::FailedPreconditionError(absl::StrCat(
                            Who(lr), " (pid ", layout_.pids[lr], " on ", layout_.host,
                            ") left the job (shut down its store); no push_pull of the node "
                            "can run without it"))
                      : absl::UnavailableError(absl::StrCat(
                            Who(lr), " (pid ", layout_.pids[lr], " on ", layout_.host,
                            ") stopped: no sign of life in the node's shared memory for ",
                            absl::FormatDuration(options_.heartbeat_timeout),
                            "; its process died or hangs"));
      HPS_LOG(ERROR) << x.broken.message();
      for (auto it = x.tasks.begin(); it != x.tasks.end(); it = x.tasks.erase(it)) {
        Leave(*it, x.broken);
      }
      Event ev;
      ev.kind = Event::kBroken;
      ev.status = x.broken;
      Emit(e, std::move(ev));
    }
  }
}

// Fails executor e's tasks past their deadline, naming the local ranks they wait for (a
// pusher waiting for its server is the store's to time out). Returns when to run next.
absl::Time LocalReducer::FailOverdue(int e, absl::Time now) {
  Exec& x = exec_[e];
  absl::Time next = now + options_.heartbeat_interval;
  bool warned = false;
  for (auto it = x.tasks.begin(); it != x.tasks.end();) {
    Pending& t = *it;
    if (t.stage == Pending::kWaitPublish || t.task.deadline > now || t.slot < 0) {
      if (t.stage != Pending::kWaitPublish && t.task.deadline > now) {
        next = std::min(next, t.task.deadline);
        // HYBRIDPS_STALL_WARNING_MS: say whom the node waits for (one task per period).
        const absl::Duration waited = now - (t.task.deadline - options_.op_timeout);
        if (!warned && t.slot >= 0 && t.stage == Pending::kArrivals &&
            waited >= options_.stall_warning && now - x.last_stall_log >= options_.stall_warning) {
          warned = true;
          x.last_stall_log = now;
          HPS_LOG(WARNING) << "'" << t.task.name << "' partition " << t.task.part
                           << " has waited "
                           << absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(100)))
                           << " on this node: " << WhyOverdue(t) << " yet";
        }
      }
      ++it;
      continue;
    }
    Leave(t, absl::DeadlineExceededError(absl::StrCat(
                 "partition ", t.task.part, ": ", WhyOverdue(t), " within ",
                 absl::FormatDuration(options_.op_timeout))));
    it = x.tasks.erase(it);
  }
  return next;
}

// What an overdue task waits for.
std::string LocalReducer::WhyOverdue(const Pending& t) {
  const int me = layout_.local_rank;
  SlotHeader* s = SlotAt(shared_, t.slot);
  std::vector<std::string> missing;
  std::string why;
  {
    SlotLock lock(s);
    const uint64_t mask = t.stage == Pending::kArrivals ? s->arrived : s->joined;
    for (int lr = 0; lr < layout_.local_size; ++lr) {
      if (lr != me && !(mask >> lr & 1)) {
        missing.push_back(absl::StrCat(lr, " (worker ", layout_.members[lr], ")"));
      }
    }
    if (t.stage == Pending::kClaim) {
      why = absl::StrFormat(
          "its round %u is still in use by local ranks of node %d (local ranks %s have not "
          "joined it)", s->round, layout_.node, absl::StrJoin(missing, ", "));
    }
  }
  if (t.stage == Pending::kArrivals) {
    return absl::StrCat("local ranks ", absl::StrJoin(missing, ", "), " of node ",
                        layout_.node, " did not contribute");
  }
  if (t.stage != Pending::kClaim) {
    const int pusher = PusherOf(t.task.key, t.task.part,
                                t.task.op == wire::OP_BROADCAST ? t.task.root : -1);
    return absl::StrCat("the node's result did not arrive from ", Who(pusher),
                        " which pushes it",
                        missing.empty() ? "" : absl::StrCat(" (local ranks ",
                                                            absl::StrJoin(missing, ", "),
                                                            " have not joined)"));
  }
  return why;
}

void LocalReducer::ThreadLoop() {
  const int fd = exec_[kThreaded].bells[layout_.local_rank];
  uint64_t emitted = 0;
  while (!exit_.load()) {
    const absl::Time next = Run(kThreaded);
    if (exec_[kThreaded].emitted != emitted) {
      emitted = exec_[kThreaded].emitted;
      wake_();  // the owner takes its events
    }
    const absl::Duration wait =
        std::clamp(next - absl::Now(), absl::ZeroDuration(), options_.heartbeat_interval);
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1);
  }
}

// Advances one task as far as it can go now; true when it has ended (its event was sent).
// One function per stage (Pending::Stage); a stage that finishes goes on to the next at
// once.
bool LocalReducer::Step(Pending& t) {
  if (t.slot < 0) {
    auto slot = FindSlot(t.task.key, t.task.part);
    if (!slot.ok()) {
      Leave(t, slot.status());
      return true;
    }
    t.slot = *slot;
  }
  switch (t.stage) {
    case Pending::kClaim:
      return StepClaim(t);
    case Pending::kArrivals:
      return StepArrivals(t);
    case Pending::kWaitPublish:
      return StepWaitPublish(t);
    case Pending::kWaitResult:
      return StepWaitResult(t);
    case Pending::kCopyOut:
      return StepCopyOut(t);
  }
  return false;
}

void LocalReducer::Record(const Pending& t, const char* what, absl::Time start) const {
  timeline_->Span(absl::StrCat("'", t.task.name, "' partition ", t.task.part), what, start,
                  absl::Now(), timeline_lane_,
                  absl::StrCat("\"bytes\": ", t.bytes, ", \"round\": ", t.task.round));
}

uint64_t LocalReducer::FullMask() const {
  const int L = layout_.local_size;
  return L == 64 ? ~uint64_t{0} : (uint64_t{1} << L) - 1;
}

// Local rank lr's contribution region of t's partition; the result region is lr == L.
char* LocalReducer::Region(const Pending& t, int lr) const {
  if (t.base == nullptr) return nullptr;
  const Task& k = t.task;
  const size_t total = k.total_count * DTypeSize(k.dtype);
  return t.base + static_cast<size_t>(lr) * total + k.offset * DTypeSize(k.dtype);
}

void LocalReducer::EmitPush(const Pending& t, const char* data, std::string fail) {
  Event e;
  e.kind = Event::kPush;
  e.owner = t.task.owner;
  e.part = t.task.part;
  e.data = data;
  e.fail = std::move(fail);
  Emit(t.exec, std::move(e));
}

// The slot failed: the pusher still tells the server when the local ranks disagreed, so
// that the other nodes fail at once instead of at their deadline.
bool LocalReducer::FailFromSlot(Pending& t, const absl::Status& status, bool local_mismatch) {
  if (t.pusher && local_mismatch) EmitPush(t, nullptr, std::string(status.message()));
  Leave(t, status);
  return true;
}

LocalReducer::Join LocalReducer::JoinSlot(Pending& t, absl::Status* failed, bool* mismatch) {
  const int me = layout_.local_rank;
  const uint64_t bit = uint64_t{1} << me;
  const Task& k = t.task;
  SlotHeader* s = SlotAt(shared_, t.slot);
  bool join = true;
  bool ring = false;  // the others must hear of it (a mismatch failed the round)
  {
    SlotLock lock(s);
    if (s->used && (s->in_use ? k.round < s->round : k.round <= s->round)) {
      // A late local rank: its round already ended without it (it failed, or the others
      // gave up on it). The pusher still forwards a local mismatch to the servers (see
      // FailFromSlot).
      *mismatch = k.round == s->round && s->state == kFailed && s->local_mismatch != 0;
      *failed = k.round == s->round && s->state == kFailed
                    ? SlotStatus(s)
                    : absl::AbortedError(absl::StrCat(
                          "partition ", k.part, " round ", k.round, " of '", k.name,
                          "' was abandoned by the node (it is at round ", s->round, ")"));
      join = false;
    } else if (!s->in_use) {
      s->in_use = 1;
      s->used = 1;
      s->round = k.round;
      s->op = k.op;
      s->dtype = static_cast<uint32_t>(k.dtype);
      s->root = k.root;
      s->count = k.count;
      s->total_count = k.total_count;
      s->ndim = k.shape.ndim;
      std::copy(k.shape.dims, k.shape.dims + kMaxShapeDims, s->dims);
      s->shape_first = me;
      s->first = me;
      s->state = kOpen;
      s->local_mismatch = 0;
      s->joined = bit;
      s->arrived = s->done = 0;
    } else if (s->round == k.round) {
      s->joined |= bit;
      const std::string what = Disagreement(*s, k);
      if (!what.empty() && s->state == kOpen) {
        SetFailed(s, absl::InvalidArgumentError(absl::StrCat(
                         "mismatched ", OpName(s->op), " of tensor '", k.name, "' partition ",
                         k.part, ": ", what)));
        s->local_mismatch = 1;
        ring = true;
      } else if (what.empty() && s->ndim == 0 && k.shape.known()) {
        s->ndim = k.shape.ndim;
        std::copy(k.shape.dims, k.shape.dims + kMaxShapeDims, s->dims);
        s->shape_first = me;
      }
    } else {
      return Join::kWait;  // the previous round is still being copied out
    }
    if (failed->ok() && s->state == kFailed) {
      *failed = SlotStatus(s);
      *mismatch = s->local_mismatch != 0;
    }
  }
  t.joined = join;
  if (ring) RingAll();
  return failed->ok() ? Join::kJoined : Join::kFailed;
}

// How this rank's task differs from the slot's first claim ("" when it agrees).
std::string LocalReducer::Disagreement(const SlotHeader& s, const Task& k) const {
  const int me = layout_.local_rank;
  const std::string first = Who(s.first);
  if (s.op != static_cast<uint32_t>(k.op)) {
    return absl::StrCat(Who(me), " called ", OpName(k.op), " but ", first, " called ",
                        OpName(s.op));
  }
  if (s.total_count != k.total_count || s.dtype != static_cast<uint32_t>(k.dtype) ||
      s.count != k.count) {
    return absl::StrCat(Who(me), " sent ", DescribeTensor(k.shape, k.total_count, k.dtype),
                        " but ", first, " sent ",
                        DescribeTensor(TensorShape{}, s.total_count,
                                       static_cast<DType>(s.dtype)));
  }
  TensorShape given;  // the first shape of the round, from local rank s.shape_first
  given.ndim = static_cast<int>(std::clamp<int64_t>(s.ndim, 0, kMaxShapeDims));
  std::copy(s.dims, s.dims + kMaxShapeDims, given.dims);
  if (!given.Agrees(k.shape)) {
    return absl::StrCat(Who(me), " sent ", DescribeTensor(k.shape, k.total_count, k.dtype),
                        " but ", Who(static_cast<int>(s.shape_first)), " sent ",
                        DescribeTensor(given, s.total_count, static_cast<DType>(s.dtype)));
  }
  if (k.op == wire::OP_BROADCAST && s.root != k.root) {
    return absl::StrCat(Who(me), " broadcasts from root ", k.root, " but ", first,
                        " from root ", s.root);
  }
  return "";
}

bool LocalReducer::StepClaim(Pending& t) {
  const Task& k = t.task;
  absl::Status failed;
  bool mismatch = false;
  switch (JoinSlot(t, &failed, &mismatch)) {
    case Join::kWait:
      return false;
    case Join::kFailed:
      return FailFromSlot(t, failed, mismatch);
    case Join::kJoined:
      break;
  }
  const size_t total = k.total_count * DTypeSize(k.dtype);
  if (total > 0) {
    auto base = TensorSegment(k.key, total);
    if (!base.ok()) {
      Leave(t, base.status());
      return true;
    }
    t.base = *base;
  }
  // The pusher pushes only once every local rank has arrived, for a broadcast too: each
  // arrival was compared with the slot's first claim while the round was open, so a rank
  // that disagrees fails the round before anyone's result exists.
  if (t.pusher) {
    t.stage = Pending::kArrivals;
    return Step(t);
  }
  const int me = layout_.local_rank;
  if (k.op == wire::OP_PUSHPULL && t.bytes > 0) std::memcpy(Region(t, me), k.in, t.bytes);
  {
    SlotHeader* s = SlotAt(shared_, t.slot);
    SlotLock lock(s);
    s->arrived |= uint64_t{1} << me;
  }
  Ring(t.exec);
  // Its part of the local reduction: its data in the node's memory for the pusher to sum.
  if (Recording(timeline_)) Record(t, "local contribution", t.submitted);
  t.stage = Pending::kWaitResult;
  return false;
}

bool LocalReducer::StepArrivals(Pending& t) {
  const Task& k = t.task;
  const int me = layout_.local_rank;
  const int L = layout_.local_size;
  SlotHeader* s = SlotAt(shared_, t.slot);
  absl::Status failed;
  bool mismatch = false;
  {
    SlotLock lock(s);
    if (s->state == kFailed) {
      failed = SlotStatus(s);
      mismatch = s->local_mismatch != 0;
    } else if (s->arrived != (FullMask() & ~(uint64_t{1} << me))) {
      return false;
    }
  }
  if (!failed.ok()) return FailFromSlot(t, failed, mismatch);
  char* result = Region(t, L);
  if (k.op == wire::OP_BROADCAST) {
    const bool root = k.root == layout_.members[me];
    if (root && t.bytes > 0) std::memcpy(result, k.in, t.bytes);
    // A push without data is a non-root's: an empty tensor's root, whose pointer may be
    // null, still pushes its (empty) data.
    static const char kNoBytes = 0;
    if (Recording(timeline_)) Record(t, "local reduce", t.submitted);  // every local rank arrived
    EmitPush(t, root ? (k.in != nullptr ? k.in : &kNoBytes) : nullptr, "");
    t.stage = Pending::kWaitPublish;
    return false;
  }
  if (t.bytes > 0) {
    auto src = [&](int lr) -> const void* { return lr == me ? k.in : Region(t, lr); };
    Sum2(k.dtype, result, src(0), src(1), k.count);
    for (int lr = 2; lr < L; ++lr) SumInto(k.dtype, result, src(lr), k.count);
  }
  if (Recording(timeline_)) Record(t, "local reduce", t.submitted);  // the node's sum is ready
  EmitPush(t, result, "");
  t.stage = Pending::kWaitPublish;
  return false;
}

bool LocalReducer::StepWaitPublish(Pending& t) {
  if (!t.published) return false;
  SlotHeader* s = SlotAt(shared_, t.slot);
  if (!t.pub_status.ok()) {
    {
      SlotLock lock(s);
      if (s->state == kOpen) SetFailed(s, t.pub_status);
    }
    Leave(t, t.pub_status);
    return true;
  }
  if (t.payload && t.bytes > 0) {
    std::memcpy(Region(t, layout_.local_size), t.payload->data(), t.bytes);
  }
  t.payload.reset();
  {
    SlotLock lock(s);
    if (s->state == kOpen) s->state = kReady;
  }
  Ring(t.exec);
  t.stage = Pending::kCopyOut;
  return Step(t);
}

bool LocalReducer::StepWaitResult(Pending& t) {
  SlotHeader* s = SlotAt(shared_, t.slot);
  absl::Status failed;
  {
    SlotLock lock(s);
    if (s->state == kOpen) return false;
    if (s->state == kFailed) failed = SlotStatus(s);
  }
  if (!failed.ok()) return FailFromSlot(t, failed, false);
  t.stage = Pending::kCopyOut;
  return Step(t);
}

bool LocalReducer::StepCopyOut(Pending& t) {
  const Task& k = t.task;
  const int me = layout_.local_rank;
  const bool root = k.op == wire::OP_BROADCAST && k.root == layout_.members[me];
  const absl::Time copying = Recording(timeline_) ? absl::Now() : absl::InfinitePast();
  if (!root && t.bytes > 0) std::memcpy(k.out, Region(t, layout_.local_size), t.bytes);
  if (Recording(timeline_)) Record(t, "local broadcast", copying);  // the node's result, copied out
  SlotHeader* s = SlotAt(shared_, t.slot);
  bool freed;
  {
    SlotLock lock(s);
    s->done |= uint64_t{1} << me;
    MaybeFree(s, FullMask());
    freed = s->in_use == 0;
  }
  if (freed) Ring(t.exec);  // a local rank may wait to claim the slot for its next round
  Event e;
  e.kind = Event::kDone;
  e.owner = std::move(t.task.owner);
  e.part = k.part;
  Emit(t.exec, std::move(e));
  return true;
}

// The slot of (key, part) for the job: found or registered in the table (open addressing).
absl::StatusOr<int> LocalReducer::FindSlot(uint64_t key, uint32_t part) {
  const int n = options_.local_slots;
  const uint64_t h = key ^ (uint64_t{part} * 0x9e3779b97f4a7c15ull);
  SpinLock(shared_->table_lock);
  absl::StatusOr<int> found = absl::ResourceExhaustedError(absl::StrCat(
      "node ", layout_.node, " has used all ", n, " slots of its local reduction (one per "
      "tensor partition): raise HYBRIDPS_LOCAL_SLOTS"));
  for (int i = 0; i < n; ++i) {
    const int at = static_cast<int>((h + static_cast<uint64_t>(i)) % static_cast<uint64_t>(n));
    SlotHeader* s = SlotAt(shared_, at);
    if (!s->registered) {
      s->registered = 1;
      s->key = key;
      s->part = part;
      found = at;
      break;
    }
    if (s->key == key && s->part == part) {
      found = at;
      break;
    }
  }
  shared_->table_lock.store(0, std::memory_order_release);
  return found;
}

void LocalReducer::Leave(Pending& t, const absl::Status& status) {
  if (t.joined && t.slot >= 0) {
    const int me = layout_.local_rank;
    const int L = layout_.local_size;
    const uint64_t full = L == 64 ? ~uint64_t{0} : (uint64_t{1} << L) - 1;
    SlotHeader* s = SlotAt(shared_, t.slot);
    {
      SlotLock lock(s);
      if (s->state == kOpen) {
        SetFailed(s, absl::Status(status.code(), absl::StrCat(Who(me), " failed: ",
                                                              RelayedCause(status.message()))));
      }
      s->done |= uint64_t{1} << me;
      MaybeFree(s, full);
    }
    t.joined = false;
    RingAll();
  }
  Event e;
  e.kind = Event::kDone;
  e.owner = std::move(t.task.owner);
  e.part = t.task.part;
  e.status = status;
  Emit(t.exec, std::move(e));
}

}  // namespace hybridps
