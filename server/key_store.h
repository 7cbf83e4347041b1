// The rounds of the partitions one engine thread owns. Every (key, part) goes through
// rounds 0, 1, 2...: a round collects one request from every worker node; a PUSHPULL round
// sums their payloads (the first payload becomes the accumulator without a copy, later
// ones are summed into it), a BROADCAST round keeps the root's payload. When the last node
// has arrived, every waiting request is answered with the result (zero-copy: the replies
// share the accumulator's buffer). Requests that disagree within a round (size, dtype, op,
// root) fail the round for every node with an error naming the key and both shapes; the
// other partitions are unaffected.
//
// Summation: payloads below kInlineSumBytes are summed on the calling thread; larger ones
// are handed to `offload` (the server's engine threads), which must run the sums of one
// partition in order on one thread and report each with SumDone(). A round closes once
// every node arrived and its sums are done.
//
// Threading: not thread-safe; owned by the server's I/O thread.
#ifndef HYBRIDPS_SERVER_KEY_STORE_H_
#define HYBRIDPS_SERVER_KEY_STORE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/hybridps.pb.h"
#include "common/transport.h"

namespace hybridps {

class KeyStore {
 public:
  struct Reply {
    std::string peer;
    wire::Envelope env;
    std::optional<Frame> payload;
  };
  using Emit = std::function<void(Reply)>;
  // A summation handed to an engine thread: dst += src. `keep` holds dst's buffer alive.
  struct SumTask {
    uint64_t key;
    uint32_t part;
    uint64_t round;
    DType dtype;
    uint64_t count;
    void* dst;
    Frame keep;
    Frame src;
  };
  using Offload = std::function<void(SumTask)>;
  // The server-side optimizer. `update` gets each closed push_pull round (the first
  // request's fields, with the summed gradient in *sum): false leaves the round to close
  // as usual with *sum (which it may have overwritten with the new weights); true means it
  // took *sum and will call UpdateDone; an error fails the round.
  // `broadcast` sees each closed broadcast round's value.
  using Update = std::function<absl::StatusOr<bool>(const wire::DataRequest& req,
                                                    std::optional<Frame>* sum)>;
  using Broadcast = std::function<void(const wire::DataRequest& req, const void* value)>;
  static constexpr size_t kInlineSumBytes = 64 << 10;

  // `emit` sends a reply (called on the owning thread). Without `offload` every sum runs
  // inline. A round collects one request from each of `num_nodes` worker nodes (a node
  // reduces its local ranks before it pushes). `workers_of_node`, by node: its worker
  // ranks, for errors ("node 1 (workers 2, 3)"); empty: every node is one worker, whose
  // rank is the node's index ("worker 1").
  KeyStore(int num_nodes, Emit emit, Offload offload = nullptr,
           std::vector<std::vector<int>> workers_of_node = {})
      : num_nodes_(num_nodes),
        workers_of_node_(std::move(workers_of_node)),
        emit_(std::move(emit)),
        offload_(std::move(offload)) {}

  // A validated request (ValidateDataRequest passed) from worker node `node` via `peer`.
  void Handle(const std::string& peer, int node, uint64_t id, const wire::DataRequest& req,
              std::optional<Frame> payload);
  // When a round's stages ended (HYBRIDPS_TIMELINE): its first and its last node's push,
  // the sum (of the last push; earlier ones are summed as they come), the optimizer's
  // update (right after summed without one). The replies were sent when the hook runs.
  struct RoundTimes {
    absl::Time opened, all_arrived, summed, updated;
    bool broadcast = false;  // a broadcast round: nothing summed or updated
  };
  // Called as each round closes (its replies sent): name, partition, round, and when.
  using RoundHook = std::function<void(const std::string& name, uint32_t part,
                                       uint64_t round, const RoundTimes& times)>;
  void SetRoundHook(RoundHook hook) { round_hook_ = std::move(hook); }
  void SetOptimizerHooks(Update update, Broadcast broadcast) {
    update_ = std::move(update);
    broadcast_ = std::move(broadcast);
  }
  // An update `update` took finished: `result` (the new weights) answers the round.
  void UpdateDone(uint64_t key, uint32_t part, uint64_t round, const absl::Status& status,
                  std::optional<Frame> result);
  // An offloaded sum finished (the owning thread, after the engine reported it).
  void SumDone(uint64_t key, uint32_t part, uint64_t round);
  // Answers every waiting request with `status` and every later one too: the job failed.
  void FailAll(const absl::Status& status);
  // Node `node` left the job (a worker of it shut its store down; `reason` says which): it
  // pushes nothing more, so every round it has not joined fails now, and every later one
  // at its first request. Rounds it joined close as usual.
  void Leave(int node, const std::string& reason);

  size_t num_partitions() const { return parts_.size(); }
  // What went through the store so far (HYBRIDPS_SUMMARY_EVERY_MS).
  struct Traffic {
    uint64_t rounds = 0;     // closed
    uint64_t bytes_in = 0;   // payloads pushed, as they came (compressed or not)
    uint64_t bytes_decompressed = 0;  // what compressed pushes unpacked to
    uint64_t bytes_out = 0;  // payloads answered
    std::vector<uint64_t> last_push;  // by node: rounds whose last push was its
  };
  const Traffic& traffic() const { return traffic_; }
  // "worker 3 (host h, pid p)", or "node 1 (worker 2 (…), worker 3 (…))" for a node of
  // several workers; `worker_names` by rank.
  std::string NodeLabel(int node, const std::vector<std::string>& worker_names) const;
  // Rounds that have waited `after` for some worker nodes (and were not told so within
  // `after`): tells each waiting request who is missing (a StallNotice with its id) and
  // logs it. `worker_names`, by rank: how to name a worker ("worker 3 (host h, pid p)").
  void WarnStalls(absl::Time now, absl::Duration after,
                  const std::vector<std::string>& worker_names);

 private:
  struct Waiter {
    std::string peer;
    uint64_t id;
    int node;
  };
  struct Part {
    std::string name;
    uint64_t round = 0;
    // The open round.
    std::vector<bool> arrived;  // by node
    int num_arrived = 0;
    wire::DataOp op = wire::OP_NONE;
    uint32_t dtype = 0;
    uint64_t count = 0;
    uint64_t total_count = 0;
    int root = -1;
    int first_node = -1;
    absl::Time opened;                          // the round's first arrival
    absl::Time warned = absl::InfinitePast();   // the last StallNotice of this round
    absl::Time all_arrived;                     // the round's last arrival (with a hook)
    absl::Time summed, updated;                 // (with a hook) RoundTimes
    int last_node = -1;                         // whose push was the last
    wire::DataRequest first;  // the first request's fields (no payload)
    // The first shape given this round, and its node: nodes that give none agree with
    // any, so the others are compared with it (not only with the first request).
    TensorShape shape;
    int shape_node = -1;
    bool updating = false;    // the optimizer has the round's sum
    std::optional<Frame> acc;
    int pending_sums = 0;  // offloaded sums into acc not yet done
    std::vector<Waiter> waiters;
    absl::Status error;
    // The value of the last closed round.
    std::optional<Frame> value;
  };
  struct PartKey {
    uint64_t key;
    uint32_t part;
    bool operator==(const PartKey& o) const { return key == o.key && part == o.part; }
    template <typename H>
    friend H AbslHashValue(H h, const PartKey& k) {
      return H::combine(std::move(h), k.key, k.part);
    }
  };

  void ReplyError(const std::string& peer, uint64_t id, const wire::DataRequest& req,
                  const absl::Status& status);
  void FailRound(Part& p, const absl::Status& status);
  void MaybeEndRound(Part& p, uint64_t key, uint32_t part);
  void ResetRound(Part& p);
  void CloseRound(Part& p, uint64_t key, uint32_t part);
  // "worker 3" for a node of one worker, else "node 1 (workers 2, 3)".
  std::string NodeName(int node) const;

  const int num_nodes_;
  Traffic traffic_;
  RoundHook round_hook_;
  const std::vector<std::vector<int>> workers_of_node_;
  Emit emit_;
  Offload offload_;
  Update update_;
  Broadcast broadcast_;
  absl::flat_hash_map<PartKey, Part> parts_;
  absl::Status failed_;
  std::vector<std::string> left_;  // by node: why it left (empty: still in the job)
  // Fails p's round if a node that left has not joined it.
  void FailIfSomeoneLeft(Part& p);
};

}  // namespace hybridps

#endif  // HYBRIDPS_SERVER_KEY_STORE_H_
