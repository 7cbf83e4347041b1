#include "worker/kvstore.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/transport.h"

namespace hybridps {

absl::Status KVStore::CheckShape(absl::string_view name, const TensorView& t,
                                 absl::string_view what) {
  absl::Status s = CheckTensorShape(t.shape, t.count);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", what, "'s ",
                                                 s.message()));
}

absl::Status KVStore::CheckCpuTensor(absl::string_view name, const TensorView& t,
                                     absl::string_view what) const {
  RETURN_IF_ERROR(CheckShape(name, t, what));
  if (t.device != Device::kCPU) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor '", name, "': ", what, " is a GPU tensor; this build's ", type(),
        " store handles CPU tensors only"));
  }
  if (t.data == nullptr && t.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", what, " has ", t.count, " elements but no data"));
  }
  return absl::OkStatus();
}

namespace {
absl::Status NoServerOptimizer(absl::string_view type, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      what, ": the ", type, " store has no server-side optimizer (use dist_hybrid, or update "
      "the weights on the workers)"));
}
}  // namespace

absl::Status KVStore::SetOptimizer(const ServerOptimizer&) {
  return NoServerOptimizer(type(), "SetOptimizer");
}

absl::Status KVStore::SetOptimizerParam(absl::string_view, double) {
  return NoServerOptimizer(type(), "SetOptimizerParam");
}

absl::Status KVStore::SaveOptimizerStates(const std::string&) {
  return NoServerOptimizer(type(), "SaveOptimizerStates");
}

absl::Status KVStore::LoadOptimizerStates(const std::string&) {
  return NoServerOptimizer(type(), "LoadOptimizerStates");
}

absl::Status KVStore::SetGradientCompression(const GradientCompression& compression,
                                             absl::string_view) {
  RETURN_IF_ERROR(CheckGradientCompression(compression));
  if (compression.type == Compression::kNone) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "2bit gradient compression needs servers that unpack the pushes: the ", type(),
      " store has none (use dist_hybrid, or Horovod's Compression.fp16, which halves ",
      "dist_allreduce's traffic)"));
}

absl::Status KVStore::StartTimeline(const std::string&) {
  return absl::UnimplementedError(absl::StrCat("the ", type(), " store records no timeline"));
}

absl::Status KVStore::StopTimeline() { return absl::OkStatus(); }

absl::Status KVStore::Broadcast(absl::string_view name, TensorView tensor, int root_rank,
                                int priority) {
  ASSIGN_OR_RETURN(Handle h, BroadcastAsync(name, tensor, root_rank, priority));
  return h.Wait();
}

absl::Status KVStore::PushPull(absl::string_view name, TensorView in, TensorView out,
                               int priority) {
  ASSIGN_OR_RETURN(Handle h, PushPullAsync(name, in, out, priority));
  return h.Wait();
}

}  // namespace hybridps
