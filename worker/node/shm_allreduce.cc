#include "worker/node/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/partition.h"
#include "common/reduce.h"
#include "common/status.h"
#include "worker/node/shm_segment.h"

namespace hybridps {
namespace {

constexpr uint64_t kMagic = 0x6879627073617273ull;  // "hybpsars"
constexpr int kMaxLocal = 256;
constexpr size_t kReasonBytes = 512;  // of an abort's error, shared with the other ranks
constexpr uint64_t kTooBig = ~uint64_t{0};  // an exchange's length: the message did not fit
constexpr size_t kPage = 4096;
// Spins before a barrier yields: a few microseconds, less than a futex round trip, and
// short enough not to starve the rank it waits for on a machine with few cores.
constexpr int kSpins = 256;
// Then it yields its CPU (sched_yield: another thread that is ready there runs, else this
// one goes on at once) for a while before it sleeps. Longer than a futex wake-up: a rank
// that sleeps at every barrier makes its peer's next barrier wait for its wake-up, and the
// ranks then lock into taking turns at sleeping (2-3x slower small allreduces); yielding
// rather than spinning leaves the CPU to a rank, or the application's threads, that need
// it. How long: kYieldLong while the node's ranks are no more than the CPUs a rank may
// run on, so that a peer that shares this rank's CPU for a moment (unbound threads) does
// its chunk and this rank goes on without a sleep between; kYieldShort when the ranks
// outnumber the CPUs, where a waiting rank that keeps yielding takes turns from the ranks
// it waits for.
constexpr absl::Duration kYieldLong = absl::Microseconds(500);
constexpr absl::Duration kYieldShort = absl::Microseconds(50);

// The CPUs this process may run on (1 when it cannot tell).
int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration at_most) {
  const int64_t ns = std::max<int64_t>(1000, absl::ToInt64Nanoseconds(at_most));
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct ShmAllreduce::Header {
  std::atomic<uint64_t> magic;  // stored last by the creator
  uint32_t local_size;
  uint32_t reserved;
  uint64_t chunk_bytes;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> aborted;  // 1 + the local rank that aborted; 0: none
  // Why (the aborting rank's error: its code and the first kReasonBytes of its message),
  // once reason_bytes is set.
  std::atomic<uint32_t> reason_bytes;
  uint32_t reason_code;
  char reason[kReasonBytes];
  // The barrier: each rank counts the barriers it arrived at in a cache line of its own
  // (only it writes there) and waits until every other rank's count is as high. Arriving
  // is one store; while no rank sleeps, no line is written by two ranks.
  struct alignas(64) Arrivals {
    std::atomic<uint64_t> count;
  };
  Arrivals reached[kMaxLocal];
  // Bumped, and FUTEX_WAKE'd, by the rank that completes a barrier while some rank sleeps
  // (or by Abort).
  alignas(64) std::atomic<uint32_t> wake;
  alignas(64) std::atomic<uint32_t> sleepers;  // ranks in (or about to enter) FUTEX_WAIT
};
static_assert(sizeof(ShmAllreduce::Header::Arrivals) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

namespace {

size_t HeaderBytes() { return RoundUp(sizeof(ShmAllreduce::Header), kPage); }
size_t ExchangeBytes(int local_size) {
  return 2 * static_cast<size_t>(local_size) * ShmAllreduce::kExchangeBytes;
}
size_t TotalBytes(int local_size, size_t chunk_bytes) {
  return HeaderBytes() + ExchangeBytes(local_size) +
         static_cast<size_t>(local_size + 1) * chunk_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmAllreduce>> ShmAllreduce::Open(const std::string& name,
                                                                int local_rank, int local_size,
                                                                size_t chunk_bytes,
                                                                absl::Time deadline) {
  if (local_size < 2 || local_size > kMaxLocal || local_rank < 0 || local_rank >= local_size ||
      chunk_bytes == 0 || chunk_bytes % kPage != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory allreduce: local rank ", local_rank, " of ", local_size,
                     ", chunks of ", chunk_bytes, " bytes"));
  }
  const size_t total = TotalBytes(local_size, chunk_bytes);
  absl::StatusOr<void*> base = local_rank == 0 ? CreateShmSegment(name, total)
                                               : AttachShmSegment(name, total, deadline);
  if (!base.ok()) {
    return absl::Status(base.status().code(),
                        absl::StrCat("shared-memory allreduce: ", base.status().message()));
  }
  std::unique_ptr<ShmAllreduce> me(new ShmAllreduce(local_rank, local_size, chunk_bytes));
  me->header_ = static_cast<Header*>(*base);
  me->mapped_bytes_ = total;
  Header* h = me->header_;
  if (local_rank == 0) {
    h->local_size = static_cast<uint32_t>(local_size);
    h->chunk_bytes = chunk_bytes;
    h->magic.store(kMagic, std::memory_order_release);
  }
  auto fail = [&](absl::Status s) {
    shm_unlink(name.c_str());
    return s;
  };
  while (h->magic.load(std::memory_order_acquire) != kMagic) {
    if (WallNow() >= deadline) {
      return fail(absl::DeadlineExceededError(
          absl::StrCat("shared-memory allreduce: ", name, " was never initialised")));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  if (h->local_size != static_cast<uint32_t>(local_size) || h->chunk_bytes != chunk_bytes) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "shared-memory allreduce: ", name, " is laid out for ", h->local_size,
        " local ranks and chunks of ", h->chunk_bytes, " bytes; this rank expects ", local_size,
        " and ", chunk_bytes)));
  }
  h->attached.fetch_add(1, std::memory_order_acq_rel);
  while (h->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(local_size)) {
    if (WallNow() >= deadline) {
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "shared-memory allreduce: ", h->attached.load(), " of ", local_size,
          " local ranks attached to ", name, " in time")));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  // Everyone has it mapped: the name is not needed any more (nothing is left behind if a
  // process dies later).
  if (local_rank == 0) shm_unlink(name.c_str());
  return me;
}

ShmAllreduce::ShmAllreduce(int local_rank, int local_size, size_t chunk_bytes)
    : local_rank_(local_rank),
      local_size_(local_size),
      yield_for_(local_size <= UsableCpus() ? kYieldLong : kYieldShort),
      chunk_bytes_(chunk_bytes) {}

ShmAllreduce::~ShmAllreduce() {
  if (header_ != nullptr) munmap(header_, mapped_bytes_);
}

char* ShmAllreduce::Region(int i) const {
  return reinterpret_cast<char*>(header_) + HeaderBytes() + ExchangeBytes(local_size_) +
         static_cast<size_t>(i) * chunk_bytes_;
}

char* ShmAllreduce::ExchangeArea(int parity, int rank) const {
  return reinterpret_cast<char*>(header_) + HeaderBytes() +
         (static_cast<size_t>(parity) * local_size_ + rank) * kExchangeBytes;
}

absl::StatusOr<std::vector<absl::string_view>> ShmAllreduce::Allgather(
    absl::string_view mine, absl::Duration timeout) {
  std::vector<absl::string_view> all;
  RETURN_IF_ERROR(Allgather(mine, timeout, &all));
  return all;
}

absl::Status ShmAllreduce::Allgather(absl::string_view mine, absl::Duration timeout,
                                     std::vector<absl::string_view>* all) {
  const bool fits = mine.size() <= kMessageBytes;
  if (fits) std::memcpy(NextMessage(), mine.data(), mine.size());
  return Gather(fits ? mine.size() : kTooBig, timeout, all);
}

absl::Status ShmAllreduce::AllgatherWritten(size_t bytes, absl::Duration timeout,
                                            std::vector<absl::string_view>* all) {
  if (bytes > kMessageBytes) {
    // The caller's mistake: the peers must not wait for this rank until their timeout.
    return Failed(absl::InternalError(absl::StrCat(
        "shared-memory allreduce: a negotiation message of ", bytes,
        " bytes written in place (room: ", kMessageBytes, ")")));
  }
  return Gather(bytes, timeout, all);
}

absl::Status ShmAllreduce::Gather(uint64_t len, absl::Duration timeout,
                                  std::vector<absl::string_view>* all) {
  // Two areas take turns: a rank writes area p again only after the next exchange's
  // barrier, which a rank reaches after it is done with what it read from area p (the
  // store reads a round's messages only in that round).
  const int parity = static_cast<int>(exchanges_++ % 2);
  std::memcpy(ExchangeArea(parity, local_rank_), &len, sizeof len);
  RETURN_IF_ERROR(Barrier(Until{absl::InfiniteFuture(), timeout}, "negotiation"));
  all->resize(local_size_);
  for (int r = 0; r < local_size_; ++r) {
    const char* area = ExchangeArea(parity, r);
    uint64_t n = 0;
    std::memcpy(&n, area, sizeof n);
    if (n == kTooBig) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "local rank ", r, "'s negotiation message is over ", kMessageBytes, " bytes"));
    }
    if (n > kMessageBytes) {
      return Failed(absl::DataLossError(absl::StrCat(
          "shared-memory allreduce: local rank ", r, " wrote a negotiation message of ", n,
          " bytes")));
    }
    (*all)[r] = absl::string_view(area + sizeof n, n);
  }
  return absl::OkStatus();
}

void ShmAllreduce::Abort(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (abort_status_.ok()) abort_status_ = why;
  }
  aborted_.store(true, std::memory_order_release);
  uint32_t none = 0;
  if (header_->aborted.compare_exchange_strong(none, static_cast<uint32_t>(local_rank_ + 1))) {
    const size_t n = std::min(why.message().size(), kReasonBytes);
    std::memcpy(header_->reason, why.message().data(), n);
    header_->reason_code = static_cast<uint32_t>(why.code());
    header_->reason_bytes.store(static_cast<uint32_t>(n), std::memory_order_release);
  }
  // Wakes the sleepers; the counts stay as they are, so a barrier that completed before
  // still reads as completed (its ranks may already act on its data). A rank about to
  // sleep looks at the flag after it read the wake word, so it cannot sleep through this.
  header_->wake.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&header_->wake);
}

absl::Status ShmAllreduce::Failed(absl::Status s) {
  Abort(s);
  return s;
}

absl::Status ShmAllreduce::Barrier(Until until, absl::string_view step) {
  Header* h = header_;
  auto aborted = [&]() -> absl::Status {
    if (aborted_.load(std::memory_order_acquire)) {
      absl::MutexLock lock(&mu_);
      return abort_status_;
    }
    const uint32_t by = h->aborted.load(std::memory_order_acquire);
    if (by == 0) return absl::OkStatus();
    // The aborting rank's code when it said why (a deadline stays a deadline), else
    // Unavailable.
    // Written by another process: never trusted past the reason's room.
    const uint32_t n = std::min<uint32_t>(h->reason_bytes.load(std::memory_order_acquire),
                                          kReasonBytes);
    const bool said = n > 0 && h->reason_code > 0 &&
                      h->reason_code <= static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);
    return absl::Status(
        said ? static_cast<absl::StatusCode>(h->reason_code) : absl::StatusCode::kUnavailable,
        absl::StrCat("shared-memory allreduce: local rank ", by - 1, " of this node stopped",
                     said ? absl::StrCat(": ", absl::string_view(h->reason, n))
                          : std::string(" (its operation failed or its store broke)")));
  };
  if (absl::Status s = aborted(); !s.ok()) return s;
  std::atomic<uint64_t>& own = h->reached[local_rank_].count;
  const uint64_t mine = own.load(std::memory_order_relaxed) + 1;  // only this rank writes it
  // Sequentially consistent, as the sleepers' side below: either a rank about to sleep
  // sees this count, or this rank sees it counted among the sleepers and wakes it.
  own.store(mine, std::memory_order_seq_cst);
  // Ranks below `next` are known to have arrived (counts only grow).
  int next = 0;
  auto all_arrived = [&] {
    for (; next < local_size_; ++next) {
      if (h->reached[next].count.load(std::memory_order_seq_cst) < mine) return false;
    }
    return true;
  };
  // Only a rank that finds every count raised wakes the sleepers: one wake-up per barrier.
  // Of the ranks arriving last, at least one sees all the others' counts (each stores
  // before it loads, all sequentially consistent), and a sleeper that missed the last
  // count was counted in `sleepers` before that rank read it.
  if (all_arrived()) {
    if (h->sleepers.load(std::memory_order_seq_cst) > 0) {
      h->wake.fetch_add(1, std::memory_order_seq_cst);
      FutexWakeAll(&h->wake);
    }
    return absl::OkStatus();
  }
  absl::Time yield_until = absl::InfinitePast();
  for (int n = 0; !all_arrived(); ++n) {
    if (n < kSpins) {
      CpuRelax();
      continue;
    }
    if (absl::Status s = aborted(); !s.ok()) return s;
    const absl::Time now = WallNow();
    if (n == kSpins) {
      yield_until = now + yield_for_;
      if (until.timeout < absl::InfiniteDuration()) {
        until.at = std::min(until.at, now + until.timeout);
      }
    }
    const absl::Time deadline = until.at;
    if (now < yield_until) {
      sched_yield();
      continue;
    }
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < local_size_; ++r) {
        if (h->reached[r].count.load(std::memory_order_acquire) < mine) missing.push_back(r);
      }
      if (missing.empty()) break;  // the last of them arrived just now
      return Failed(absl::DeadlineExceededError(absl::StrCat(
          "shared-memory allreduce (", step, "): local rank",
          missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "),
          " did not arrive in time")));
    }
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t w = h->wake.load(std::memory_order_seq_cst);
    // Abort raises the flag before it bumps the wake word: one bumped before `w` was read
    // shows here.
    if (!all_arrived() && h->aborted.load(std::memory_order_seq_cst) == 0 &&
        !aborted_.load(std::memory_order_acquire)) {
      FutexWait(&h->wake, w, std::min(deadline - now, sleep_slice_));
    }
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  // Every rank arrived, whatever happened since.
  return absl::OkStatus();
}

absl::Status ShmAllreduce::Allreduce(DType dtype, const void* in, void* out, size_t count,
                                     absl::Duration timeout) {
  return Run(dtype, in, out, count, timeout, nullptr);
}

absl::Status ShmAllreduce::Broadcast(DType dtype, void* data, size_t count, int root,
                                     absl::Duration timeout) {
  if (root < 0 || root >= local_size_) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory broadcast: root ", root,
                                                   " of ", local_size_, " local ranks"));
  }
  const size_t es = DTypeSize(dtype);
  const size_t per_chunk = chunk_bytes_ / es;
  const absl::Time deadline = WallNow() + timeout;
  char* bytes = static_cast<char*>(data);
  for (size_t done = 0; done < count; done += per_chunk) {
    const size_t n = std::min(per_chunk, count - done);
    // The root writes the result region only once every rank is done reading it: the
    // previous chunk's data, or the result of the collective before this one (an
    // allreduce's ranks copy their result out after its last barrier).
    RETURN_IF_ERROR(Barrier(deadline, "broadcast"));
    if (local_rank_ == root) std::memcpy(Region(local_size_), bytes + done * es, n * es);
    RETURN_IF_ERROR(Barrier(deadline, "broadcast"));
    if (local_rank_ != root) std::memcpy(bytes + done * es, Region(local_size_), n * es);
  }
  // No barrier here: whatever writes the result region next (a broadcast's root, an
  // allreduce's sums) first passes a barrier that this rank reaches only after its copy.
  return absl::OkStatus();
}

absl::Status ShmAllreduce::HierarchicalAllreduce(DType dtype, const void* in, void* out,
                                                 size_t count, absl::Duration timeout,
                                                 const AcrossNodes& across_nodes) {
  return Run(dtype, in, out, count, timeout, &across_nodes);
}

absl::Status ShmAllreduce::Run(DType dtype, const void* in, void* out, size_t count,
                               absl::Duration timeout, const AcrossNodes* across_nodes) {
  const size_t es = DTypeSize(dtype);
  const size_t per_chunk = chunk_bytes_ / es;
  const absl::Time deadline = WallNow() + timeout;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  char* const result = Region(local_size_);
  for (size_t done = 0; done < count; done += per_chunk) {
    const size_t n = std::min(per_chunk, count - done);
    const char* in_chunk = src + done * es;
    char* out_chunk = dst + done * es;
    // This rank sums its own slice (reading its own part of the input in place), so it
    // contributes only the rest.
    const Chunk mine = ChunkOf(n, local_rank_, local_size_);
    const size_t off = mine.begin * es, len = mine.end - mine.begin;
    std::memcpy(Region(local_rank_), in_chunk, off);
    std::memcpy(Region(local_rank_) + off + len * es, in_chunk + off + len * es,
                (n - mine.end) * es);
    if (absl::Status s = Barrier(deadline, "contributions"); !s.ok()) return s;
    if (len > 0) {
      // Own data first, then the others' in rank order: a fixed order per slice, so the
      // result is the same from run to run, and every rank gets these very bits. Into the
      // output when that is the result already; within a hierarchical allreduce the node
      // sum goes to the result region only (the nodes' sum replaces it).
      auto part = [&](int r) -> const char* {
        return r == local_rank_ ? in_chunk + off : Region(r) + off;
      };
      char* sum = across_nodes == nullptr ? out_chunk + off : result + off;
      const int first = local_rank_ == 0 ? 1 : 0;
      Sum2(dtype, sum, part(local_rank_), part(first), len);
      for (int r = first + 1; r < local_size_; ++r) {
        if (r != local_rank_) SumInto(dtype, sum, part(r), len);
      }
      if (across_nodes == nullptr) std::memcpy(result + off, sum, len * es);
    }
    if (absl::Status s = Barrier(deadline, "sums"); !s.ok()) return s;
    if (across_nodes != nullptr) {
      if (local_rank_ == 0) {
        if (absl::Status s = (*across_nodes)(result, n); !s.ok()) return Failed(s);
      }
      if (absl::Status s = Barrier(deadline, "across nodes"); !s.ok()) return s;
      std::memcpy(out_chunk, result, n * es);
      continue;
    }
    std::memcpy(out_chunk, result, off);
    std::memcpy(out_chunk + off + len * es, result + off + len * es, (n - mine.end) * es);
  }
  return absl::OkStatus();
}

}  // namespace hybridps
