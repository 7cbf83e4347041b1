// The server's optimizer (update_on_kvstore): the rule from the workers' spec and, per
// partition held here, the weights, the optimizer state and the update count.
//
// Weights arrive by broadcast (every closed broadcast round of a float tensor becomes its
// partition's weights, resetting its state) or by Load. A closed push_pull round's summed
// gradient becomes an update Job; the job runs on an engine thread, updates the weights
// and state in place and then writes the new weights over the gradient sum, whose buffer
// the round's replies share. The weights themselves are never shared with a reply, so a
// later update cannot change bytes still on their way to a worker.
//
// LAMB and LARS need whole-tensor norms: the workers place every partition of a tensor on
// one server while such a rule is set, and the server runs the tensor's partitions as one
// job (Prepare each, sum the partials, Apply each) once all of a round's have closed.
//
// The update count t of a tensor is also its num_update for the learning-rate schedule
// (MXNet's num_update is the largest count of any key: the same when every tensor is
// updated every step), so results do not depend on which server holds what.
//
// Threading: the I/O thread calls everything but Run; Run runs on engine threads. A
// partition's data is guarded by its slot's mutex.
#ifndef HYBRIDPS_SERVER_OPTIMIZER_HOST_H_
#define HYBRIDPS_SERVER_OPTIMIZER_HOST_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/hybridps.pb.h"
#include "optimizers/update_rule.h"

namespace hybridps {

class OptimizerHost {
 public:
  // One partition's weights and state.
  struct Slot {
    // Fixed at creation.
    std::string name;
    uint64_t key = 0;
    uint32_t part = 0;
    DType dtype = DType::kFloat32;
    uint64_t total_count = 0;
    uint64_t offset = 0;
    uint64_t count = 0;
    uint64_t generation = 0;  // wire::PartState::generation
    absl::Mutex mu;
    std::string weight ABSL_GUARDED_BY(mu);  // count elements of dtype
    // Layout().num_buffers() * count floats; empty until the first update (then zeroed,
    // the master copy taken from the weights).
    std::vector<float> state ABSL_GUARDED_BY(mu);
    int64_t updates ABSL_GUARDED_BY(mu) = 0;
  };
  // An update of one tensor's partitions (one, or all of them for LAMB/LARS).
  struct Job {
    std::shared_ptr<const optimizers::UpdateRule> rule;
    double lr_mult = 1;
    double wd_mult = 1;
    bool layer_adaptation = true;
    struct Item {
      std::shared_ptr<Slot> slot;
      void* grad;  // count elements of the slot's dtype: the summed gradient, overwritten
                   // with the new weights
    };
    std::vector<Item> items;  // by partition index
  };

  bool active() const { return rule_ != nullptr; }
  bool needs_tensor_norms() const { return rule_ && rule_->needs_tensor_norms(); }

  // Installs `spec` (validate_only: only checks it). A new optimizer starts from fresh
  // state: every partition held is dropped (the workers send the weights again).
  absl::Status Configure(const wire::OptimizerSpec& spec, bool validate_only);
  // Sets one hyper-parameter, effective from the next update. A change that would change
  // the state layout (e.g. SGD's momentum from 0) is refused.
  absl::Status SetParam(const wire::SetOptimizerParam& param, bool validate_only);

  // A closed broadcast round: `data` (req.count() elements) becomes the partition's
  // weights, with fresh state. Ignored for dtypes no rule updates.
  void StoreBroadcast(const wire::DataRequest& req, const void* data);
  // A closed push_pull round of `req`'s partition: the job for it, or an error naming the
  // tensor (no weights here, a shape that differs from the weights'). Needs active().
  absl::StatusOr<Job> MakeJob(const wire::DataRequest& req, void* grad);
  // Appends another partition's item to a LAMB/LARS job.
  absl::Status AddToJob(Job& job, const wire::DataRequest& req, void* grad);

  // Stores the partitions' weights, state and counts, replacing those held (all checked
  // first: nothing changes on an error).
  absl::Status Load(const wire::OptimizerLoad& load);
  // The partitions held, in a fixed order, from index `from` until about `budget` bytes
  // (at least one), and the spec in effect.
  void Dump(uint64_t from, size_t budget, wire::OptimizerResponse* out);

  // Engine thread: runs the update.
  static absl::Status Run(const Job& job);

 private:
  absl::StatusOr<std::shared_ptr<Slot>> Find(const wire::DataRequest& req);

  std::shared_ptr<const optimizers::UpdateRule> rule_;
  wire::OptimizerSpec spec_;
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<Slot>> slots_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_SERVER_OPTIMIZER_HOST_H_
