// The public worker API: a KVStore created by type name.
//
//   hybridps::Options opt = *hybridps::OptionsFromEnvironment();
//   auto kv = *hybridps::KVStore::Create("dist_hybrid", opt);
//   RETURN_IF_ERROR(kv->Broadcast("w", weights, /*root_rank=*/0));
//   RETURN_IF_ERROR(kv->PushPull("grad.w", grad, grad));   // sum over all workers
//
// Every operation is collective: every worker calls it with the same name, size and
// dtype, in the same order per name (different names may be issued in any order). The
// caller keeps the tensors' memory alive and untouched until the handle completes.
// Operations never wait forever: each has a deadline (Options::op_timeout), and a peer's
// death fails them within the heartbeat timeout with an error naming the peer.
#ifndef HYBRIDPS_WORKER_KVSTORE_H_
#define HYBRIDPS_WORKER_KVSTORE_H_

#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/options.h"
#include "worker/handle.h"

namespace hybridps {

class Context;

enum class Capability { kOptimizer };

class KVStore {
 public:
  // `type`: "dist_hybrid" (parameter server) or "dist_allreduce" (ring allreduce on
  // Gloo, no servers; Unimplemented when built without Gloo). `ctx`: the ZeroMQ context
  // to use (needed to run a whole cluster in one process over inproc://); null creates
  // one. Blocks until the whole job has registered (options.start_timeout).
  static absl::StatusOr<std::unique_ptr<KVStore>> Create(
      absl::string_view type, const Options& options,
      std::shared_ptr<Context> ctx = nullptr);
  // Finishes outstanding operations (bounded by their deadlines) and leaves the job.
  virtual ~KVStore() = default;

  virtual absl::string_view type() const = 0;
  virtual int rank() const = 0;
  virtual int num_workers() const = 0;
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  // Sets `tensor` on every worker to root_rank's value. Higher priority goes first.
  virtual absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor,
                                                int root_rank, int priority = 0) = 0;
  // out = the sum of `in` over all workers (never the average). `out` may alias `in`;
  // both have the same count and dtype.
  virtual absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in,
                                               TensorView out, int priority = 0) = 0;
  // Returns when every worker has called Barrier.
  virtual absl::Status Barrier() = 0;
  virtual bool IsCapable(Capability capability) const = 0;
  // Finishes outstanding operations and tells the scheduler this worker is done. Called by
  // the destructor if not before; later operations fail.
  virtual absl::Status Shutdown() = 0;

  absl::Status Broadcast(absl::string_view name, TensorView tensor, int root_rank,
                         int priority = 0);
  absl::Status PushPull(absl::string_view name, TensorView in, TensorView out,
                        int priority = 0);

 protected:
  // OK for a CPU tensor with data (or none, when empty); else an error naming the tensor,
  // `what` it is ("the input") and this store's type.
  absl::Status CheckCpuTensor(absl::string_view name, const TensorView& t,
                              absl::string_view what) const;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_KVSTORE_H_
