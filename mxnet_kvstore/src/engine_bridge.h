// The bridge into MXNet's dependency engine: push_pull and broadcast of NDArrays run as
// asynchronous engine operations (the way Horovod's MXNet ops work), reading and writing
// the arrays' memory in place.
//
// Nothing links MXNet: Attach() resolves a few C API functions (MXEnginePushAsyncND,
// MXNDArrayGetData, ...) from the libmxnet.so the Python process already loaded. Only
// MXNet's C API and two plain structs of its engine ABI are used (CallbackOnComplete and
// dmlc::Error, both unchanged across 1.x); no MXNet C++ class is touched.
//
// An operation, once pushed:
//   - waits in MXNet's engine until the arrays' earlier writers (e.g. backward) finished;
//   - runs on an engine thread (FnProperty::kCPUPrioritized, so the Trainer's priority
//     orders it): fetches the data pointers (delayed allocation happens here), hands the
//     tensors to the hybridps store and returns at once;
//   - completes when the store's handle completes: the engine callback is called exactly
//     once, from the bridge's completion thread, with a dmlc::Error naming the tensor when
//     the operation failed (MXNet raises it at the next read of the output array).
// The arrays are kept alive by shallow copies released when the engine deletes the op.
#ifndef HYBRIDPS_MXNET_KVSTORE_ENGINE_BRIDGE_H_
#define HYBRIDPS_MXNET_KVSTORE_ENGINE_BRIDGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "worker/kvstore.h"

namespace hybridps {
namespace mxnet_bridge {

// Resolves MXNet's C API from the already loaded library at `libmxnet_path` (Python's
// mxnet.base._LIB._name). Idempotent. FailedPrecondition naming the missing symbol.
absl::Status Attach(const std::string& libmxnet_path);
bool Attached();

enum class OpKind { kPushPull, kBroadcast, kMark };

// One entry of the timeline (Enable with SetTimeline(true)): when the engine started the
// operation (its inputs were ready) and when it completed, in ns of CLOCK_MONOTONIC.
struct TimelineEvent {
  std::string name;
  OpKind kind;
  int64_t start_ns;
  int64_t end_ns;
};
void SetTimeline(bool on);
std::vector<TimelineEvent> TakeTimeline();
int64_t NowNs();

struct OpSpec {
  OpKind kind = OpKind::kPushPull;
  std::string name;   // the store's tensor name
  void* input = nullptr;   // NDArrayHandle (const, read) — null: in place on `output`
  void* output = nullptr;  // NDArrayHandle (mutable, written)
  // Optional NDArrayHandle every operation on `name` writes (the plugin keeps one per
  // name): MXNet's engine then runs them in the order they were pushed, even when their
  // data arrays differ (a broadcast and a push_pull staged through different host arrays).
  void* order = nullptr;
  size_t count = 0;
  TensorShape shape;  // the array's, compared across the workers
  DType dtype = DType::kFloat32;
  int priority = 0;
  int root_rank = 0;  // broadcast
};

// Pushes `spec` into MXNet's engine against `store` (kept alive until the op completed).
// kMark records a timeline event when `output`'s pending writes are done (it reads
// nothing; for measuring overlap). Errors here (not attached, bad handle) are returned;
// errors of the operation itself reach MXNet through the engine callback.
absl::Status Push(std::shared_ptr<KVStore> store, const OpSpec& spec);

// Number of operations pushed and not yet completed (all engines of this process).
int64_t Pending();

}  // namespace mxnet_bridge
}  // namespace hybridps

#endif  // HYBRIDPS_MXNET_KVSTORE_ENGINE_BRIDGE_H_
