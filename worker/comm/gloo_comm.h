// Gloo for the dist_allreduce store: the scheduler's rendezvous store behind Gloo's Store
// interface, and a communicator that wraps the few collectives we use: Gloo's newer
// options API (gloo::allreduce, gloo::broadcast, gloo::allgather(v); never the older
// algorithm classes, which shrink socket buffers when mixed in on one context), and our
// own exchanges over Gloo's unbound buffers (the negotiation's, two-shots, the direct
// allreduce), each on slots of its own.
//
// Every Gloo exception becomes an absl::Status here; after one, the communicator must not
// be used again (Gloo closes the pairs of a context that failed). Every collective takes a
// timeout.
#ifndef HYBRIDPS_WORKER_COMM_GLOO_COMM_H_
#define HYBRIDPS_WORKER_COMM_GLOO_COMM_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/control_client.h"
#include "common/dtype.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/unbound_buffer.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace hybridps {

// Gloo's rendezvous Store on the scheduler's key-value store (KvSet/KvGet/KvWait).
// Threading: only the thread that owns `control` may use it — each call sends a request
// and pumps the client synchronously until its reply or `deadline`. Failures throw
// gloo::IoException (Gloo's contract); status() keeps the first one.
class SchedulerStore : public gloo::rendezvous::Store {
 public:
  // `control` must outlive the store and be registered. Keys are prefixed with `prefix`.
  SchedulerStore(ControlClient* control, std::string prefix, absl::Time deadline)
      : control_(control), prefix_(std::move(prefix)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key (Gloo expects get to find keys other ranks are about to set).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  const absl::Status& status() const { return status_; }

 private:
  absl::StatusOr<wire::Envelope> Call(wire::Envelope env, absl::Time deadline);
  [[noreturn]] void Fail(absl::Status s);
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Time deadline);

  ControlClient* control_;  // not owned; see the class comment
  std::string prefix_;
  absl::Time deadline_;
  absl::Status status_;
};

// A Gloo context over tcp, and the collectives of the store. With one rank no context is
// made and every collective is a local copy. Threading: one thread at a time (the store's
// executor); Close() may be called once that thread is done with it.
class GlooComm {
 public:
  // Connects a full mesh of `size` ranks through `store` (blocks until every rank did or
  // `timeout`). `host`: the address to bind and advertise; `iface`: an interface name
  // instead (one of the two is empty).
  static absl::StatusOr<std::unique_ptr<GlooComm>> Connect(int rank, int size,
                                                           const std::string& host,
                                                           const std::string& iface,
                                                           gloo::rendezvous::Store& store,
                                                           absl::Duration timeout);
  ~GlooComm();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // out = the sum over ranks of `in` (count elements of dtype; out may equal in, else
  // they must not overlap). Reduction through common/reduce.h (float16/bfloat16 summed in
  // float32 at each step, integers wrap).
  absl::Status Allreduce(DType dtype, const void* in, void* out, size_t count,
                         absl::Duration timeout);
  // The same sum in two steps sent directly between every pair of ranks, where the ring
  // takes 2(n-1) in turn: each rank sends every peer that peer's 1/n of `in` and sums its
  // own 1/n from what it receives (in a fixed order: the same bits every run), then sends
  // its summed 1/n to every peer. The ring's bytes per rank, 2(n-1)/n of the tensor.
  absl::Status AllreduceDirect(DType dtype, const void* in, void* out, size_t count,
                               absl::Duration timeout);
  // data = the root's data, on every rank.
  absl::Status Broadcast(DType dtype, void* data, size_t count, int root,
                         absl::Duration timeout);
  // The second step of a two-shot: rank r's chunk ChunkOf(count, r, size()) of `out`, on
  // every rank. Posts the receives of the peers' chunks into `out`, runs `fill` (which
  // writes this rank's chunk: the peers' data then arrives meanwhile), sends this rank's
  // chunk to every peer, and waits for all of it. Every rank calls it with the same dtype
  // and count.
  absl::Status ShareChunks(DType dtype, void* out, size_t count, absl::FunctionRef<void()> fill,
                           absl::Duration timeout);
  // Every rank's `mine` (any length), indexed by rank; the views point into buffers of
  // this communicator and stay valid until the next call. Costs one exchange in slots of
  // `slot` bytes (every rank must pass the same slot; small slots, and any with 2 ranks,
  // go directly to every peer in one step, each rank sending only its message; larger
  // ones, whole, through the ring, gloo::allgather), plus an allgatherv
  // when some rank's message does not fit in a slot.
  absl::StatusOr<std::vector<absl::string_view>> AllgatherBytes(absl::string_view mine,
                                                                size_t slot,
                                                                absl::Duration timeout);
  // The same without copying the message: `framed` holds 8 bytes of room for its length,
  // then the message. It is sent from there (grown to the slot when shorter, where the
  // slot goes through the ring), and this rank's view points into it: keep it unchanged
  // until the next call.
  absl::StatusOr<std::vector<absl::string_view>> AllgatherFramed(std::string* framed,
                                                                 size_t slot,
                                                                 absl::Duration timeout);
  // Slots up to this size are exchanged directly (one send to every peer, the receives
  // posted a round ahead), larger ones by the ring, except with 2 ranks (where every slot
  // goes directly: the ring is one step too). Slots grow with eager payloads, two-shot
  // shares and the tensors listed.
  static constexpr size_t kDirectSlotBytes = 2 << 20;
  // Whether an exchange of `slot` can send each peer a message of its own: more than one
  // rank, and a slot that goes directly.
  bool ExchangesPerPeer(size_t slot) const;
  // Room for an exchange in which each peer gets a message of its own (AllgatherPerPeer):
  // `slot` bytes per rank, the message for peer r at r * slot + 8, at most slot - 8 bytes
  // each. Null where such an exchange cannot run (ExchangesPerPeer). Valid until the next
  // call.
  char* PerPeerRoom(size_t slot);
  // The exchange of AllgatherFramed with the messages written at PerPeerRoom(slot)
  // (lengths[r] bytes for peer r; lengths[rank()] is not read): peer r receives its own,
  // and the result holds every peer's message to this rank and, at rank(), this rank's
  // message to the next rank ((rank() + 1) % size()). The peers may call AllgatherFramed
  // or this in the same exchange; the receives are the same.
  absl::StatusOr<std::vector<absl::string_view>> AllgatherPerPeer(
      const std::vector<size_t>& lengths, size_t slot, absl::Duration timeout);
  // Posts the receives of the next AllgatherBytes now, for a direct `slot` (which that
  // call must then pass; every rank calls this with the same slot, or none does). Gloo
  // sends only to a receive its peer has posted, so an exchange whose receives were
  // posted at the end of the previous one costs one trip instead of two: the peers' data
  // leaves as soon as they send. The views of the last call stay valid. A failure is
  // returned by the next AllgatherBytes.
  void PostNextExchange(size_t slot);
  // Ends every connection after what was written to it (peers blocked on us fail at
  // once, and a peer still receiving our last round gets all of it first).
  void Close();
  // Shuts every connection down (shutdown(2): what was written still leaves, then the
  // peers read end-of-file). Ends a collective that another thread is blocked in, at
  // once, with an error, where it would otherwise wait for Gloo's timeout (a hung peer
  // keeps its sockets open, so nothing else wakes it): our own Gloo device thread reads
  // the end as the peer closing and fails the pending buffers. Safe from any thread, any
  // number of times; the communicator is unusable afterwards.
  void Abort();

 private:
  GlooComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank_;
  int size_;
  std::shared_ptr<gloo::Context> context_;  // null when size_ == 1
  // The mesh's connected sockets (descriptor, inode), for Abort; empty if not found.
  std::vector<std::pair<int, ino_t>> mesh_sockets_;
  // Whether an allreduce needs no peer: nothing to sum, or one rank (then `in` is copied
  // to `out`).
  bool AllreduceIsLocal(DType dtype, const void* in, void* out, size_t count);
  // Whether a slot is exchanged directly (else by Gloo's ring allgather).
  bool Direct(size_t slot) const;
  // Posts exchange_[i]'s receives of `slot` bytes from every peer.
  void PostExchange(int i, size_t slot);
  // The direct exchange of one slot per rank: `send` (over the slots to send), rank r's
  // send_bytes(r) at send_offset(r) (at most a slot: a message shorter than the slot
  // fills the start of the peer's receive); where every rank's slot arrived (this rank's:
  // `own`) into `slots`.
  absl::Status ExchangeDirect(gloo::transport::UnboundBuffer* send,
                              absl::FunctionRef<size_t(int)> send_offset,
                              absl::FunctionRef<size_t(int)> send_bytes, const char* own,
                              size_t slot, absl::Duration timeout,
                              std::vector<const char*>* slots);
  // Every rank's message from the slots (8 bytes of length, then the message's first
  // slot - 8 bytes), with the tails of those longer than that (an allgatherv; this rank's
  // tail follows its slot at `own`).
  absl::StatusOr<std::vector<absl::string_view>> JoinSlots(
      const std::vector<const char*>& slots, const char* own, size_t slot,
      absl::Duration timeout);
  // AllgatherBytes' buffers, kept from call to call (no allocation or zeroing per round).
  std::string own_, slot_all_, tail_in_, tail_all_;  // own_: AllgatherBytes' framing
  // The direct exchange (small slots): our slot goes to every peer from the framed
  // message (through send_buf_); the peers' slots arrive in exchange_[next_exchange_],
  // the two taking turns, so the next exchange's receives can be posted while the views
  // of the last one are still read.
  struct Exchange {
    std::string bytes;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;  // over bytes
    size_t slot = 0;      // of the posted receives
    bool posted = false;  // receives posted, not yet waited for
  };
  Exchange exchange_[2];
  int next_exchange_ = 0;
  absl::Status post_failed_;  // PostNextExchange's failure, for the next exchange
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buf_;  // over the framed message
  // AllgatherPerPeer's messages (PerPeerRoom), and the buffer they are sent from.
  std::string per_peer_;
  std::unique_ptr<gloo::transport::UnboundBuffer> per_peer_buf_;
  std::vector<std::string> joined_;  // per rank, when tails were gathered
  std::string direct_parts_;  // AllreduceDirect: the peers' copies of this rank's chunk
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_COMM_GLOO_COMM_H_
