// The cross-rank agreement of the dist_allreduce store (Horovod-style negotiation).
//
// Every cycle each rank lists the operations it has ready — for every tensor name the
// oldest operation not yet run on it — and the ranks exchange their lists (an allgather,
// see AllreduceStore). Decide() then computes, from the gathered lists alone, the same
// plan on every rank: which operations run, in which order, fused how, and which fail.
// Because the plan depends only on data every rank holds, every rank runs the same
// collectives in the same order, whatever order its user submitted them in.
//
// Rules:
// - An operation is keyed by (name, occurrence, phase): the k-th operation a rank issued
//   on a name matches the k-th of every other rank in the same phase. Only the oldest
//   pending operation of a name is listed, so operations on one name run in the order they
//   were issued.
// - A key listed by every rank with the same kind, dtype, count, shape (where given),
//   device kind (CPU or GPU: the ranks' tensors must be on the same kind of device) and
//   root is ready; with
//   different ones it fails on every rank with an error that names the tensor, the ranks
//   and their shapes. A key some ranks have not listed waits (stall warnings and the
//   deadline are the store's business; `missing` says who is missing).
// - Ready operations run by priority (higher first), then in rank 0's submission order.
// - Small operations whose data every rank put in its list (the eager payload) are
//   computed from the lists themselves, with no further collective: push_pull sums the
//   ranks' payloads in rank order (identical on every rank), broadcast takes the root's.
// - A push_pull for which every rank sent every other rank that rank's chunk (ChunkOf; the
//   message to each peer differs) is a two-shot: each rank sums its own chunk from its
//   data and the payloads, and every rank sends its summed chunk to every other (one
//   step after the exchange, where the ring takes two after it with 2 ranks, and the
//   direct allreduce two with 3 or more). Each rank checks the chunks it received, and
//   its own list is its message to the next rank (self + 1 mod n): a rank sends chunks to
//   every peer or to none, so every rank decides alike (a peer that sent some ranks their
//   chunks and others not would leave the ranks in different collectives until their
//   timeout, never with a wrong sum).
// - Other push_pulls smaller than fusion_bytes are packed by dtype and device kind (GPU
//   buckets run as one NCCL group, CPU ones through a fusion buffer) into buckets of at
//   most fusion_bytes (a bucket runs where its first member would have); larger ones,
//   CPU ones larger than max_tensor_bytes (packing them would copy them in and out) and
//   broadcasts run alone.
//
// The wire format is validated field by field: a malformed list is an error, never a
// crash (it comes from another process).
#ifndef HYBRIDPS_WORKER_NODE_NEGOTIATION_H_
#define HYBRIDPS_WORKER_NODE_NEGOTIATION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/partition.h"  // ChunkOf: a two-shot's halves

namespace hybridps::negotiation {

enum class OpKind : uint8_t { kPushPull = 1, kBroadcast = 2 };
// "push_pull" or "broadcast".
absl::string_view OpKindName(OpKind kind);

// Names longer than this are refused at submission (they travel in every list).
inline constexpr size_t kMaxNameBytes = 4096;

// One ready operation of one rank. The store reuses entries from round to round
// (AllreduceStore::ListMine, ParseInto): a new field must be set in both.
struct Entry {
  std::string name;
  uint32_t occurrence = 0;  // operations this rank issued on `name` before this one
  OpKind kind = OpKind::kPushPull;
  DType dtype = DType::kFloat32;
  uint64_t count = 0;   // elements
  TensorShape shape;    // compared when given (see TensorShape)
  int32_t root = -1;    // broadcast only
  bool gpu = false;     // a GPU tensor (NCCL); never fused with CPU tensors, no payload
  int32_t priority = 0;
  uint32_t age_ms = 0;  // since the rank submitted it (for stall warnings)
  // Which step of a multi-step operation the rank is ready for: entries of one name and
  // occurrence in different phases are different keys (they wait for each other, never
  // mismatch). dist_allreduce lists phase 0 only; the node's GPU reduction lists an
  // operation in phase 1 once its push to the servers has ended.
  uint8_t phase = 0;
  // Eager data, or none: elements [payload_offset, payload_offset + payload's elements)
  // of the tensor (the whole tensor for an eager operation, the receiving rank's chunk
  // for a two-shot). Serialize() reads it from the caller's memory; Parse() makes it point
  // into the parsed buffer.
  bool has_payload = false;
  uint64_t payload_offset = 0;
  absl::string_view payload;

  // Whether the payload is the whole tensor.
  bool WholePayload() const;

  // "12 float32 elements" or "(3, 4) float32" (+ " on GPU", + " from root 1" for a
  // broadcast).
  std::string Shape() const;
};

// What one rank sends in one round.
struct RankList {
  bool leaving = false;  // the rank is shutting down: this is its last round
  // The message this rank would like to send in the next rounds (bytes; 0: none asked
  // for): a list that could carry a two-shot's chunks in a larger slot asks for it here,
  // and the next slot, computed from every rank's list, holds it.
  uint64_t room = 0;
  std::vector<Entry> entries;
};

// Appends the wire form of `list` to `out`. The result is at least kHeaderBytes long.
void Serialize(const RankList& list, int rank, std::string* out);
inline constexpr size_t kHeaderBytes = 24;
// The length of the wire form of `list`.
size_t SerializedBytes(const RankList& list);
// Writes the wire form of `list` at `out`, which has room for SerializedBytes(list) bytes
// (a message written straight into a shared-memory exchange area).
void SerializeTo(const RankList& list, int rank, char* out);
// Parses what rank `rank` sent. Payload views point into `bytes`, which must outlive
// the result.
absl::StatusOr<RankList> Parse(absl::string_view bytes, int rank);
// The same into `list`, reusing its entries' memory (a round's lists, kept from round to
// round). On failure `list` holds an unspecified part of the message.
absl::Status ParseInto(absl::string_view bytes, int rank, RankList* list);

// One step of a plan. Entries are indices into this rank's own list of the round.
struct Action {
  enum class Type {
    kEager,      // computed from the payloads below; no collective
    kTwoShot,    // this rank's chunk summed from its data and the peers' payloads
                 // (payloads[r]: rank r's copy of it), then the summed chunks shared
    kAllreduce,  // one push_pull, in place in its own memory (entries.size() == 1), or a
                 // fusion bucket of push_pulls of one dtype (entries.size() > 1)
    kBroadcast,  // one broadcast
    kFail,       // fails on every rank with `error`
  };
  Type type = Type::kAllreduce;
  // Inline storage: a round of one operation, the common case of small tensors, plans
  // without allocating.
  absl::InlinedVector<size_t, 1> entries;
  DType dtype = DType::kFloat32;
  uint64_t total_count = 0;  // kAllreduce: elements of all entries together
  // kEager push_pull: every rank's payload, by rank; broadcast: the root's only.
  absl::InlinedVector<absl::string_view, 4> payloads;
  absl::Status error;  // kFail
};

// A key of this rank that is not ready, and who has not listed it.
struct Missing {
  size_t entry = 0;  // index into this rank's list
  std::vector<int> ranks;
};

// A key other ranks listed that this rank has not (yet) submitted.
struct Foreign {
  std::string name;
  OpKind kind = OpKind::kPushPull;
  std::vector<int> ranks;      // who listed it
  uint32_t max_age_ms = 0;     // how long the longest of them has waited
};

struct Plan {
  absl::InlinedVector<Action, 1> actions;  // in execution order
  std::vector<Missing> missing;
  std::vector<Foreign> foreign;
  std::vector<int> leaving;     // ranks that are shutting down
  bool any_entries = false;     // some rank listed something
  // Some rank listed something this plan does not run: work is still pending in the job
  // (the next round is due after a cycle, not an idle tick).
  bool pending = false;
};

// The plan of rank `self` for one round (lists indexed by rank; this rank's own is its
// message to rank self + 1 mod n where the messages differ by peer). Deterministic: every
// rank computes the same actions in the same order (up to which entry indices are its own),
// given the same fusion_bytes and max_tensor_bytes.
Plan Decide(const std::vector<RankList>& lists, int self, size_t fusion_bytes,
            size_t max_tensor_bytes = SIZE_MAX);

// The steady state, Horovod's response cache without a coordinator: training repeats its
// rounds, so a rank's message mostly repeats its last one but for the occurrences, the
// ages and the payloads' bytes. The cache keeps, per rank, the other bytes of the last
// message it parsed (validated then). A message whose other bytes are the same updates
// the list parsed last time instead of being parsed again. A round whose every message
// repeated the last round's reuses that round's plan, with this round's payloads, when
// that plan ran every key (nothing missing, foreign, failed or leaving), every rank listed
// the same distinct names in the same order, and each entry's occurrence is still the same
// on every rank: the plan is then Decide's, of the same data. Any other round is parsed
// and decided in full, so a rank that deviates gets the named error, never other data.
// One per store, used by the round holder only.
class RoundCache {
 public:
  // ParseInto(bytes, rank, list), or the update of `list` from `bytes` when they repeat
  // the last message parsed here for `rank`; `list` must then hold what that parse gave
  // (the caller keeps its lists from round to round).
  absl::Status Parse(absl::string_view bytes, int rank, RankList* list);
  // Decide(lists, self, fusion_bytes, max_tensor_bytes) for the lists that Parse gave in
  // this round (every rank's), or the last plan with this round's payloads (see above).
  // Valid until the next call.
  const Plan& Decide(const std::vector<RankList>& lists, int self, size_t fusion_bytes,
                     size_t max_tensor_bytes = SIZE_MAX);
  // Forgets every message and plan (after a round that failed: its lists are then
  // unspecified).
  void Clear();

  uint64_t parses_skipped() const { return parses_skipped_; }
  uint64_t plans_reused() const { return plans_reused_; }

 private:
  // What a rank's last message fixed: its length, its bytes outside the fields that may
  // change (the runs), and where each entry's changing fields are.
  struct Layout {
    bool valid = false;
    bool repeated = false;  // this round's message repeated it
    size_t bytes = 0;
    struct Run {
      uint32_t at, len;
    };
    std::vector<Run> runs;
    std::string fixed;  // the runs' bytes, one after the other
    struct Changing {
      uint32_t occurrence_at, age_at, payload_at;
    };
    std::vector<Changing> changing;  // by entry
  };
  // Records `bytes`, just parsed into `list`, as the rank's layout.
  static void Remember(absl::string_view bytes, const RankList& list, Layout* layout);
  // Whether `plan`, decided from `lists`, may be reused for a round that repeats them.
  static bool Reusable(const Plan& plan, const std::vector<RankList>& lists);

  std::vector<Layout> layouts_;  // by rank
  Plan plan_;
  bool plan_reusable_ = false;
  int self_ = -1;
  size_t fusion_bytes_ = 0, max_tensor_bytes_ = 0;
  uint64_t parses_skipped_ = 0, plans_reused_ = 0;
};

}  // namespace hybridps::negotiation

#endif  // HYBRIDPS_WORKER_NODE_NEGOTIATION_H_
