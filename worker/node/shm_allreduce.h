// Allreduce in POSIX shared memory among the local ranks of one node: dist_allreduce's
// path for CPU tensors when every worker of the job is on one host (the node notion of
// issue 5; Gloo's TCP ring over loopback copies every byte through the kernel twice per
// step and wakes a thread per message).
//
// One segment per job, created by local rank 0 and unlinked as soon as every local rank
// mapped it: a header, two exchange areas for the negotiation's messages (Allgather),
// then one region per local rank and a result region, each `chunk_bytes`. A tensor is
// reduced chunk by chunk; rank r owns slice r of the chunk (ChunkOf, common/partition.h):
//   1. each rank copies its chunk, except its own slice, into its region;     barrier
//   2. rank r sums its slice (its own input in place first, then the others' regions in
//      rank order: a fixed order, so the same bits every run) into its output, and copies
//      it to the result region;                                               barrier
//   3. each rank copies the other slices of the result out.
// Every rank thus gets the same bits. The next chunk's (or operation's) first barrier
// keeps step 2 from overwriting a result someone still reads; a broadcast, which passes
// its data through the result region too, likewise starts each chunk with a barrier
// before its root writes there. Every rank must call the
// same collectives in the same order (the negotiation's plan guarantees it, as it does
// for Gloo's).
//
// Waits: a rank arrives at a barrier by raising its own count, in a cache line of its own,
// and waits for every other rank's count to be as high: it spins briefly, yields its CPU
// for a while (shm_allreduce.cc), then sleeps on a futex in the segment, and fails at its
// deadline naming the local ranks that did not arrive;
// Abort() (any thread, e.g. when the scheduler reports a dead peer) ends every wait at
// once, here and, through a flag in the segment, in the other processes. After a failure
// the object must not be used again.
#ifndef HYBRIDPS_WORKER_NODE_SHM_ALLREDUCE_H_
#define HYBRIDPS_WORKER_NODE_SHM_ALLREDUCE_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"

namespace hybridps {

class ShmAllreduce {
 public:
  // Maps segment `name` (a POSIX shm name, "/..."): local rank 0 creates it, the others
  // wait for it until `deadline`. Fails (and leaves nothing behind) when the segment
  // cannot be made or not every rank attaches in time.
  static absl::StatusOr<std::unique_ptr<ShmAllreduce>> Open(const std::string& name,
                                                            int local_rank, int local_size,
                                                            size_t chunk_bytes,
                                                            absl::Time deadline);
  ~ShmAllreduce();

  // out = the sum over the local ranks of `in` (count elements; out may equal in, else
  // they must not overlap). Float16/bfloat16 are summed in float32, integers wrap
  // (common/reduce.h).
  absl::Status Allreduce(DType dtype, const void* in, void* out, size_t count,
                         absl::Duration timeout);
  // The node's step of a hierarchical allreduce (several nodes): the same, except that
  // after each chunk's node sum local rank 0 runs `across_nodes` on it in place (its
  // allreduce with the other nodes' leaders; ignored on the other ranks, which wait for
  // it at a third barrier), and every rank then copies the whole chunk out. Every local
  // rank must call this one, not Allreduce, for the same operation.
  using AcrossNodes = std::function<absl::Status(void* data, size_t count)>;
  absl::Status HierarchicalAllreduce(DType dtype, const void* in, void* out, size_t count,
                                     absl::Duration timeout, const AcrossNodes& across_nodes);
  // data = local rank `root`'s data, on every local rank (count elements), chunk by chunk
  // through the result region.
  absl::Status Broadcast(DType dtype, void* data, size_t count, int root,
                         absl::Duration timeout);
  // Every local rank's `mine`, indexed by local rank, for the negotiation of a one-host
  // job; the views point into the segment and stay valid until this rank's next
  // Allgather or AllgatherWritten (two areas take turns: to write this area again, a rank
  // must first pass the next exchange's barrier, which this rank has not reached).
  // ResourceExhausted on every rank alike when some rank's message is over kMessageBytes:
  // the caller then exchanges this round another way.
  absl::StatusOr<std::vector<absl::string_view>> Allgather(absl::string_view mine,
                                                          absl::Duration timeout);
  // The same into `all` (its memory reused from call to call).
  absl::Status Allgather(absl::string_view mine, absl::Duration timeout,
                         std::vector<absl::string_view>* all);
  static constexpr size_t kExchangeBytes = 256 << 10;  // per rank and area
  static constexpr size_t kMessageBytes = kExchangeBytes - sizeof(uint64_t);  // its room
  // Where this rank's message of the next Allgather goes (kMessageBytes of room), for a
  // caller that writes it there itself and then calls AllgatherWritten: no copy. The
  // area is free from the moment the last Allgather returned, as for Allgather's own copy.
  char* NextMessage() const {
    return ExchangeArea(static_cast<int>(exchanges_ % 2), local_rank_) + sizeof(uint64_t);
  }
  // Allgather of the `bytes` (at most kMessageBytes) this rank wrote at NextMessage().
  absl::Status AllgatherWritten(size_t bytes, absl::Duration timeout,
                                std::vector<absl::string_view>* all);

  // Fails the current and every later wait with `why`, here and in the other local ranks.
  void Abort(const absl::Status& why);

  // How long a sleeping wait sleeps at most before it looks again (10 ms). Tests set it
  // long, so that a wake-up that never comes shows as a wait that ends at its deadline.
  void set_sleep_slice_for_testing(absl::Duration d) { sleep_slice_ = d; }

  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  size_t chunk_bytes() const { return chunk_bytes_; }

  struct Header;  // the segment's layout (shm_allreduce.cc)

 private:
  ShmAllreduce(int local_rank, int local_size, size_t chunk_bytes);
  // When a barrier gives up: at a moment, or `timeout` after it stops spinning (so that a
  // barrier the peers reach while it spins reads no clock).
  struct Until {
    absl::Time at = absl::InfiniteFuture();
    absl::Duration timeout = absl::InfiniteDuration();
  };
  absl::Status Barrier(Until until, absl::string_view step);
  absl::Status Barrier(absl::Time deadline, absl::string_view step) {
    return Barrier(Until{deadline, absl::InfiniteDuration()}, step);
  }
  absl::Status Run(DType dtype, const void* in, void* out, size_t count, absl::Duration timeout,
                   const AcrossNodes* across_nodes);
  absl::Status Failed(absl::Status s);
  char* Region(int i) const;  // i == local_size_: the result region
  // Local rank `rank`'s area of exchange `parity`: 8 bytes of length, then its message.
  char* ExchangeArea(int parity, int rank) const;
  // The exchange of this rank's message of `len` bytes, already in place (or of a length
  // that says it did not fit).
  absl::Status Gather(uint64_t len, absl::Duration timeout, std::vector<absl::string_view>* all);

  int local_rank_;
  int local_size_;
  absl::Duration yield_for_;  // a barrier's yielding before it sleeps (shm_allreduce.cc)
  absl::Duration sleep_slice_ = absl::Milliseconds(10);
  size_t chunk_bytes_;
  Header* header_ = nullptr;
  size_t mapped_bytes_ = 0;
  uint64_t exchanges_ = 0;  // Allgather calls so far (the same on every rank)
  std::atomic<bool> aborted_{false};
  absl::Mutex mu_;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_NODE_SHM_ALLREDUCE_H_
