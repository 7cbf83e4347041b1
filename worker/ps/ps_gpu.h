// "dist_hybrid" with GPU tensors: the parameter-server store with host staging in front
// (worker/gpu/gpu_staging.h). KVStore::Create("dist_hybrid") makes one in CUDA builds. It
// owns a PsStore: CPU tensors go to it unchanged; a GPU tensor is copied into a pinned host
// buffer, push_pulled (or broadcast) by the PsStore as a CPU tensor, and copied back. With
// HYBRIDPS_GPU_LOCAL_REDUCE=nccl on nodes of several local ranks, GPU push_pulls are summed
// on the node's GPUs first (worker/ps/local/node_gpu_reduce.h); a push_pull and a broadcast
// of one tensor name on the two paths (a GPU push_pull there; broadcasts and CPU tensors
// here) must then not be in flight together (the second one is refused).
#ifndef HYBRIDPS_WORKER_PS_PS_GPU_H_
#define HYBRIDPS_WORKER_PS_PS_GPU_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "worker/forwarding_store.h"
#include "worker/gpu/gpu_staging.h"
#include "worker/ps/local/node_gpu_reduce.h"
#include "worker/ps/ps_store.h"

namespace hybridps {

class PsGpuStore : public ForwardingStore {
 public:
  // What the node's GPU reduction (HYBRIDPS_GPU_LOCAL_REDUCE=nccl) is built from: the
  // CUDA runtime's copier and NCCL unless a test (without a GPU) sets stand-ins, for the
  // stores created after it, process-wide; empty functions restore the defaults.
  struct NodeGpuParts {
    std::function<std::unique_ptr<DeviceCopier>()> copier;
    NodeGpuReducer::MakeCollectives collectives;
  };
  static void SetNodeGpuPartsForTesting(NodeGpuParts parts);

  // `copier`: the GPU (NewCudaCopier()).
  static absl::StatusOr<std::unique_ptr<PsGpuStore>> Create(
      std::shared_ptr<Context> ctx, const Options& options,
      std::unique_ptr<DeviceCopier> copier);
  // Finishes the staged operations and leaves the job.
  ~PsGpuStore() override;

  absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor,
                                        int root_rank, int priority) override;
  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority) override;
  absl::Status Shutdown() override;

  GpuStager::Stats staging_stats() { return stager_->stats(); }
  // The node's GPUs sum GPU push_pulls with NCCL (HYBRIDPS_GPU_LOCAL_REDUCE, as resolved).
  bool reduces_on_node_gpus() const { return node_ != nullptr; }
  // The parameter-server store behind it (tests read its counters and layout).
  PsStore* ps() { return ps_.get(); }

 private:
  KVStore& target() const override { return *ps_; }
  PsGpuStore() = default;

  // The PsStore broke (its I/O thread): stops the node's GPU reduction with it.
  void OnBroken(const absl::Status& status);
  // An operation for the staging path (`submit`). With the node's GPU reduction its order
  // against that path's push_pulls of the same name would not be kept: refused while one
  // is in flight, and recorded for the other direction.
  absl::StatusOr<Handle> Staged(absl::string_view name, absl::string_view what,
                                const std::function<absl::StatusOr<Handle>()>& submit);
  void StopStaging();

  // Declared first, so destroyed last: the stager and the node's reduction use it.
  std::unique_ptr<PsStore> ps_;
  std::unique_ptr<GpuStager> stager_;
  // HYBRIDPS_GPU_LOCAL_REDUCE=nccl: the node's GPU reduction; set in Create before any
  // operation, read-only after.
  std::unique_ptr<NodeGpuReducer> node_;
  std::atomic<NodeGpuReducer*> node_to_abort_{nullptr};  // node_, for OnBroken (I/O thread)
  absl::Mutex mu_;
  // With node_: per name, the last operation on the staging path (see Staged).
  absl::flat_hash_map<std::string, Handle> staged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PS_PS_GPU_H_
