#include "optimizers/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace hybridps {
namespace optimizers {
namespace {

bool IsRate(double v) { return std::isfinite(v) && v >= 0; }

absl::Status BadField(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("lr schedule: ", field, " ", why));
}

// LRScheduler.get_warmup_lr; warmup_final_lr is the constructor's base_lr.
double WarmupLr(const LrSchedule& s, int64_t num_update) {
  if (s.warmup_mode == WarmupMode::kConstant) return s.warmup_begin_lr;
  const double increase = (s.base_lr - s.warmup_begin_lr) * static_cast<double>(num_update) /
                          static_cast<double>(s.warmup_steps);
  return s.warmup_begin_lr + increase;
}

}  // namespace

absl::Status ValidateLrSchedule(const LrSchedule& s) {
  if (s.kind == LrScheduleKind::kNone) return absl::OkStatus();
  if (!IsRate(s.base_lr)) return BadField("base_lr", "must be finite and >= 0");
  if (s.warmup_steps < 0) return BadField("warmup_steps", "must be >= 0");
  if (!IsRate(s.warmup_begin_lr)) return BadField("warmup_begin_lr", "must be finite and >= 0");
  if (s.warmup_begin_lr > s.base_lr) {
    return BadField("warmup_begin_lr", "must not exceed base_lr");
  }
  if (s.warmup_mode != WarmupMode::kLinear && s.warmup_mode != WarmupMode::kConstant) {
    return BadField("warmup_mode", "must be linear or constant");
  }
  switch (s.kind) {
    case LrScheduleKind::kFactor:
      if (s.step < 1) return BadField("step", "must be >= 1");
      if (!(s.factor >= 0 && s.factor <= 1)) return BadField("factor", "must be in [0, 1]");
      if (!IsRate(s.stop_factor_lr)) {
        return BadField("stop_factor_lr", "must be finite and >= 0");
      }
      return absl::OkStatus();
    case LrScheduleKind::kMultiFactor:
      if (s.steps.empty()) return BadField("steps", "must not be empty");
      for (size_t i = 0; i < s.steps.size(); ++i) {
        if (s.steps[i] < 1) return BadField("steps", "must be >= 1");
        if (i > 0 && s.steps[i] <= s.steps[i - 1]) {
          return BadField("steps", "must be strictly increasing");
        }
      }
      if (!(s.factor >= 0 && s.factor <= 1)) return BadField("factor", "must be in [0, 1]");
      return absl::OkStatus();
    case LrScheduleKind::kPoly:
    case LrScheduleKind::kCosine:
      if (s.max_update < 1) return BadField("max_update", "must be >= 1");
      if (s.max_update <= s.warmup_steps) {
        return BadField("max_update", "must exceed warmup_steps");
      }
      if (!IsRate(s.final_lr)) return BadField("final_lr", "must be finite and >= 0");
      if (s.kind == LrScheduleKind::kPoly && !(std::isfinite(s.pwr) && s.pwr >= 0)) {
        return BadField("pwr", "must be finite and >= 0");
      }
      return absl::OkStatus();
    default:
      return BadField("kind", "is unknown");
  }
}

double ScheduledLearningRate(const LrSchedule& s, std::optional<double> learning_rate,
                             int64_t num_update) {
  if (s.kind == LrScheduleKind::kNone) return learning_rate.value_or(0.01);
  if (num_update < s.warmup_steps) return WarmupLr(s, num_update);
  // Optimizer.__init__ overwrites scheduler.base_lr with a given learning_rate.
  const double base = learning_rate.value_or(s.base_lr);
  switch (s.kind) {
    case LrScheduleKind::kFactor: {
      // The while loop has run floor((num_update - 1) / step) times, each multiplying by
      // factor and clamping at stop_factor_lr; with factor <= 1 that is the closed form.
      const int64_t k = num_update >= 1 ? (num_update - 1) / s.step : 0;
      if (k == 0) return base;
      return std::max(base * std::pow(s.factor, static_cast<double>(k)), s.stop_factor_lr);
    }
    case LrScheduleKind::kMultiFactor: {
      double lr = base;
      for (int64_t step : s.steps) {
        if (num_update <= step) break;
        lr *= s.factor;
      }
      return lr;
    }
    case LrScheduleKind::kPoly:
    case LrScheduleKind::kCosine: {
      // Past max_update Python returns the value it stored at max_update. The decay
      // starts from the constructor's base_lr (MXNet's base_lr_orig).
      const int64_t n = std::min(num_update, s.max_update);
      const double max_steps = static_cast<double>(s.max_update - s.warmup_steps);
      const double done = static_cast<double>(n - s.warmup_steps);
      const double span = s.base_lr - s.final_lr;
      if (s.kind == LrScheduleKind::kPoly) {
        return s.final_lr + span * std::pow(1 - done / max_steps, s.pwr);
      }
      return s.final_lr + span * (1 + std::cos(std::numbers::pi * done / max_steps)) / 2;
    }
    default:
      return base;
  }
}

absl::string_view LrScheduleKindName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kNone:
      return "none";
    case LrScheduleKind::kFactor:
      return "factor";
    case LrScheduleKind::kMultiFactor:
      return "multifactor";
    case LrScheduleKind::kPoly:
      return "poly";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "unknown";
}

absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n.size() > 9 && absl::string_view(n).substr(n.size() - 9) == "scheduler") {
    n.resize(n.size() - 9);
  }
  for (LrScheduleKind k :
       {LrScheduleKind::kNone, LrScheduleKind::kFactor, LrScheduleKind::kMultiFactor,
        LrScheduleKind::kPoly, LrScheduleKind::kCosine}) {
    if (n == LrScheduleKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown lr schedule '", std::string(name),
                   "'; known: none, factor, multifactor, poly, cosine"));
}

}  // namespace optimizers
}  // namespace hybridps
