#include "worker/ps/ps_gpu.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace hybridps {

namespace {
ABSL_CONST_INIT absl::Mutex node_parts_mu(absl::kConstInit);
PsGpuStore::NodeGpuParts* node_parts_for_testing ABSL_GUARDED_BY(node_parts_mu) = nullptr;

// The node reduction's copier and collectives: a test's stand-ins, else CUDA and NCCL.
absl::StatusOr<PsGpuStore::NodeGpuParts> NodeGpuPartsToUse() {
  {
    absl::MutexLock lock(&node_parts_mu);
    if (node_parts_for_testing != nullptr) return *node_parts_for_testing;
  }
#if HYBRIDPS_WITH_NCCL
  return PsGpuStore::NodeGpuParts{NewCudaCopier, NewNcclNodeCollectives};
#else
  return absl::UnimplementedError(
      "HYBRIDPS_GPU_LOCAL_REDUCE=nccl needs a build with NCCL; this one has none");
#endif
}
}  // namespace

void PsGpuStore::SetNodeGpuPartsForTesting(NodeGpuParts parts) {
  absl::MutexLock lock(&node_parts_mu);
  delete node_parts_for_testing;
  node_parts_for_testing =
      parts.copier && parts.collectives ? new NodeGpuParts(std::move(parts)) : nullptr;
}

absl::StatusOr<std::unique_ptr<PsGpuStore>> PsGpuStore::Create(
    std::shared_ptr<Context> ctx, const Options& options,
    std::unique_ptr<DeviceCopier> copier) {
  std::unique_ptr<PsGpuStore> s(new PsGpuStore());
  PsGpuStore* self = s.get();
  // For HYBRIDPS_GPU_LOCAL_REDUCE=auto the scheduler needs to know how many GPUs this
  // process could reduce on with NCCL: none without NCCL or without a usable GPU.
  Options opts = options;
  opts.nccl_gpus = 0;
  if (opts.gpu_local_reduce == "auto") {
    if (auto parts = NodeGpuPartsToUse(); parts.ok()) {
      auto count = parts->copier()->DeviceCount();
      if (count.ok()) opts.nccl_gpus = *count;
    }
  }
  ASSIGN_OR_RETURN(s->ps_, PsStore::Create(std::move(ctx), opts,
                                           [self](const absl::Status& st) { self->OnBroken(st); }));
  PsStore* ps = s->ps_.get();
  GpuStager::Backend backend;
  backend.push_pull = [ps](absl::string_view name, TensorView in, TensorView out,
                           int priority) { return ps->PushPullAsync(name, in, out, priority); };
  backend.broadcast = [ps](absl::string_view name, TensorView tensor, int root,
                           int priority) {
    return ps->BroadcastAsync(name, tensor, root, priority);
  };
  s->stager_ = std::make_unique<GpuStager>(std::move(copier), std::move(backend),
                                           ps->num_workers(), options.op_timeout,
                                           /*waiting_threads_help=*/options.caller_rounds != 0,
                                           options.wait_grace, ps->timeline());
  if (ps->layout().gpu_reduce_nccl) {
    HPS_LOG(INFO) << "the node's " << ps->layout().local_size
                  << " local ranks sum GPU tensors on their GPUs (HYBRIDPS_GPU_LOCAL_REDUCE="
                  << options.gpu_local_reduce << ")";
    ASSIGN_OR_RETURN(NodeGpuParts parts, NodeGpuPartsToUse());
    ASSIGN_OR_RETURN(s->node_, NodeGpuReducer::Create(options, ps->layout(), parts.copier(),
                                                      ps, parts.collectives));
    s->node_to_abort_.store(s->node_.get(), std::memory_order_release);
  }
  return s;
}

PsGpuStore::~PsGpuStore() {
  // Here, before the members go: the staging and the node's reduction end first, then the
  // PsStore's I/O thread (which may call OnBroken).
  absl::Status s = Shutdown();
  if (!s.ok()) HPS_LOG(WARNING) << "shutdown: " << s.message();
}

void PsGpuStore::StopStaging() {
  if (node_) node_->Shutdown();
  if (stager_) stager_->Shutdown();
}

void PsGpuStore::OnBroken(const absl::Status& status) {
  if (NodeGpuReducer* node = node_to_abort_.load(std::memory_order_acquire)) {
    node->Abort(status);
  }
}

absl::StatusOr<Handle> PsGpuStore::Staged(absl::string_view name, absl::string_view what,
                                          const std::function<absl::StatusOr<Handle>()>& submit) {
  if (!node_) return submit();
  if (node_->Unfinished(name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " of '", name, "': a GPU push_pull of it is still in flight on the node's GPU "
        "reduction (HYBRIDPS_GPU_LOCAL_REDUCE=nccl); wait for it first"));
  }
  ASSIGN_OR_RETURN(Handle h, submit());
  absl::MutexLock lock(&mu_);
  staged_.insert_or_assign(std::string(name), h);
  return h;
}

absl::StatusOr<Handle> PsGpuStore::BroadcastAsync(absl::string_view name, TensorView tensor,
                                                  int root_rank, int priority) {
  return Staged(name, "broadcast", [&] {
    return stager_->BroadcastAsync(name, tensor, root_rank, priority);
  });
}

absl::StatusOr<Handle> PsGpuStore::PushPullAsync(absl::string_view name, TensorView in,
                                                 TensorView out, int priority) {
  const bool on_gpus = in.device == Device::kGPU && out.device == Device::kGPU &&
                       in.device_id == out.device_id && in.count == out.count &&
                       in.dtype == out.dtype && in.count > 0;
  if (!node_ || !on_gpus) {
    return Staged(name, "push_pull", [&] {
      return stager_->PushPullAsync(name, in, out, priority);
    });
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = staged_.find(name);
    if (it != staged_.end()) {
      if (!it->second.Done()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "push_pull of '", name, "': an operation of it on the host path (a broadcast, "
            "or a CPU tensor) is still in flight; wait for it first "
            "(HYBRIDPS_GPU_LOCAL_REDUCE=nccl)"));
      }
      staged_.erase(it);
    }
  }
  return node_->PushPullAsync(name, in, out, priority);
}

absl::Status PsGpuStore::Shutdown() {
  StopStaging();
  return ps_ ? ps_->Shutdown() : absl::OkStatus();
}

}  // namespace hybridps
