// The collectives of dist_allreduce's CPU tensors across the job's workers, of one of three
// kinds chosen once, when the store starts (AllreduceStore::SetUpSharedMemory):
//   kGloo: Gloo over every worker (the ring, or two direct steps: SetDirectBytes);
//   kSharedMemory: every worker is a local rank of one node: the node's shared-memory
//     segment (worker/node/shm_allreduce.h) carries the allreduces, the broadcasts and the
//     negotiation's exchange (a message too large for it goes through Gloo);
//   kHierarchical: several nodes: each node sums in shared memory (a node of one rank has
//     none) and its local rank 0 allreduces the node's sum with the other nodes' over a
//     Gloo mesh of their own; broadcasts and the exchange go through the Gloo ring.
// Threading: the store's executor (one thread at a time); Abort from any thread.
#ifndef HYBRIDPS_WORKER_ALLREDUCE_CPU_COLLECTIVES_H_
#define HYBRIDPS_WORKER_ALLREDUCE_CPU_COLLECTIVES_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "worker/comm/gloo_comm.h"
#include "worker/node/shm_allreduce.h"

namespace hybridps {

class CpuCollectives {
 public:
  enum class Kind { kGloo, kSharedMemory, kHierarchical };
  virtual ~CpuCollectives() = default;
  // Fixed at construction, and read on every operation's path: plain fields, no calls.
  Kind kind() const { return kind_; }
  // Whether this worker's allreduces run in shared memory (all, or its node's part).
  bool in_shared_memory() const { return in_shared_memory_; }

  // The sum over every worker of `count` elements of `in`, into `out` (may alias `in`).
  virtual absl::Status Allreduce(DType dtype, const void* in, void* out, size_t count,
                                 absl::Duration timeout) = 0;
  // Allreduces of up to `bytes` (every worker the same: rank 0's) go directly between
  // every pair of workers over Gloo where there are 3 to 8 (hierarchical: nodes' leaders;
  // GlooComm::AllreduceDirect); larger ones take the ring. 0 by default.
  virtual void SetDirectBytes(size_t bytes) = 0;
  // Whether the allreduce of `bytes` goes directly.
  virtual bool GoesDirect(size_t bytes) const = 0;
  // Worker `root`'s `count` elements of `data` into every worker's.
  virtual absl::Status Broadcast(DType dtype, void* data, size_t count, int root,
                                 absl::Duration timeout) = 0;
  // The negotiation's exchange: every worker's message, by worker rank. `framed` holds 8
  // bytes for the length, then this worker's message (GlooComm::AllgatherFramed); the
  // views, in `out`, stay valid until the next call (in shared memory `out` keeps its
  // memory from call to call; over Gloo it is replaced).
  virtual absl::Status Exchange(std::string* framed, size_t slot_bytes, absl::Duration timeout,
                                std::vector<absl::string_view>* out) = 0;
  // Room to write this worker's next Exchange message in place (then ExchangeWritten), or
  // an empty span where the exchange sends it from the caller's buffer (Gloo).
  virtual absl::Span<char> ExchangeRoom() { return {}; }
  // Exchange of the `bytes` this worker wrote at ExchangeRoom() (unframed; at most its
  // size): the same results as Exchange.
  virtual absl::Status ExchangeWritten(size_t /*bytes*/, size_t /*slot_bytes*/,
                                       absl::Duration /*timeout*/,
                                       std::vector<absl::string_view>* /*out*/) {
    return absl::InternalError("this exchange takes no message in place");
  }
  // Whether an exchange in slots of `slot_bytes` can send each worker a message of its own
  // (PerPeerRoom is then not null).
  virtual bool ExchangesPerPeer(size_t /*slot_bytes*/) const { return false; }
  // Room for an exchange in which each worker gets a message of its own
  // (ExchangePerPeer): `slot_bytes` per worker, the message for worker r at
  // r * slot_bytes + 8, at most slot_bytes - 8 bytes each. Null where the exchange sends
  // every worker the same message (shared memory, hierarchical, or a slot that goes
  // through Gloo's ring: GlooComm::PerPeerRoom).
  virtual char* PerPeerRoom(size_t /*slot_bytes*/) { return nullptr; }
  // The exchange of the messages written at PerPeerRoom(slot_bytes), `lengths` bytes by
  // worker: every worker's message to this one, as Exchange, and this worker's to the next
  // as its own (GlooComm::AllgatherPerPeer). Other workers may send every worker the same
  // message in the same exchange.
  virtual absl::Status ExchangePerPeer(const std::vector<size_t>& /*lengths*/,
                                       size_t /*slot_bytes*/, absl::Duration /*timeout*/,
                                       std::vector<absl::string_view>* /*out*/) {
    return absl::InternalError("this exchange sends every worker the same message");
  }
  // The next Exchange's receives, posted now when it goes through Gloo.
  virtual void PostNextExchange(size_t slot_bytes) = 0;
  // Ends what runs (any thread): the collective in progress fails with `why`.
  virtual void Abort(const absl::Status& why) = 0;
  // Closes what it owns (after the executor is done with it).
  virtual void Close() = 0;

 protected:
  CpuCollectives(Kind kind, bool in_shared_memory)
      : kind_(kind), in_shared_memory_(in_shared_memory) {}

 private:
  const Kind kind_;
  const bool in_shared_memory_;
};

// The Exchange slot for a framed message of `framed_bytes` (its 8 bytes of length
// included): whole pages, at least one. The store's rounds and the eager probe size their
// slots with it, so that the probe's exchanges are the rounds'.
inline size_t ExchangeSlotFor(size_t framed_bytes) {
  constexpr size_t kPage = 4096;
  return std::max(kPage, (framed_bytes + kPage - 1) / kPage * kPage);
}

// `world`: the Gloo ring over every worker, the store's; it outlives the collectives.
std::unique_ptr<CpuCollectives> NewGlooCollectives(GlooComm* world);
// `members`: the worker rank of each local rank (every worker of the job).
std::unique_ptr<CpuCollectives> NewSharedMemoryCollectives(GlooComm* world,
                                                           std::unique_ptr<ShmAllreduce> node,
                                                           std::vector<int> members);
// `node`: null for a node of one rank; `leaders`: null except at a node's local rank 0.
// `chunk_bytes`: the leaders allreduce a tensor in pieces of this size, the same on every
// node (`node`'s region size).
std::unique_ptr<CpuCollectives> NewHierarchicalCollectives(GlooComm* world,
                                                           std::unique_ptr<ShmAllreduce> node,
                                                           std::unique_ptr<GlooComm> leaders,
                                                           size_t chunk_bytes);

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_ALLREDUCE_CPU_COLLECTIVES_H_
