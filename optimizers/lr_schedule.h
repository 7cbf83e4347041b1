// Learning-rate schedules, evaluated on the server by update count: MXNet 1.9.1's
// FactorScheduler, MultiFactorScheduler, PolyScheduler and CosineScheduler
// (python/mxnet/lr_scheduler.py), each with warm-up.
//
// MXNet's schedulers are stateful objects called with a growing `num_update`; here a
// schedule is a pure function of `num_update` that returns what the Python object returns
// when it is called once for every num_update = 1, 2, ... in turn (which is what an
// optimizer does in synchronous training). Factor uses base_lr * factor^k via pow where
// Python multiplies k times: equal to within double rounding, far below float precision.
#ifndef HYBRIDPS_OPTIMIZERS_LR_SCHEDULE_H_
#define HYBRIDPS_OPTIMIZERS_LR_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridps {
namespace optimizers {

enum class LrScheduleKind : uint8_t {
  kNone = 0,         // constant: the optimizer's learning_rate (MXNet lr_scheduler=None)
  kFactor = 1,       // mx.lr_scheduler.FactorScheduler
  kMultiFactor = 2,  // mx.lr_scheduler.MultiFactorScheduler
  kPoly = 3,         // mx.lr_scheduler.PolyScheduler
  kCosine = 4,       // mx.lr_scheduler.CosineScheduler
};

enum class WarmupMode : uint8_t { kLinear = 0, kConstant = 1 };

// The constructor arguments of an MXNet scheduler (same names, same defaults). Fields a
// kind does not use are ignored. From a Python scheduler object `s` that an optimizer
// already holds, take base_lr = s.warmup_final_lr (the constructor's base_lr: MXNet's
// Optimizer overwrites s.base_lr with its learning_rate) and pass the optimizer's
// learning_rate separately, as OptimizerSpec does.
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kNone;

  // LRScheduler (every kind but kNone).
  double base_lr = 0.01;
  int64_t warmup_steps = 0;  // updates 0 .. warmup_steps-1 use the warm-up rate
  double warmup_begin_lr = 0;
  WarmupMode warmup_mode = WarmupMode::kLinear;

  // kFactor: base_lr * factor^floor((num_update-1)/step), never below stop_factor_lr.
  int64_t step = 1;
  double factor = 1;  // kFactor and kMultiFactor
  double stop_factor_lr = 1e-8;

  // kMultiFactor: base_lr * factor^(number of steps[i] < num_update); strictly increasing.
  std::vector<int64_t> steps;

  // kPoly and kCosine: decay from base_lr to final_lr over warmup_steps .. max_update.
  int64_t max_update = 1;
  double final_lr = 0;
  double pwr = 2;  // kPoly
};

// OK, or InvalidArgument naming the bad field: what MXNet's constructors reject (step < 1,
// factor > 1, warmup_begin_lr > base_lr, non-increasing steps, max_update < 1, negative
// warmup_steps), plus non-finite or negative rates and, for kPoly/kCosine,
// max_update <= warmup_steps (MXNet divides by zero or decays backwards there).
absl::Status ValidateLrSchedule(const LrSchedule& schedule);

// The learning rate at `num_update` (MXNet's Optimizer.num_update: the largest update
// count of any key, 1 at the first update). `learning_rate` is the optimizer's
// learning_rate argument (nullopt: None). As in MXNet: with kNone the result is
// learning_rate, or 0.01 when None; otherwise a given learning_rate replaces base_lr for
// kFactor and kMultiFactor, while warm-up still ramps to the constructor's base_lr and
// kPoly/kCosine still decay from it. `schedule` must be valid.
double ScheduledLearningRate(const LrSchedule& schedule, std::optional<double> learning_rate,
                             int64_t num_update);

// "none", "factor", "multifactor", "poly", "cosine" (and the inverse; also accepts
// MXNet's class names such as "FactorScheduler", case-insensitive).
absl::string_view LrScheduleKindName(LrScheduleKind kind);
absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(absl::string_view name);

}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_OPTIMIZERS_LR_SCHEDULE_H_
