#include "optimizers/spec_wire.h"

#include "absl/strings/str_cat.h"

namespace hybridps {
namespace optimizers {

void SpecToWire(const OptimizerSpec& spec, wire::OptimizerSpec* out) {
  out->set_rule(spec.rule);
  for (const auto& [k, v] : spec.params) (*out->mutable_params())[k] = v;
  out->set_multi_precision(spec.multi_precision);
  const LrSchedule& s = spec.schedule;
  wire::LrScheduleSpec* w = out->mutable_schedule();
  w->set_kind(static_cast<uint32_t>(s.kind));
  w->set_base_lr(s.base_lr);
  w->set_warmup_steps(s.warmup_steps);
  w->set_warmup_begin_lr(s.warmup_begin_lr);
  w->set_warmup_mode(static_cast<uint32_t>(s.warmup_mode));
  w->set_step(s.step);
  w->set_factor(s.factor);
  w->set_stop_factor_lr(s.stop_factor_lr);
  for (int64_t step : s.steps) w->add_steps(step);
  w->set_max_update(s.max_update);
  w->set_final_lr(s.final_lr);
  w->set_pwr(s.pwr);
}

absl::StatusOr<OptimizerSpec> SpecFromWire(const wire::OptimizerSpec& in) {
  OptimizerSpec spec;
  spec.rule = in.rule();
  for (const auto& [k, v] : in.params()) spec.params[k] = v;
  spec.multi_precision = in.multi_precision();
  const wire::LrScheduleSpec& w = in.schedule();
  if (w.kind() > static_cast<uint32_t>(LrScheduleKind::kCosine)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer '", in.rule(), "': unknown lr schedule kind ", w.kind()));
  }
  if (w.warmup_mode() > static_cast<uint32_t>(WarmupMode::kConstant)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer '", in.rule(), "': unknown lr schedule warm-up mode ", w.warmup_mode()));
  }
  LrSchedule& s = spec.schedule;
  s.kind = static_cast<LrScheduleKind>(w.kind());
  s.base_lr = w.base_lr();
  s.warmup_steps = w.warmup_steps();
  s.warmup_begin_lr = w.warmup_begin_lr();
  s.warmup_mode = static_cast<WarmupMode>(w.warmup_mode());
  s.step = w.step();
  s.factor = w.factor();
  s.stop_factor_lr = w.stop_factor_lr();
  s.steps.assign(w.steps().begin(), w.steps().end());
  s.max_update = w.max_update();
  s.final_lr = w.final_lr();
  s.pwr = w.pwr();
  return spec;
}

}  // namespace optimizers
}  // namespace hybridps
