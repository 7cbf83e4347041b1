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

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/compression.h"
#include "common/dtype.h"
#include "common/options.h"
#include "optimizers/update_rule.h"
#include "worker/handle.h"

namespace hybridps {

class Context;

enum class Capability { kOptimizer };

using optimizers::OptimizerSpec;

// Per-tensor multipliers of the learning rate and the weight decay (MXNet's lr_mult,
// wd_mult).
struct KeyMultipliers {
  double lr_mult = 1.0;
  double wd_mult = 1.0;
};

// The optimizer the servers run (update_on_kvstore).
struct ServerOptimizer {
  OptimizerSpec spec;
  std::map<std::string, KeyMultipliers> multipliers;  // by tensor name; absent -> 1, 1
};

class KVStore {
 public:
  // `type`: "dist_hybrid" (parameter server) or "dist_allreduce" (ring allreduce on
  // Gloo, no servers; Unimplemented when built without Gloo; GPU tensors on NCCL when
  // built with CUDA, see docs/cpp.md). `ctx`: the ZeroMQ context
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
  // Horovod's cross_rank and cross_size: this worker's index among the job's workers with
  // its local rank, and their number (the number of nodes when they are alike). The
  // stores compute them from the scheduler's node list; this default assumes nodes of
  // local_size workers with consecutive ranks.
  virtual int cross_rank() const { return rank() / std::max(1, local_size()); }
  virtual int cross_size() const { return num_workers() / std::max(1, local_size()); }

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

  // The optimizer on the servers (IsCapable(kOptimizer)). Collective: every worker calls
  // it with the same spec (rank 0's is what the servers get). Afterwards, for every name:
  // Broadcast(name, w, root) stores root's w as the servers' weight (and returns it to
  // everyone); PushPull(name, grad, out) pushes gradients, the servers sum them over all
  // workers, apply the rule and `out` receives the updated weight (out may alias in).
  // PushPull of a name with no weight on the servers fails naming it. A spec a server
  // cannot honour (unknown rule, bad value, NaN lr) fails on every worker with the same
  // error, and nothing changes.
  virtual absl::Status SetOptimizer(const ServerOptimizer& optimizer);
  // Not collective (any worker, typically rank 0, any time): sets one hyper-parameter
  // ("learning_rate", "wd", "momentum", "rescale_grad", ...) on every server, effective
  // from the next update. A bad name or value fails, changing nothing.
  virtual absl::Status SetOptimizerParam(absl::string_view param, double value);
  // Not collective (any worker, typically rank 0): gathers every server's weights and
  // optimizer state into `path`.
  virtual absl::Status SaveOptimizerStates(const std::string& path);
  // Collective: rank 0 reads `path` and restores weights and state on the servers, also
  // into a job with a different number of servers; every worker returns after that.
  virtual absl::Status LoadOptimizerStates(const std::string& path);

  // MXNet's set_gradient_compression (not collective; every worker should call it alike,
  // before its first push_pull): the float32 push_pulls of tensors whose names begin with
  // `name_prefix` (all by default; the longest matching prefix's setting wins) submitted
  // from now on travel to the servers 2bit-compressed with error feedback
  // (common/compression.h); the replies stay float32. kNone turns it off (the residuals
  // are kept). dist_hybrid only: the servers unpack the pushes. Unimplemented on a store
  // without servers.
  virtual absl::Status SetGradientCompression(const GradientCompression& compression,
                                              absl::string_view name_prefix = "");

  // Horovod's start_timeline (not collective): this worker records its timeline (the
  // spans HYBRIDPS_TIMELINE records, see docs/troubleshooting.md) from now until
  // StopTimeline, which writes them to `path` as Chrome trace JSON. FailedPrecondition
  // when it records already (HYBRIDPS_TIMELINE, or a StartTimeline not yet stopped).
  virtual absl::Status StartTimeline(const std::string& path);
  // Writes what StartTimeline recorded to its path; OK and nothing written when no
  // timeline was started. Shutdown stops one still running.
  virtual absl::Status StopTimeline();

  // Finishes outstanding operations and tells the scheduler this worker is done. Called by
  // the destructor if not before; later operations fail.
  virtual absl::Status Shutdown() = 0;

  // The synchronous forms: the *Async call, then Handle::Wait(). Should the store's
  // threads be stuck, they return Wait()'s DeadlineExceeded with the operation still
  // holding the tensors (keep their memory alive; the store is unusable).
  absl::Status Broadcast(absl::string_view name, TensorView tensor, int root_rank,
                         int priority = 0);
  absl::Status PushPull(absl::string_view name, TensorView in, TensorView out,
                        int priority = 0);

 protected:
  // OK for a CPU tensor with data (or none, when empty); else an error naming the tensor,
  // `what` it is ("the input") and this store's type.
  absl::Status CheckCpuTensor(absl::string_view name, const TensorView& t,
                              absl::string_view what) const;
  // OK for a view without a shape or with one that holds its count (CheckTensorShape);
  // else an error naming the tensor and `what` it is.
  static absl::Status CheckShape(absl::string_view name, const TensorView& t,
                                 absl::string_view what);
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_KVSTORE_H_
