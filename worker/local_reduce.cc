#include "worker/local_reduce.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

namespace hybridps {
namespace {

constexpr uint64_t kMagic = 0x6879627270736c72ull;  // "hybrpslr"
constexpr int kMaxLocal = 64;
constexpr size_t kPage = 4096;
constexpr absl::Duration kMaxSleep = absl::Milliseconds(50);

enum SlotState : uint32_t { kOpen = 0, kReady = 1, kFailed = 2 };

// One reduction slot's bookkeeping; fields after `lock` only under it.
struct alignas(64) SlotHeader {
  std::atomic<uint32_t> lock;
  uint32_t registered;  // (key, part) below are this slot's for the job (table lock)
  uint32_t in_use;
  uint32_t used;        // a round has run: `round` and `state` tell how the last one ended
  uint64_t key;
  uint64_t round;
  uint32_t part;
  uint32_t op;
  uint32_t dtype;
  int32_t root;
  int32_t first;  // local rank that claimed the slot
  uint32_t state;
  uint32_t local_mismatch;  // failed because the local ranks disagreed
  int32_t code;
  uint64_t count;
  uint64_t total_count;
  uint64_t joined, arrived, done;  // bit masks by local rank
  char msg[400];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

uint64_t Fnv(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

std::string OpName(uint32_t op) { return op == wire::OP_BROADCAST ? "broadcast" : "push_pull"; }

// Takes a spin lock in shared memory. It is held only for a few field updates, never
// across a copy or a call, so one held for 10 s belongs to a process that died inside
// that window: it is taken over (logged) rather than waited for forever.
void SpinLock(std::atomic<uint32_t>& lock) {
  absl::Time give_up = absl::InfiniteFuture();
  for (int n = 0; lock.exchange(1, std::memory_order_acquire) != 0; ++n) {
    if (n < 64) continue;
    sched_yield();
    if (n % 1024 != 0) continue;
    const absl::Time now = absl::Now();
    if (give_up == absl::InfiniteFuture()) {
      give_up = now + absl::Seconds(10);
    } else if (now > give_up) {
      HPS_LOG(ERROR) << "a shared-memory lock of the local reduction was held for 10s (its "
                        "holder died); taking it over";
      return;
    }
  }
}

class SlotLock {
 public:
  explicit SlotLock(SlotHeader* s) : s_(s) { SpinLock(s_->lock); }
  ~SlotLock() { s_->lock.store(0, std::memory_order_release); }
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;

 private:
  SlotHeader* s_;
};

void SetFailed(SlotHeader* s, const absl::Status& status) {
  s->state = kFailed;
  s->code = static_cast<int32_t>(status.code());
  const size_t n = std::min(status.message().size(), sizeof s->msg - 1);
  std::memcpy(s->msg, status.message().data(), n);
  s->msg[n] = '\0';
}

absl::Status SlotStatus(const SlotHeader* s) {
  return absl::Status(static_cast<absl::StatusCode>(s->code), s->msg);
}

void MaybeFree(SlotHeader* s, uint64_t full) {
  if ((s->state != kFailed && s->done == full) ||
      (s->state == kFailed && (s->done & s->joined) == s->joined)) {
    s->in_use = 0;
  }
}

}  // namespace

struct LocalReducer::Shared {
  std::atomic<uint64_t> magic;
  uint64_t job_id;
  uint32_t local_size;
  uint32_t slots;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> detached;
  std::atomic<uint32_t> table_lock;  // guards the keys of the slot table
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint64_t> beats[kMaxLocal];  // liveness, by local rank
};

absl::StatusOr<NodeLayout> NodeLayoutFromWelcome(const wire::Welcome& w, int rank) {
  NodeLayout l;
  l.job_id = w.job_id();
  l.num_nodes = w.num_nodes() > 0 ? w.num_nodes() : w.num_workers();
  if (w.workers_size() != w.num_workers() || rank < 0 || rank >= w.workers_size()) {
    return absl::InternalError("the scheduler's welcome does not list every worker");
  }
  const wire::NodeInfo& me = w.workers(rank);
  l.node = w.num_nodes() > 0 ? me.node() : rank;
  l.local_rank = me.local_rank();
  l.local_size = std::max(1, me.local_size());
  l.host = me.host();
  l.node_of.resize(w.num_workers());
  std::vector<std::string> said;
  std::vector<int> by_local(l.local_size, -1);
  bool ok = true;
  for (int r = 0; r < w.num_workers(); ++r) {
    const wire::NodeInfo& n = w.workers(r);
    l.node_of[r] = w.num_nodes() > 0 ? n.node() : r;
    if (l.node_of[r] != l.node) continue;
    said.push_back(absl::StrCat("worker ", r, " on ", n.host(), " local rank ", n.local_rank(),
                                " of ", n.local_size()));
    if (n.local_size() != l.local_size || n.local_rank() < 0 ||
        n.local_rank() >= l.local_size || by_local[n.local_rank()] >= 0) {
      ok = false;
    } else {
      by_local[n.local_rank()] = r;
    }
  }
  if (!ok || std::count(by_local.begin(), by_local.end(), -1) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", l.node, " (", l.host, ") must have ", l.local_size,
        " workers with local ranks 0..", l.local_size - 1, " but has: ",
        absl::StrJoin(said, "; "),
        " (check HYBRIDPS_LOCAL_RANK, HYBRIDPS_LOCAL_SIZE and HYBRIDPS_NODE_ID)"));
  }
  l.members = by_local;
  for (int r : l.members) l.pids.push_back(w.workers(r).pid());
  return l;
}

absl::StatusOr<std::unique_ptr<LocalReducer>> LocalReducer::Create(const Options& options,
                                                                   const NodeLayout& layout,
                                                                   Notify notify) {
  if (layout.local_size > kMaxLocal) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_size ", layout.local_size, " is more than ", kMaxLocal));
  }
  std::unique_ptr<LocalReducer> r(new LocalReducer(options, layout, std::move(notify)));
  RETURN_IF_ERROR(r->Attach());
  r->thread_ = std::thread([p = r.get()] {
    pthread_setname_np(pthread_self(), "hps-local");
    p->Loop();
  });
  return r;
}

absl::Status LocalReducer::Attach() {
  const int L = layout_.local_size;
  const size_t header = RoundUp(sizeof(Shared), kPage);
  const size_t slot_headers = RoundUp(options_.local_slots * sizeof(SlotHeader), kPage);
  map_bytes_ = header + slot_headers;
  // One job at a time per scheduler endpoint (an inproc:// one: per process), so segments
  // under this prefix with another job id are left over from a job that crashed.
  std::string where = absl::StrCat(options_.SchedulerEndpoint(), "|", options_.job_token);
  if (absl::StartsWith(where, "inproc://")) absl::StrAppend(&where, "|", getpid());
  const std::string prefix =
      absl::StrFormat("hybridps-%016x-n%d-", Fnv(where), layout_.node);
  shm_name_ = absl::StrFormat("/%s%016x", prefix, layout_.job_id);
  job_prefix_ = shm_name_.substr(1) + "-";
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  const int me = layout_.local_rank;
  int fd = -1;
  if (me == 0) {
    if (DIR* dir = opendir("/dev/shm")) {
      while (dirent* e = readdir(dir)) {
        if (absl::StartsWith(e->d_name, prefix)) {
          HPS_LOG(INFO) << "removing stale shared memory /" << e->d_name;
          shm_unlink(absl::StrCat("/", e->d_name).c_str());
        }
      }
      closedir(dir);
    }
    fd = shm_open(shm_name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("shm_open(", shm_name_, ") for node ",
                                              layout_.node, ": ", strerror(errno)));
    }
    // Reserve the memory now: a full /dev/shm is an error here, not a SIGBUS later.
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(map_bytes_));
    if (err != 0) {
      close(fd);
      shm_unlink(shm_name_.c_str());
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", map_bytes_, " bytes of shared memory for node ", layout_.node,
          "'s local reduction (", strerror(err), "): lower HYBRIDPS_LOCAL_SLOTS (",
          options_.local_slots, ") or enlarge /dev/shm"));
    }
  } else {
    while (true) {
      fd = shm_open(shm_name_.c_str(), O_RDWR, 0600);
      struct stat st;
      if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= map_bytes_) {
        break;
      }
      if (fd >= 0) close(fd);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "local rank 0 (worker ", layout_.members[0], ") of node ", layout_.node,
            " did not create the node's shared memory ", shm_name_, " within ",
            absl::FormatDuration(options_.start_timeout)));
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    if (me == 0) shm_unlink(shm_name_.c_str());
    return absl::InternalError(absl::StrCat("mmap of ", map_bytes_, " bytes of ", shm_name_,
                                            ": ", strerror(errno)));
  }
  shared_ = static_cast<Shared*>(p);
  if (me == 0) {
    shared_->job_id = layout_.job_id;
    shared_->local_size = static_cast<uint32_t>(L);
    shared_->slots = static_cast<uint32_t>(options_.local_slots);
    shared_->magic.store(kMagic, std::memory_order_release);
  } else {
    while (shared_->magic.load(std::memory_order_acquire) != kMagic) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "node ", layout_.node, "'s shared memory ", shm_name_, " was never initialised"));
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (shared_->job_id != layout_.job_id || shared_->local_size != static_cast<uint32_t>(L) ||
        shared_->slots != static_cast<uint32_t>(options_.local_slots)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", layout_.node, "'s local ranks disagree on the shared memory layout (",
          shared_->local_size, " ranks and ", shared_->slots, " slots at local rank 0; here ",
          L, " and ", options_.local_slots,
          "): give every local rank the same HYBRIDPS_LOCAL_SLOTS"));
    }
  }
  shared_->attached.fetch_add(1, std::memory_order_acq_rel);
  if (me == 0) {
    while (shared_->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(L)) {
      if (absl::Now() >= deadline) {
        shm_unlink(shm_name_.c_str());
        return absl::DeadlineExceededError(absl::StrCat(
            "only ", shared_->attached.load(), " of node ", layout_.node, "'s ", L,
            " local ranks attached to its shared memory within ",
            absl::FormatDuration(options_.start_timeout)));
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    // Everyone has it mapped: the name can go, nothing is left behind whatever happens.
    shm_unlink(shm_name_.c_str());
  }
  next_peer_check_ = absl::Now() + options_.heartbeat_timeout;
  return absl::OkStatus();
}

LocalReducer::~LocalReducer() {
  exit_.store(true);
  if (thread_.joinable()) {
    Ring();
    thread_.join();
  }
  for (auto& [id, seg] : segments_) munmap(seg.first, seg.second);
  if (shared_) {
    // The last local rank to leave removes the job's tensor segments (a crash leaves them
    // to the next job's start, which removes every segment of this endpoint and node).
    if (shared_->detached.fetch_add(1) + 1 == static_cast<uint32_t>(layout_.local_size)) {
      RemoveSegments(job_prefix_);
    }
    munmap(shared_, map_bytes_);
  }
}

void LocalReducer::RemoveSegments(const std::string& prefix) {
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) {
      if (absl::StartsWith(e->d_name, prefix)) shm_unlink(absl::StrCat("/", e->d_name).c_str());
    }
    closedir(dir);
  }
}

// The shared memory of one tensor (all its partitions): one region per local rank for the
// contributions and one for the result, each the tensor's size. Named after the tensor's
// key and size, so local ranks that disagree on the size never share (they meet in the
// slot table, which names the mismatch).
absl::StatusOr<char*> LocalReducer::TensorSegment(uint64_t key, uint64_t bytes) {
  const auto id = std::make_pair(key, bytes);
  auto it = segments_.find(id);
  if (it != segments_.end()) return static_cast<char*>(it->second.first);
  const size_t size = RoundUp(bytes * (layout_.local_size + 1), kPage);
  const std::string name = absl::StrFormat("/%s%016x-%d", job_prefix_, key, bytes);
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("shm_open(", name, "): ", strerror(errno)));
  }
  // Every local rank reserves the same size (idempotent): a full /dev/shm is an error
  // here rather than a SIGBUS later.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", size, " bytes of shared memory (", strerror(err),
        ") for a tensor of ", bytes, " bytes on node ", layout_.node,
        " (local size + 1 copies of every tensor): enlarge /dev/shm"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of ", name, ": ", strerror(errno)));
  }
  segments_.emplace(id, std::make_pair(p, size));
  return static_cast<char*>(p);
}

int LocalReducer::PusherOf(uint64_t key, uint32_t part, int root_rank) const {
  if (root_rank >= 0 && layout_.node_of[root_rank] == layout_.node) {
    return static_cast<int>(std::find(layout_.members.begin(), layout_.members.end(),
                                      root_rank) - layout_.members.begin());
  }
  return static_cast<int>((key + part) % static_cast<uint64_t>(layout_.local_size));
}

void LocalReducer::Ring() {
  shared_->doorbell.fetch_add(1, std::memory_order_acq_rel);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&shared_->doorbell), FUTEX_WAKE, INT_MAX,
          nullptr, nullptr, 0);
}

void LocalReducer::Submit(Task task) {
  {
    absl::MutexLock lock(&mu_);
    inbox_.submitted.push_back(std::move(task));
  }
  Ring();
}

void LocalReducer::Publish(const void* owner, uint32_t part, absl::Status status,
                           std::optional<Frame> payload) {
  {
    absl::MutexLock lock(&mu_);
    inbox_.published.push_back(Inbox::Pub{owner, part, std::move(status), std::move(payload)});
  }
  Ring();
}

void LocalReducer::Cancel(const void* owner, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    inbox_.cancelled.emplace_back(owner, status);
  }
  Ring();
}

void LocalReducer::Abort(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (inbox_.aborted.ok()) inbox_.aborted = status;
  }
  Ring();
}

std::string LocalReducer::Who(int local_rank) const {
  return absl::StrCat("local rank ", local_rank, " (worker ", layout_.members[local_rank],
                      ") of node ", layout_.node);
}

namespace {
SlotHeader* SlotAt(LocalReducer::Shared* shared, int i) {
  char* base = reinterpret_cast<char*>(shared) + RoundUp(sizeof(LocalReducer::Shared), kPage);
  return reinterpret_cast<SlotHeader*>(base) + i;
}
}  // namespace

void LocalReducer::Loop() {
  const int me = layout_.local_rank;
  std::vector<uint64_t> last_beat(layout_.local_size, 0);
  std::vector<absl::Time> last_change(layout_.local_size, absl::Now());
  while (!exit_.load()) {
    const uint32_t bell = shared_->doorbell.load(std::memory_order_acquire);
    shared_->beats[me].fetch_add(1, std::memory_order_relaxed);
    Inbox in;
    {
      absl::MutexLock lock(&mu_);
      std::swap(in, inbox_);
      inbox_.aborted = in.aborted;  // sticky
    }
    if (!in.aborted.ok() && broken_.ok()) {
      broken_ = in.aborted;
      for (auto it = tasks_.begin(); it != tasks_.end(); it = tasks_.erase(it)) {
        Leave(*it, broken_);
      }
    }
    for (Task& t : in.submitted) {
      Pending p;
      p.task = std::move(t);
      p.bytes = p.task.count * DTypeSize(p.task.dtype);
      p.pusher = PusherOf(p.task.key, p.task.part,
                          p.task.op == wire::OP_BROADCAST ? p.task.root : -1) == me;
      p.slot = -1;  // looked up in the slot table when it is first advanced
      tasks_.push_back(std::move(p));
      if (!broken_.ok()) {
        Leave(tasks_.back(), broken_);
        tasks_.pop_back();
      }
    }
    for (Inbox::Pub& pub : in.published) {
      for (Pending& t : tasks_) {
        if (t.task.owner.get() == pub.owner && t.task.part == pub.part && !t.published) {
          t.published = true;
          t.pub_status = std::move(pub.status);
          t.payload = std::move(pub.payload);
          break;
        }
      }
    }
    for (auto& [owner, status] : in.cancelled) {
      for (auto it = tasks_.begin(); it != tasks_.end();) {
        if (it->task.owner.get() == owner) {
          Leave(*it, status);
          it = tasks_.erase(it);
        } else {
          ++it;
        }
      }
    }
    bool progress = false;
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      const Pending::Stage before = it->stage;
      if (Step(*it)) {
        it = tasks_.erase(it);
        progress = true;
      } else {
        progress |= it->stage != before;
        ++it;
      }
    }
    absl::Time now = absl::Now();
    // Liveness of the other local ranks: their reducer threads beat at least every 50 ms.
    for (int lr = 0; lr < layout_.local_size && broken_.ok(); ++lr) {
      const uint64_t b = shared_->beats[lr].load(std::memory_order_relaxed);
      if (lr == me || b != last_beat[lr]) {
        last_beat[lr] = b;
        last_change[lr] = now;
      } else if (now - last_change[lr] > options_.heartbeat_timeout) {
        broken_ = absl::UnavailableError(absl::StrCat(
            Who(lr), " (pid ", layout_.pids[lr], " on ", layout_.host,
            ") stopped: no sign of life in the node's shared memory for ",
            absl::FormatDuration(options_.heartbeat_timeout), "; its process died or hangs"));
        HPS_LOG(ERROR) << broken_.message();
        for (auto it = tasks_.begin(); it != tasks_.end(); it = tasks_.erase(it)) {
          Leave(*it, broken_);
        }
        Event e;
        e.kind = Event::kBroken;
        e.status = broken_;
        notify_(std::move(e));
      }
    }
    // Deadlines (a pusher waiting for its server is the store's to time out).
    absl::Time next = now + kMaxSleep;
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      Pending& t = *it;
      if (t.stage == Pending::kWaitPublish || t.task.deadline > now) {
        if (t.stage != Pending::kWaitPublish) next = std::min(next, t.task.deadline);
        ++it;
        continue;
      }
      std::string why;
      if (t.slot < 0) {
        ++it;
        continue;
      }
      SlotHeader* s = SlotAt(shared_, t.slot);
      std::vector<std::string> missing;
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
              "its round %u is still in use by local ranks of node %d (local ranks %s have "
              "not joined it)", s->round, layout_.node, absl::StrJoin(missing, ", "));
        }
      }
      if (t.stage == Pending::kArrivals) {
        why = absl::StrCat("local ranks ", absl::StrJoin(missing, ", "), " of node ",
                           layout_.node, " did not contribute");
      } else if (t.stage != Pending::kClaim) {
        const int pusher = PusherOf(t.task.key, t.task.part,
                                    t.task.op == wire::OP_BROADCAST ? t.task.root : -1);
        why = absl::StrCat("the node's result did not arrive from ", Who(pusher),
                           " which pushes it",
                           missing.empty() ? "" : absl::StrCat(" (local ranks ",
                                                               absl::StrJoin(missing, ", "),
                                                               " have not joined)"));
      }
      Leave(t, absl::DeadlineExceededError(absl::StrCat(
                   "partition ", t.task.part, ": ", why, " within ",
                   absl::FormatDuration(options_.op_timeout))));
      it = tasks_.erase(it);
    }
    if (progress) continue;
    const absl::Duration wait = std::clamp(next - absl::Now(), absl::ZeroDuration(), kMaxSleep);
    const timespec ts = absl::ToTimespec(wait);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&shared_->doorbell), FUTEX_WAIT, bell, &ts,
            nullptr, 0);
  }
  for (auto it = tasks_.begin(); it != tasks_.end(); it = tasks_.erase(it)) {
    Leave(*it, absl::CancelledError("the store was shut down"));
  }
}

// Advances one task as far as it can go now; true when it has ended (its event was sent).
bool LocalReducer::Step(Pending& t) {
  const int me = layout_.local_rank;
  const int L = layout_.local_size;
  const uint64_t bit = uint64_t{1} << me;
  const uint64_t full = L == 64 ? ~uint64_t{0} : (uint64_t{1} << L) - 1;
  const Task& k = t.task;
  if (t.slot < 0) {
    auto slot = FindSlot(k.key, k.part);
    if (!slot.ok()) {
      Leave(t, slot.status());
      return true;
    }
    t.slot = *slot;
  }
  SlotHeader* s = SlotAt(shared_, t.slot);
  const size_t total = k.total_count * DTypeSize(k.dtype);
  const size_t offset = k.offset * DTypeSize(k.dtype);
  char* result = t.base ? t.base + static_cast<size_t>(L) * total + offset : nullptr;
  auto contribution = [&](int lr) { return t.base + static_cast<size_t>(lr) * total + offset; };
  auto push = [&](const char* data, std::string fail) {
    Event e;
    e.kind = Event::kPush;
    e.owner = k.owner;
    e.part = k.part;
    e.data = data;
    e.fail = std::move(fail);
    notify_(std::move(e));
  };
  // The slot failed: the pusher still tells the server when the local ranks disagreed, so
  // that the other nodes fail at once instead of at their deadline.
  auto fail_from_slot = [&](const absl::Status& status, bool local_mismatch) {
    if (t.pusher && local_mismatch) push(nullptr, std::string(status.message()));
    Leave(t, status);
    return true;
  };
  switch (t.stage) {
    case Pending::kClaim: {
      absl::Status failed;
      bool mismatch = false;
      bool join = true;
      {
        SlotLock lock(s);
        if (s->used && (s->in_use ? k.round < s->round : k.round <= s->round)) {
          // A late local rank: its round already ended without it (it failed, or the
          // others gave up on it).
          // The pusher still forwards a local mismatch to the servers (see fail_from_slot).
          mismatch = k.round == s->round && s->state == kFailed && s->local_mismatch != 0;
          failed = k.round == s->round && s->state == kFailed
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
          s->first = me;
          s->state = kOpen;
          s->local_mismatch = 0;
          s->joined = bit;
          s->arrived = s->done = 0;
        } else if (s->round == k.round) {
          s->joined |= bit;
          std::string what;
          const std::string first = Who(s->first);
          if (s->op != static_cast<uint32_t>(k.op)) {
            what = absl::StrCat(Who(me), " called ", OpName(k.op), " but ", first, " called ",
                                OpName(s->op));
          } else if (s->total_count != k.total_count ||
                     s->dtype != static_cast<uint32_t>(k.dtype) || s->count != k.count) {
            what = absl::StrCat(Who(me), " sent ", k.total_count, " ", DTypeName(k.dtype),
                                " elements but ", first, " sent ", s->total_count, " ",
                                DTypeName(static_cast<DType>(s->dtype)), " elements");
          } else if (k.op == wire::OP_BROADCAST && s->root != k.root) {
            what = absl::StrCat(Who(me), " broadcasts from root ", k.root, " but ", first,
                                " from root ", s->root);
          }
          if (!what.empty() && s->state == kOpen) {
            SetFailed(s, absl::InvalidArgumentError(absl::StrCat(
                             "mismatched ", OpName(s->op), " of tensor '", k.name,
                             "' partition ", k.part, ": ", what)));
            s->local_mismatch = 1;
          }
        } else {
          return false;  // the previous round is still being copied out
        }
        if (!failed.ok()) {
          // not joined: nothing to leave
        } else if (s->state == kFailed) {
          failed = SlotStatus(s);
          mismatch = s->local_mismatch != 0;
        }
      }
      t.joined = join;
      Ring();
      if (!failed.ok()) return fail_from_slot(failed, mismatch);
      if (total > 0) {
        auto base = TensorSegment(k.key, total);
        if (!base.ok()) {
          Leave(t, base.status());
          return true;
        }
        t.base = *base;
        result = t.base + static_cast<size_t>(L) * total + offset;
      }
      if (k.op == wire::OP_PUSHPULL) {
        if (t.pusher) {
          t.stage = Pending::kArrivals;
          return Step(t);
        }
        if (t.bytes > 0) std::memcpy(contribution(me), k.in, t.bytes);
        {
          SlotLock lock(s);
          s->arrived |= bit;
        }
        Ring();
        t.stage = Pending::kWaitResult;
        return false;
      }
      if (t.pusher) {  // broadcast
        const bool root = k.root == layout_.members[me];
        if (root && t.bytes > 0) std::memcpy(result, k.in, t.bytes);
        push(root ? k.in : nullptr, "");
        t.stage = Pending::kWaitPublish;
        return false;
      }
      t.stage = Pending::kWaitResult;
      return false;
    }
    case Pending::kArrivals: {
      absl::Status failed;
      bool mismatch = false;
      {
        SlotLock lock(s);
        if (s->state == kFailed) {
          failed = SlotStatus(s);
          mismatch = s->local_mismatch != 0;
        } else if (s->arrived != (full & ~bit)) {
          return false;
        }
      }
      if (!failed.ok()) return fail_from_slot(failed, mismatch);
      if (t.bytes > 0) {
        auto src = [&](int lr) -> const void* { return lr == me ? k.in : contribution(lr); };
        Sum2(k.dtype, result, src(0), src(1), k.count);
        for (int lr = 2; lr < L; ++lr) SumInto(k.dtype, result, src(lr), k.count);
      }
      push(result, "");
      t.stage = Pending::kWaitPublish;
      return false;
    }
    case Pending::kWaitPublish: {
      if (!t.published) return false;
      if (!t.pub_status.ok()) {
        {
          SlotLock lock(s);
          if (s->state == kOpen) SetFailed(s, t.pub_status);
        }
        Leave(t, t.pub_status);
        return true;
      }
      if (t.payload && t.bytes > 0) std::memcpy(result, t.payload->data(), t.bytes);
      t.payload.reset();
      {
        SlotLock lock(s);
        if (s->state == kOpen) s->state = kReady;
      }
      Ring();
      t.stage = Pending::kCopyOut;
      return Step(t);
    }
    case Pending::kWaitResult: {
      absl::Status failed;
      {
        SlotLock lock(s);
        if (s->state == kOpen) return false;
        if (s->state == kFailed) failed = SlotStatus(s);
      }
      if (!failed.ok()) return fail_from_slot(failed, false);
      t.stage = Pending::kCopyOut;
      return Step(t);
    }
    case Pending::kCopyOut: {
      const bool root = k.op == wire::OP_BROADCAST && k.root == layout_.members[me];
      if (!root && t.bytes > 0) std::memcpy(k.out, result, t.bytes);
      {
        SlotLock lock(s);
        s->done |= bit;
        MaybeFree(s, full);
      }
      Ring();
      Event e;
      e.kind = Event::kDone;
      e.owner = std::move(t.task.owner);
      e.part = k.part;
      notify_(std::move(e));
      return true;
    }
  }
  return false;
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
        SetFailed(s, absl::Status(status.code(),
                                  absl::StrCat(Who(me), " failed: ", status.message())));
      }
      s->done |= uint64_t{1} << me;
      MaybeFree(s, full);
    }
    t.joined = false;
    Ring();
  }
  Event e;
  e.kind = Event::kDone;
  e.owner = std::move(t.task.owner);
  e.part = t.task.part;
  e.status = status;
  notify_(std::move(e));
}

}  // namespace hybridps
