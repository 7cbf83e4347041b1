// A KVStore that hands every call to another store: the base of stores that put a stage
// in front of one (GPU staging) or own something beside one (a process set's scheduler).
// Subclasses override the calls they change and say where the others go (target()). It
// does not shut its target down when destroyed: the subclass that owns it does.
#ifndef HYBRIDPS_WORKER_FORWARDING_STORE_H_
#define HYBRIDPS_WORKER_FORWARDING_STORE_H_

#include <string>

#include "worker/kvstore.h"

namespace hybridps {

class ForwardingStore : public KVStore {
 public:
  absl::string_view type() const override { return target().type(); }
  int rank() const override { return target().rank(); }
  int num_workers() const override { return target().num_workers(); }
  int local_rank() const override { return target().local_rank(); }
  int local_size() const override { return target().local_size(); }
  int cross_rank() const override { return target().cross_rank(); }
  int cross_size() const override { return target().cross_size(); }
  absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor,
                                        int root_rank, int priority = 0) override {
    return target().BroadcastAsync(name, tensor, root_rank, priority);
  }
  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority = 0) override {
    return target().PushPullAsync(name, in, out, priority);
  }
  absl::Status Barrier() override { return target().Barrier(); }
  bool IsCapable(Capability capability) const override {
    return target().IsCapable(capability);
  }
  absl::Status SetOptimizer(const ServerOptimizer& optimizer) override {
    return target().SetOptimizer(optimizer);
  }
  absl::Status SetOptimizerParam(absl::string_view param, double value) override {
    return target().SetOptimizerParam(param, value);
  }
  absl::Status SaveOptimizerStates(const std::string& path) override {
    return target().SaveOptimizerStates(path);
  }
  absl::Status LoadOptimizerStates(const std::string& path) override {
    return target().LoadOptimizerStates(path);
  }
  absl::Status SetGradientCompression(const GradientCompression& compression,
                                      absl::string_view name_prefix = "") override {
    return target().SetGradientCompression(compression, name_prefix);
  }
  absl::Status StartTimeline(const std::string& path) override {
    return target().StartTimeline(path);
  }
  absl::Status StopTimeline() override { return target().StopTimeline(); }
  absl::Status Shutdown() override { return target().Shutdown(); }

 protected:
  // Where the calls not overridden go.
  virtual KVStore& target() const = 0;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_FORWARDING_STORE_H_
