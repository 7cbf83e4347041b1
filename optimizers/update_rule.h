// Server-side optimizer update rules with MXNet 1.9.1's formulas and hyper-parameter
// names (python/mxnet/optimizer/optimizer.py and the fused update operators), for MXNet's
// update_on_kvstore. Pure compute: no networking, no threads of its own.
//
// A tensor's weights are split into partitions, possibly held by different servers. When
// a round of a key closes, the server calls, for every partition of the tensor:
//
//   StepArgs args = rule->Step(t, num_update, lr_mult, wd_mult);
//   if (!rule->needs_tensor_norms()) {
//     RETURN_IF_ERROR(rule->Apply(partition, args, TensorNorms{}));
//   } else {  // LAMB, LARS: two phases around a sum over the tensor's partitions
//     ASSIGN_OR_RETURN(NormPartials mine, rule->Prepare(partition, args));
//     ... add the NormPartials of all partitions of the tensor, wherever they are ...
//     RETURN_IF_ERROR(rule->Apply(partition, args, FinishNorms(total)));
//   }
//
// Prepare changes the partition's state (LAMB's moments) but not its weights, so it runs
// exactly once per round and partition, before Apply. A tensor held in one partition can
// call Update, which does both phases. Splitting a tensor into k partitions gives the
// single-partition result up to the rounding of the norm sums (tested).
//
// Thread safety: an UpdateRule is immutable after MakeUpdateRule; every method is const
// and may run concurrently on different partitions (e.g. on a server's engine threads).
// Buffers of concurrent calls must not overlap.
//
// Changing a hyper-parameter (or the learning rate) at run time: build a new rule from
// the changed spec. State buffers stay valid as long as Layout() is unchanged (same rule,
// same momentum-zero-ness, same centered flag); compare the layouts to decide.
//
// Fidelity to MXNet 1.9.1 (tests/optimizers/test_against_mxnet.py runs MXNet itself):
// SGD, NAG, Signum, Adam, AdamW, AdaGrad and RMSProp give bit-identical weights, float32
// and float16 with multi_precision, with every schedule: the kernels repeat the
// operators' float operations in order, and hyper-parameters reach them as MXNet's
// operators receive them (optimizers/mxnet_float.h). Where we differ, on purpose:
// - LAMB and LARS sum the squares for their norms in double, per partition, so that a
//   tensor split over servers gets the norms of the whole; MXNet's CPU multi_sum_sq sums
//   sequentially in float32 (in float16 arithmetic for float16 weights), a relative
//   error that grows with the tensor (about 1e-4 at 1M elements). Weights agree with
//   MXNet to ~3e-7 on 1001-element tensors over 50 steps.
// - LARS momentum_correction scales the momentum by lr/prev_lr of the key's own
//   previous update. MXNet keeps one last_lr for the whole optimizer, so with several
//   keys only the first key updated after a learning-rate change sees the correction.
// - float16/bfloat16 weights without multi_precision keep float32 state and compute in
//   float32 (MXNet computes in float16 there). bfloat16 gets a master copy like float16
//   (MXNet's multi_precision covers float16 only).
// - AdaGrad with a negative clip_gradient does not clip (MXNet calls clip(g, -c, c) with
//   an empty range); clip_gradient = 0 clips to 0 as in MXNet.
// - Rejected up front where MXNet would accept and then diverge or fail later: negative
//   learning_rate/wd/epsilon, momentum or betas outside [0, 1), Signum's wd_lh without
//   momentum (MXNet 1.9.1 raises inside signsgd_update), Poly/Cosine schedules with
//   max_update <= warmup_steps.
//
// From a Python optimizer object `opt` (for the bindings): rule = type(opt).__name__
// lower-cased; params from its attributes under these names (learning_rate = opt.lr,
// AdaGrad's eps = opt.float_stable_eps), leaving out those that are None;
// schedule from opt.lr_scheduler (see LrSchedule); multi_precision = opt.multi_precision;
// lr_mult / wd_mult per key from the parameters (MXNet's pickling drops them; we keep
// them). AdamW has no class in MXNet 1.9.1: "adamw" follows the contrib adamw_update
// operator (see adam_rules.cc).
#ifndef HYBRIDPS_OPTIMIZERS_UPDATE_RULE_H_
#define HYBRIDPS_OPTIMIZERS_UPDATE_RULE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "optimizers/lr_schedule.h"

namespace hybridps {
namespace optimizers {
class UpdateRule;
namespace internal {
struct RuleInit;
float KwParam(const UpdateRule& rule, const char* name);
}  // namespace internal

// What a server receives to set up its optimizer (the wire form is the caller's).
struct OptimizerSpec {
  // MXNet optimizer name, case-insensitive: "sgd", "nag", "signum", "adam", "adamw",
  // "adagrad", "rmsprop", "lamb", "lars" (KnownRules()).
  std::string rule;
  // Hyper-parameters by MXNet's names (booleans as 0/1): learning_rate, wd, rescale_grad,
  // clip_gradient for every rule, plus the rule's own (see RuleParamNames). An absent name
  // takes MXNet's default; names whose MXNet default is None (clip_gradient, clip_weights,
  // lower_bound, upper_bound, and learning_rate for sgd/nag/adagrad/lars) are off when
  // absent. Per-key lr_mult / wd_mult are not here: they go into Step().
  std::map<std::string, double> params;
  LrSchedule schedule;
  // float16/bfloat16 weights keep a float32 master copy in state and update it in float32
  // (MXNet's multi_precision). Without it they are widened, updated in float32 and rounded
  // back every step, losing updates below their precision. State is always float32.
  bool multi_precision = false;
};

// The float32 state buffers a rule needs for one partition. Each buffer holds one float per
// weight element (element-aligned with the weight), so the state of a slice [a, b) of a
// tensor is that slice of every buffer: save it per partition and re-split it freely into
// another partitioning (another server count) on load.
struct StateLayout {
  std::vector<std::string> buffers;  // names in Partition::state order: "weight32" (the
                                     // master copy, first when present), "mom", "mean",
                                     // "var", "history", "n", "g", "delta"
  size_t num_buffers() const { return buffers.size(); }
  size_t bytes(size_t count) const { return buffers.size() * count * sizeof(float); }
  bool operator==(const StateLayout&) const = default;
};

// One partition of a tensor, as the caller owns it.
struct Partition {
  void* weight = nullptr;         // `count` elements of `dtype`, updated in place
  const void* grad = nullptr;     // `count` elements of `dtype`: the round's summed gradient
  DType dtype = DType::kFloat32;  // kFloat32, kFloat16 or kBFloat16
  size_t count = 0;
  std::span<float* const> state;  // Layout(dtype).num_buffers() buffers of `count` floats
  // Optional, Apply only: also receives the updated weights (`count` elements of `dtype`),
  // block by block while they are still in cache (one pass instead of the update and a
  // copy). May alias `grad`: a block's gradient is read before that block is written.
  void* weight_copy = nullptr;
};

// Per key and update: what MXNet's Optimizer computes in Python before calling its op.
struct StepArgs {
  int64_t t = 1;       // this key's update count, this update included (MXNet
                       // _index_update_count[key]): Adam/LAMB bias correction
  double lr = 0.01;    // effective learning rate: LearningRate(num_update) * lr_mult
  double wd = 0;       // effective weight decay: wd * wd_mult
  double prev_lr = 0;  // LARS momentum_correction: the effective lr of the previous update
                       // (0: no correction)
  bool layer_adaptation = true;  // LARS: false for parameters MXNet's LARS exempts by name
                                 // (IsLarsExemptName)
};

// Phase 1 of LAMB and LARS: one partition's sums of squares. Sum them over the tensor.
struct NormPartials {
  double weight_sq = 0;  // sum of w^2 over the stored weights
  double update_sq = 0;  // LAMB: sum of the update direction g^2; LARS: of the raw gradient
  NormPartials& operator+=(const NormPartials& o) {
    weight_sq += o.weight_sq;
    update_sq += o.update_sq;
    return *this;
  }
};

// Whole-tensor norms for Apply (ignored by rules without needs_tensor_norms()).
struct TensorNorms {
  double weight_norm = 0;
  double update_norm = 0;
};
TensorNorms FinishNorms(const NormPartials& total);

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  UpdateRule(const UpdateRule&) = delete;
  UpdateRule& operator=(const UpdateRule&) = delete;

  // The canonical (lower-case) rule name and the spec the rule was made from.
  const std::string& name() const { return name_; }
  const OptimizerSpec& spec() const { return spec_; }
  // Every hyper-parameter in effect, defaults filled in (None-valued ones absent).
  const std::map<std::string, double>& hyper_parameters() const { return params_; }
  std::optional<double> param(absl::string_view name) const;

  // The scheduled learning rate before lr_mult (MXNet: lr_scheduler(num_update) or lr).
  double LearningRate(int64_t num_update) const;
  double weight_decay() const;
  // StepArgs for a key's t-th update, the optimizer at num_update (in synchronous
  // training, t), with the key's multipliers.
  StepArgs Step(int64_t t, int64_t num_update, double lr_mult = 1, double wd_mult = 1) const;

  // Weight dtypes the rule updates: float32, float16, bfloat16.
  static bool SupportsDType(DType dtype);
  StateLayout Layout(DType weight_dtype) const;
  // Zeroes the partition's state and copies the weights into the master copy if any.
  absl::Status InitState(const Partition& partition) const;

  // True for LAMB and LARS: Prepare, sum, FinishNorms, Apply (see the file comment).
  virtual bool needs_tensor_norms() const { return false; }
  // Phase 1. Rules without tensor norms return zeros and change nothing.
  absl::StatusOr<NormPartials> Prepare(const Partition& partition, const StepArgs& args) const;
  // Phase 2 (the only phase for the other rules): updates weights and state in place.
  // InvalidArgument, changing nothing, for a bad partition (dtype, state count, null
  // pointers), bad args (t < 1, negative or non-finite lr) or bad norms.
  absl::Status Apply(const Partition& partition, const StepArgs& args,
                     const TensorNorms& norms) const;
  // Prepare + FinishNorms + Apply for a tensor held whole in `partition`.
  absl::Status Update(const Partition& partition, const StepArgs& args) const;

 protected:
  // Which kernel a phase runs, with its float scalars (defined in optimizers/kernels.h).
  struct Plan;
  // `state_names`: the rule's state buffers, after the optional master copy.
  UpdateRule(internal::RuleInit&& init, std::vector<std::string> state_names);

  double P(const char* name) const;  // a hyper-parameter that has a value
  bool Has(const char* name) const { return params_.count(name) != 0; }

 private:
  friend float internal::KwParam(const UpdateRule& rule, const char* name);
  // P(name) as MXNet's operator receives it when passed as a float kwarg
  // (optimizers/mxnet_float.h), converted once at construction.
  float KwP(const char* name) const;

  virtual void PlanApply(const StepArgs& args, const TensorNorms& norms, Plan* plan) const = 0;
  virtual void PlanPrepare(const StepArgs& args, Plan* plan) const;

  absl::Status Check(const Partition& partition, const StepArgs& args) const;
  void Run(const Partition& partition, const Plan& plan, NormPartials* sums) const;

  std::string name_;
  OptimizerSpec spec_;
  std::map<std::string, double> params_;
  std::map<std::string, float, std::less<>> kw_params_;
  std::optional<double> learning_rate_;  // MXNet's Optimizer(learning_rate=...)
  StateLayout layout_;                   // float32 weights (and 16-bit ones without master copy)
  StateLayout master_layout_;            // 16-bit weights with the master copy
};

// Builds the rule of `spec`. InvalidArgument, naming the culprit, for an unknown rule (the
// message lists the known ones), an unknown hyper-parameter name (listing the rule's),
// a bad value (NaN or negative learning_rate, wd, epsilon; beta/momentum/gamma outside
// [0, 1); a non-0/1 boolean; ...) or a bad schedule.
absl::StatusOr<std::unique_ptr<UpdateRule>> MakeUpdateRule(const OptimizerSpec& spec);

// "adagrad", "adam", "adamw", "lamb", "lars", "nag", "rmsprop", "sgd", "signum".
std::vector<std::string> KnownRules();
// The hyper-parameter names `rule` accepts (common ones included); empty if unknown.
std::vector<std::string> RuleParamNames(absl::string_view rule);

// MXNet's LARS skips layer adaptation for parameters whose name ends in "gamma", "beta"
// or "bias" (batch-norm and bias parameters).
bool IsLarsExemptName(absl::string_view param_name);

}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_OPTIMIZERS_UPDATE_RULE_H_
