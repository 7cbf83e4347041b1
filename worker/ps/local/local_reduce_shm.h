// Internal to the local reduction (local_reduce.cc: setting up the node's shared memory;
// local_reduce_loop.cc: Pump): the layout of the node's segment and the
// helpers that work on its slots.
#ifndef HYBRIDPS_WORKER_PS_LOCAL_LOCAL_REDUCE_SHM_H_
#define HYBRIDPS_WORKER_PS_LOCAL_LOCAL_REDUCE_SHM_H_

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/log.h"
#include "worker/ps/local/local_reduce.h"

namespace hybridps {
namespace local_reduce_shm {

inline constexpr uint64_t kMagic = 0x6879627270736c72ull;  // "hybrpslr"
inline constexpr int kMaxLocal = 64;
inline constexpr size_t kPage = 4096;

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
  int64_t ndim;  // the first shape given this round (TensorShape), 0: none yet
  int64_t dims[kMaxShapeDims];
  int64_t shape_first;  // the local rank that gave it
  uint64_t joined, arrived, done;  // bit masks by local rank
  char msg[400];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

inline std::string OpName(uint32_t op) {
  return op == wire::OP_BROADCAST ? "broadcast" : "push_pull";
}

// Takes a spin lock in shared memory. It is held only for a few field updates, never
// across a copy or a call, so one held for 10 s belongs to a process that died inside
// that window: it is taken over (logged) rather than waited for forever.
inline void SpinLock(std::atomic<uint32_t>& lock) {
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

inline void SetFailed(SlotHeader* s, const absl::Status& status) {
  s->state = kFailed;
  s->code = static_cast<int32_t>(status.code());
  const size_t n = std::min(status.message().size(), sizeof s->msg - 1);
  std::memcpy(s->msg, status.message().data(), n);
  s->msg[n] = '\0';
}

// A failure passed from rank to rank gathers a prefix at each step ("push_pull of 'w'
// (12 float32 elements) failed: local rank 1 (worker 1) of node 0 failed: ..."); the
// slot's message has room for the cause, so the relays' prefixes are dropped.
inline absl::string_view RelayedCause(absl::string_view msg) {
  constexpr absl::string_view kFailed = " failed: ";
  for (;;) {
    const bool relay = absl::StartsWith(msg, "push_pull of '") ||
                       absl::StartsWith(msg, "broadcast of '") ||
                       absl::StartsWith(msg, "local rank ");
    const size_t at = relay ? msg.find(kFailed) : absl::string_view::npos;
    if (at == absl::string_view::npos) return msg;
    msg.remove_prefix(at + kFailed.size());
  }
}

inline absl::Status SlotStatus(const SlotHeader* s) {
  return absl::Status(static_cast<absl::StatusCode>(s->code), s->msg);
}

inline void MaybeFree(SlotHeader* s, uint64_t full) {
  if ((s->state != kFailed && s->done == full) ||
      (s->state == kFailed && (s->done & s->joined) == s->joined)) {
    s->in_use = 0;
  }
}

}  // namespace local_reduce_shm

struct LocalReducer::Shared {
  std::atomic<uint64_t> magic;
  uint64_t job_id;
  uint32_t local_size;
  uint32_t slots;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> detached;
  std::atomic<uint32_t> bells_open;  // local ranks that opened every doorbell
  std::atomic<uint32_t> table_lock;  // guards the keys of the slot table
  alignas(64) std::atomic<uint64_t> beats[local_reduce_shm::kMaxLocal];  // liveness, by local rank
  // 1 once the local rank shut its store down (left the job in order), by local rank: a
  // beat that stops then is a departure, not a death.
  alignas(64) std::atomic<uint32_t> left[local_reduce_shm::kMaxLocal];
};

inline local_reduce_shm::SlotHeader* SlotAt(LocalReducer::Shared* shared, int i) {
  char* base = reinterpret_cast<char*>(shared) + local_reduce_shm::RoundUp(sizeof(LocalReducer::Shared), local_reduce_shm::kPage);
  return reinterpret_cast<local_reduce_shm::SlotHeader*>(base) + i;
}

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PS_LOCAL_LOCAL_REDUCE_SHM_H_
