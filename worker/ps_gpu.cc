#include "worker/ps_gpu.h"

#include "common/status.h"

namespace hybridps {

absl::StatusOr<std::unique_ptr<PsGpuStore>> PsGpuStore::Create(
    std::shared_ptr<Context> ctx, const Options& options,
    std::unique_ptr<DeviceCopier> copier) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<PsGpuStore> s(new PsGpuStore(std::move(ctx), options));
  RETURN_IF_ERROR(s->Start());
  PsGpuStore* self = s.get();
  GpuStager::Backend backend;  // PsStore's own operations, not this class's overrides
  backend.push_pull = [self](absl::string_view name, TensorView in, TensorView out,
                             int priority) {
    return self->PsStore::PushPullAsync(name, in, out, priority);
  };
  backend.broadcast = [self](absl::string_view name, TensorView tensor, int root,
                             int priority) {
    return self->PsStore::BroadcastAsync(name, tensor, root, priority);
  };
  s->stager_ = std::make_unique<GpuStager>(std::move(copier), std::move(backend),
                                           s->num_workers(), options.op_timeout,
                                           /*waiting_threads_help=*/options.caller_rounds != 0);
  return s;
}

PsGpuStore::~PsGpuStore() {
  if (stager_) stager_->Shutdown();
}

absl::StatusOr<Handle> PsGpuStore::BroadcastAsync(absl::string_view name, TensorView tensor,
                                                  int root_rank, int priority) {
  return stager_->BroadcastAsync(name, tensor, root_rank, priority);
}

absl::StatusOr<Handle> PsGpuStore::PushPullAsync(absl::string_view name, TensorView in,
                                                 TensorView out, int priority) {
  return stager_->PushPullAsync(name, in, out, priority);
}

absl::Status PsGpuStore::Shutdown() {
  if (stager_) stager_->Shutdown();
  return PsStore::Shutdown();
}

}  // namespace hybridps
