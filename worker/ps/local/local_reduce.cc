#include "worker/ps/local/local_reduce.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
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
#include "worker/node/shm_segment.h"
#include "worker/ps/local/local_reduce_shm.h"


namespace hybridps {

using namespace local_reduce_shm;  // NOLINT: this file's own internals

absl::StatusOr<std::unique_ptr<LocalReducer>> LocalReducer::Create(const Options& options,
                                                                   const NodeLayout& layout,
                                                                   Notify notify, Wake wake,
                                                                   Timeline* timeline,
                                                                   int timeline_lane) {
  if (layout.local_size > kMaxLocal) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_size ", layout.local_size, " is more than ", kMaxLocal));
  }
  std::unique_ptr<LocalReducer> r(
      new LocalReducer(options, layout, std::move(notify), std::move(wake)));
  r->timeline_ = timeline;
  r->timeline_lane_ = timeline_lane;
  RETURN_IF_ERROR(r->Attach());
  r->thread_ = std::thread([p = r.get()] {
    pthread_setname_np(pthread_self(), "hps-local");
    p->ThreadLoop();
  });
  return r;
}

absl::Status LocalReducer::Attach() {
  const size_t header = RoundUp(sizeof(Shared), kPage);
  const size_t slot_headers = RoundUp(options_.local_slots * sizeof(SlotHeader), kPage);
  map_bytes_ = header + slot_headers;
  // One job at a time per scheduler endpoint (an inproc:// one: per process), so segments
  // under this prefix with another job id are left over from a job that crashed.
  std::string where = absl::StrCat(options_.SchedulerEndpoint(), "|", options_.job_token);
  if (absl::StartsWith(where, "inproc://")) absl::StrAppend(&where, "|", getpid());
  const std::string prefix =
      absl::StrFormat("hybridps-%016x-n%d-", Fnv1a64(where), layout_.node);
  shm_name_ = absl::StrFormat("/%s%016x", prefix, layout_.job_id);
  job_prefix_ = shm_name_.substr(1) + "-";
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  RETURN_IF_ERROR(MapSegment(prefix, deadline));
  return OpenDoorbells(deadline);
}

// Local rank 0 creates the node's segment (after removing those of crashed jobs under
// `stale_prefix`) and lays it out; the others map it and check that they agree on it.
absl::Status LocalReducer::MapSegment(const std::string& stale_prefix, absl::Time deadline) {
  const int L = layout_.local_size;
  const int me = layout_.local_rank;
  absl::StatusOr<void*> mapped;
  if (me == 0) {
    if (DIR* dir = opendir("/dev/shm")) {
      while (dirent* e = readdir(dir)) {
        if (absl::StartsWith(e->d_name, stale_prefix)) {
          HPS_LOG(INFO) << "removing stale shared memory /" << e->d_name;
          shm_unlink(absl::StrCat("/", e->d_name).c_str());
        }
      }
      closedir(dir);
    }
    mapped = CreateShmSegment(shm_name_, map_bytes_);
    if (absl::IsResourceExhausted(mapped.status())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "node ", layout_.node, "'s local reduction: ", mapped.status().message(),
          ": lower HYBRIDPS_LOCAL_SLOTS (", options_.local_slots, ") or enlarge /dev/shm"));
    }
  } else {
    mapped = AttachShmSegment(shm_name_, map_bytes_, deadline);
    if (absl::IsDeadlineExceeded(mapped.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "local rank 0 (worker ", layout_.members[0], ") of node ", layout_.node,
          " did not create the node's shared memory ", shm_name_, " within ",
          absl::FormatDuration(options_.start_timeout)));
    }
  }
  if (!mapped.ok()) {
    return absl::Status(mapped.status().code(),
                        absl::StrCat("node ", layout_.node, "'s local reduction: ",
                                     mapped.status().message()));
  }
  void* p = *mapped;
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
  return absl::OkStatus();
}

// Doorbells: a FIFO per local rank and executor, next to the segment. A local rank rings
// the others by writing a byte to theirs; each executor polls its own (the inline one
// with the I/O thread's sockets), so a wake-up from another process reaches the thread
// that acts on it. Every FIFO is opened read-write and non-blocking by every local rank:
// a write never blocks, and never raises SIGPIPE when the owner died (we hold a read end
// ourselves).
absl::Status LocalReducer::OpenDoorbells(absl::Time deadline) {
  const int L = layout_.local_size;
  const int me = layout_.local_rank;
  for (int e : {kInline, kThreaded}) {
    exec_[e].bells.assign(L, -1);
    exec_[e].last_beat.assign(L, 0);
    exec_[e].last_change.assign(L, absl::Now());
    if (mkfifo(BellPath(e, me).c_str(), 0600) != 0 && errno != EEXIST) {
      return absl::InternalError(
          absl::StrCat("mkfifo(", BellPath(e, me), "): ", strerror(errno)));
    }
    RETURN_IF_ERROR(OpenBell(e, me));
  }
  // Every local rank waits for all to attach (their doorbells exist then), opens the
  // others' doorbells and says so; local rank 0 then removes every name: everyone has
  // what it needs mapped or open, so nothing is left behind whatever happens.
  auto unlink_all = [&] {
    shm_unlink(shm_name_.c_str());
    for (int lr = 0; lr < L; ++lr) {
      for (int e : {kInline, kThreaded}) unlink(BellPath(e, lr).c_str());
    }
  };
  shared_->attached.fetch_add(1, std::memory_order_acq_rel);
  absl::Status s = WaitAll(shared_->attached, deadline, "attached to its shared memory");
  for (int lr = 0; lr < L && s.ok(); ++lr) {
    for (int e : {kInline, kThreaded}) {
      if (lr != me && s.ok()) s = OpenBell(e, lr);
    }
  }
  if (s.ok()) {
    shared_->bells_open.fetch_add(1, std::memory_order_acq_rel);
    if (me == 0) s = WaitAll(shared_->bells_open, deadline, "opened the node's doorbells");
  }
  if (me == 0) unlink_all();
  return s;
}

std::string LocalReducer::BellPath(int e, int local_rank) const {
  return absl::StrCat("/dev/shm/", job_prefix_, e == kInline ? "bell" : "bellt", local_rank);
}

absl::Status LocalReducer::OpenBell(int e, int local_rank) {
  const std::string path = BellPath(e, local_rank);
  const int fd = open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open the doorbell ", path, " of ",
                                            Who(local_rank), ": ", strerror(errno)));
  }
  exec_[e].bells[local_rank] = fd;
  return absl::OkStatus();
}

// Waits until `counter` (in the node's segment) counts every local rank.
absl::Status LocalReducer::WaitAll(const std::atomic<uint32_t>& counter, absl::Time deadline,
                                   absl::string_view what) const {
  const int L = layout_.local_size;
  while (counter.load(std::memory_order_acquire) < static_cast<uint32_t>(L)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", counter.load(), " of node ", layout_.node, "'s ", L, " local ranks ", what,
          " within ", absl::FormatDuration(options_.start_timeout)));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

LocalReducer::~LocalReducer() {
  if (shared_) shared_->left[layout_.local_rank].store(1, std::memory_order_release);
  if (thread_.joinable()) {
    exit_.store(true);
    const char b = 1;
    (void)!write(exec_[kThreaded].bells[layout_.local_rank], &b, 1);
    thread_.join();
  }
  for (Exec& x : exec_) {
    for (auto it = x.tasks.begin(); it != x.tasks.end(); it = x.tasks.erase(it)) {
      Leave(*it, absl::CancelledError("the store was shut down"));
    }
    for (int fd : x.bells) {
      if (fd >= 0) close(fd);
    }
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
  absl::MutexLock lock(&seg_mu_);
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
  return NodePusherOf(key, part, layout_.local_size);
}

void LocalReducer::Ring(int e) {
  // A full pipe already holds a wake-up; a departed rank's pipe fills up and stays full.
  const char b = 1;
  for (int lr = 0; lr < layout_.local_size; ++lr) {
    if (lr != layout_.local_rank) (void)!write(exec_[e].bells[lr], &b, 1);
  }
}

void LocalReducer::Emit(int e, Event ev) {
  ++exec_[e].emitted;
  notify_(std::move(ev));
}

void LocalReducer::RingAll() {
  Ring(kInline);
  Ring(kThreaded);
}

// Queues work for executor e; the threaded one is woken (the inline one runs at the
// owner's next Pump).
void LocalReducer::Queue(int e, const std::function<void(Inbox&)>& add) {
  {
    absl::MutexLock lock(&exec_[e].mu);
    add(exec_[e].inbox);
    exec_[e].queued.store(true, std::memory_order_release);
  }
  if (e == kThreaded) {
    const char b = 1;
    (void)!write(exec_[e].bells[layout_.local_rank], &b, 1);
  }
}

void LocalReducer::Submit(Task task) {
  // Every local rank puts a tensor on the same executor (same size, same option), so
  // their doorbells reach each other.
  const int e = task.total_count * DTypeSize(task.dtype) <= options_.local_inline_bytes
                    ? kInline
                    : kThreaded;
  Queue(e, [&](Inbox& in) { in.submitted.push_back(std::move(task)); });
}

// To the inline executor, which hands what is not its own to the threaded one.
void LocalReducer::Publish(const void* owner, uint32_t part, absl::Status status,
                           std::optional<Frame> payload) {
  Queue(kInline, [&](Inbox& in) {
    in.published.push_back(Inbox::Pub{owner, part, std::move(status), std::move(payload)});
  });
}

void LocalReducer::Cancel(const void* owner, const absl::Status& status) {
  for (int e : {kInline, kThreaded}) {
    Queue(e, [&](Inbox& in) { in.cancelled.emplace_back(owner, status); });
  }
}

void LocalReducer::Abort(const absl::Status& status) {
  for (int e : {kInline, kThreaded}) {
    Queue(e, [&](Inbox& in) {
      if (in.aborted.ok()) in.aborted = status;
    });
  }
}

std::string LocalReducer::Who(int local_rank) const {
  return absl::StrCat("local rank ", local_rank, " (worker ", layout_.members[local_rank],
                      ") of node ", layout_.node);
}

}  // namespace hybridps
