// Schedules against values computed by hand from python/mxnet/lr_scheduler.py (1.9.1).
#include "optimizers/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace optimizers {
namespace {

double At(const LrSchedule& s, int64_t n, std::optional<double> lr = std::nullopt) {
  EXPECT_OK(ValidateLrSchedule(s));
  return ScheduledLearningRate(s, lr, n);
}

TEST(LrScheduleTest, NoneIsTheLearningRate) {
  LrSchedule s;
  EXPECT_DOUBLE_EQ(At(s, 1, 0.3), 0.3);
  EXPECT_DOUBLE_EQ(At(s, 1000, 0.3), 0.3);
  EXPECT_DOUBLE_EQ(At(s, 5), 0.01);  // MXNet's default when learning_rate is None
}

TEST(LrScheduleTest, FactorStepsAfterEveryStepUpdates) {
  LrSchedule s;
  s.kind = LrScheduleKind::kFactor;
  s.base_lr = 1.0;
  s.step = 10;
  s.factor = 0.5;
  // FactorScheduler(step=10): 1..10 -> base, 11..20 -> base/2, 21 -> base/4.
  EXPECT_DOUBLE_EQ(At(s, 1), 1.0);
  EXPECT_DOUBLE_EQ(At(s, 10), 1.0);
  EXPECT_DOUBLE_EQ(At(s, 11), 0.5);
  EXPECT_DOUBLE_EQ(At(s, 20), 0.5);
  EXPECT_DOUBLE_EQ(At(s, 21), 0.25);
  EXPECT_DOUBLE_EQ(At(s, 101), 1.0 / 1024);
}

TEST(LrScheduleTest, FactorStopsAtStopFactorLr) {
  LrSchedule s;
  s.kind = LrScheduleKind::kFactor;
  s.base_lr = 1.0;
  s.step = 1;
  s.factor = 0.1;
  s.stop_factor_lr = 1e-3;
  EXPECT_DOUBLE_EQ(At(s, 1), 1.0);
  EXPECT_NEAR(At(s, 2), 0.1, 1e-15);
  EXPECT_NEAR(At(s, 4), 1e-3, 1e-15);
  EXPECT_DOUBLE_EQ(At(s, 5), 1e-3);  // 1e-4 clamps
  EXPECT_DOUBLE_EQ(At(s, 500), 1e-3);
}

TEST(LrScheduleTest, FactorWithLinearWarmup) {
  LrSchedule s;
  s.kind = LrScheduleKind::kFactor;
  s.base_lr = 1.0;
  s.step = 10;
  s.factor = 0.5;
  s.warmup_steps = 5;
  s.warmup_begin_lr = 0.0;
  EXPECT_DOUBLE_EQ(At(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(At(s, 2), 0.4);
  EXPECT_DOUBLE_EQ(At(s, 4), 0.8);
  EXPECT_DOUBLE_EQ(At(s, 5), 1.0);  // warm-up over; count 0 still
  EXPECT_DOUBLE_EQ(At(s, 11), 0.5);
  // learning_rate replaces base_lr after warm-up but warm-up still ramps to base_lr.
  EXPECT_DOUBLE_EQ(At(s, 2, 2.0), 0.4);
  EXPECT_DOUBLE_EQ(At(s, 5, 2.0), 2.0);
  EXPECT_DOUBLE_EQ(At(s, 11, 2.0), 1.0);
}

TEST(LrScheduleTest, MultiFactor) {
  LrSchedule s;
  s.kind = LrScheduleKind::kMultiFactor;
  s.base_lr = 1.0;
  s.steps = {5, 8};
  s.factor = 0.1;
  EXPECT_DOUBLE_EQ(At(s, 1), 1.0);
  EXPECT_DOUBLE_EQ(At(s, 5), 1.0);
  EXPECT_DOUBLE_EQ(At(s, 6), 0.1);
  EXPECT_DOUBLE_EQ(At(s, 8), 0.1);
  EXPECT_DOUBLE_EQ(At(s, 9), 0.1 * 0.1);
  EXPECT_DOUBLE_EQ(At(s, 1000), 0.1 * 0.1);
  s.warmup_steps = 3;
  s.warmup_begin_lr = 0.1;
  s.warmup_mode = WarmupMode::kConstant;
  EXPECT_DOUBLE_EQ(At(s, 2), 0.1);
  EXPECT_DOUBLE_EQ(At(s, 3), 1.0);
}

TEST(LrScheduleTest, PolyWithWarmup) {
  LrSchedule s;
  s.kind = LrScheduleKind::kPoly;
  s.base_lr = 1.0;
  s.max_update = 10;
  s.pwr = 2;
  EXPECT_DOUBLE_EQ(At(s, 0), 1.0);
  EXPECT_DOUBLE_EQ(At(s, 5), 0.25);
  EXPECT_DOUBLE_EQ(At(s, 10), 0.0);
  EXPECT_DOUBLE_EQ(At(s, 20), 0.0);  // stays at the value of max_update
  s.warmup_steps = 2;
  s.warmup_begin_lr = 0.2;
  s.final_lr = 0.1;
  EXPECT_DOUBLE_EQ(At(s, 1), 0.6);  // 0.2 + (1 - 0.2) * 1/2
  EXPECT_DOUBLE_EQ(At(s, 2), 1.0);
  EXPECT_DOUBLE_EQ(At(s, 6), 0.1 + 0.9 * 0.25);  // (1 - 4/8)^2
  EXPECT_DOUBLE_EQ(At(s, 30), 0.1);
  // Poly decays from its constructor's base_lr whatever learning_rate says.
  EXPECT_DOUBLE_EQ(At(s, 6, 5.0), 0.1 + 0.9 * 0.25);
}

TEST(LrScheduleTest, CosineWithWarmup) {
  LrSchedule s;
  s.kind = LrScheduleKind::kCosine;
  s.base_lr = 1.0;
  s.final_lr = 0.1;
  s.max_update = 10;
  EXPECT_DOUBLE_EQ(At(s, 0), 1.0);
  EXPECT_DOUBLE_EQ(At(s, 5), 0.1 + 0.9 * (1 + std::cos(std::numbers::pi / 2)) / 2);
  EXPECT_NEAR(At(s, 5), 0.55, 1e-15);
  EXPECT_DOUBLE_EQ(At(s, 10), 0.1);
  EXPECT_DOUBLE_EQ(At(s, 15), 0.1);
  s.warmup_steps = 4;
  s.warmup_begin_lr = 0.2;
  EXPECT_DOUBLE_EQ(At(s, 2), 0.6);
  EXPECT_DOUBLE_EQ(At(s, 4), 1.0);
  EXPECT_NEAR(At(s, 7), 0.55, 1e-15);  // halfway through 4..10
}

TEST(LrScheduleTest, RejectsWhatMxnetRejects) {
  LrSchedule s;
  s.kind = LrScheduleKind::kFactor;
  s.step = 0;
  EXPECT_NE(ValidateLrSchedule(s).message().find("step"), std::string::npos);
  s.step = 1;
  s.factor = 1.5;
  EXPECT_NE(ValidateLrSchedule(s).message().find("factor"), std::string::npos);
  s.factor = 0.5;
  s.warmup_begin_lr = 1.0;  // above base_lr 0.01
  EXPECT_NE(ValidateLrSchedule(s).message().find("warmup_begin_lr"), std::string::npos);
  s.warmup_begin_lr = 0;
  s.base_lr = std::nan("");
  EXPECT_NE(ValidateLrSchedule(s).message().find("base_lr"), std::string::npos);
  s.base_lr = 0.1;
  s.warmup_steps = -1;
  EXPECT_NE(ValidateLrSchedule(s).message().find("warmup_steps"), std::string::npos);

  LrSchedule m;
  m.kind = LrScheduleKind::kMultiFactor;
  m.steps = {5, 5};
  EXPECT_NE(ValidateLrSchedule(m).message().find("increasing"), std::string::npos);
  m.steps = {};
  EXPECT_FALSE(ValidateLrSchedule(m).ok());

  LrSchedule p;
  p.kind = LrScheduleKind::kPoly;
  p.max_update = 0;
  EXPECT_NE(ValidateLrSchedule(p).message().find("max_update"), std::string::npos);
  p.max_update = 5;
  p.warmup_steps = 5;
  EXPECT_NE(ValidateLrSchedule(p).message().find("max_update"), std::string::npos);
}

TEST(LrScheduleTest, KindNames) {
  EXPECT_EQ(*ParseLrScheduleKind("FactorScheduler"), LrScheduleKind::kFactor);
  EXPECT_EQ(*ParseLrScheduleKind("multifactor"), LrScheduleKind::kMultiFactor);
  EXPECT_EQ(*ParseLrScheduleKind("Cosine"), LrScheduleKind::kCosine);
  EXPECT_EQ(LrScheduleKindName(LrScheduleKind::kPoly), "poly");
  EXPECT_FALSE(ParseLrScheduleKind("step").ok());
}

}  // namespace
}  // namespace optimizers
}  // namespace hybridps
