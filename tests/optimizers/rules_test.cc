// Every rule against the double-precision scalar reference (tests/optimizers/reference.h),
// for 60 steps on random data with a fixed seed, in every dtype; and the AVX2 kernels
// against the portable ones, bit for bit.
//
// Tolerances (|ours - reference| <= rel * |reference| + abs):
//   float32 weights, and the float32 master copy of 16-bit weights: rel 1e-5, abs 1e-5
//     (float rounding over 60 steps; the reference is double).
//   float16 / bfloat16 weights with a master copy: one unit in the last place of the
//     16-bit format (rel 2^-10 / 2^-7; the stored weight is the master rounded once).
//   float16 / bfloat16 weights without a master copy (rounded every step): three units
//     in the last place at magnitude max(|w|, 1) (an ulp flip when float and double
//     straddle a rounding boundary carries into later steps as an absolute error).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "optimizers/kernels.h"
#include "optimizers/update_rule.h"
#include "tests/optimizers/reference.h"
#include "tests/optimizers/test_util.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace optimizers {
namespace {

using testing::OwnedTensor;
using testing::RoundTo;
using testing::ScalarReference;
using testing::SetSameWeights;

struct RuleCase {
  const char* label;
  std::string rule;
  std::map<std::string, double> params;
  LrSchedule schedule;
};

LrSchedule FactorEvery(int64_t step, double factor, double base_lr) {
  LrSchedule s;
  s.kind = LrScheduleKind::kFactor;
  s.step = step;
  s.factor = factor;
  s.base_lr = base_lr;
  return s;
}

std::vector<RuleCase> Cases() {
  return {
      {"sgd", "sgd", {{"learning_rate", 0.05}}, {}},
      {"sgd_momentum_wd_clip",
       "sgd",
       {{"learning_rate", 0.05},
        {"momentum", 0.9},
        {"wd", 1e-3},
        {"clip_gradient", 0.5},
        {"rescale_grad", 0.5}},
       {}},
      {"nag_momentum_wd", "nag", {{"learning_rate", 0.05}, {"momentum", 0.9}, {"wd", 1e-2}}, {}},
      {"nag_plain_clip",
       "nag",
       {{"learning_rate", 0.05}, {"wd", 1e-2}, {"clip_gradient", 0.3}},
       {}},
      {"signum", "signum", {{"wd_lh", 0.01}, {"wd", 1e-3}, {"clip_gradient", 0.4}}, {}},
      {"signsgd", "signum", {{"momentum", 0.0}, {"wd", 1e-2}}, {}},
      {"adam", "adam", {{"learning_rate", 0.01}}, {}},
      {"adam_wd_clip",
       "adam",
       {{"learning_rate", 0.01},
        {"wd", 1e-3},
        {"clip_gradient", 0.8},
        {"beta1", 0.8},
        {"epsilon", 1e-6}},
       {}},
      {"adamw",
       "adamw",
       {{"learning_rate", 0.01}, {"eta", 0.5}, {"wd", 0.01}, {"clip_gradient", 1.0}},
       {}},
      {"adamw_correct_bias",
       "adamw",
       {{"learning_rate", 0.01}, {"correct_bias", 1}, {"wd", 0.01}},
       {}},
      {"adagrad",
       "adagrad",
       {{"learning_rate", 0.05}, {"wd", 1e-3}, {"clip_gradient", 0.7}, {"rescale_grad", 0.5}},
       {}},
      {"rmsprop", "rmsprop", {{"learning_rate", 0.01}, {"wd", 1e-3}}, {}},
      {"rmsprop_centered",
       "rmsprop",
       {{"learning_rate", 0.01},
        {"centered", 1},
        {"gamma1", 0.95},
        {"clip_weights", 2.0},
        {"clip_gradient", 1.5}},
       {}},
      {"lamb", "lamb", {{"learning_rate", 0.01}, {"wd", 0.01}}, {}},
      {"lamb_bounds_nobias",
       "lamb",
       {{"learning_rate", 0.01},
        {"bias_correction", 0},
        {"lower_bound", 40},
        {"upper_bound", 50},
        {"clip_gradient", 1.0}},
       {}},
      {"lars_momentum",
       "lars",
       {{"momentum", 0.9}, {"eta", 0.01}, {"eps", 1e-8}, {"wd", 1e-4}},
       FactorEvery(10, 0.5, 0.5)},
      {"lars_plain", "lars", {{"learning_rate", 0.5}, {"eta", 0.02}, {"clip_gradient", 0.5}}, {}},
  };
}

struct DTypeCase {
  DType dtype;
  bool multi_precision;
};

std::unique_ptr<UpdateRule> MakeRule(const RuleCase& c, bool multi_precision) {
  OptimizerSpec spec;
  spec.rule = c.rule;
  spec.params = c.params;
  spec.schedule = c.schedule;
  spec.multi_precision = multi_precision;
  absl::StatusOr<std::unique_ptr<UpdateRule>> rule = MakeUpdateRule(spec);
  EXPECT_OK(rule);
  return rule.ok() ? std::move(*rule) : nullptr;
}

double Ulp16(DType dtype) {
  return dtype == DType::kFloat16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
}

class RuleTest : public ::testing::TestWithParam<std::tuple<RuleCase, DTypeCase>> {};

TEST_P(RuleTest, MatchesScalarReference) {
  const auto& [c, d] = GetParam();
  const std::unique_ptr<UpdateRule> rule = MakeRule(c, d.multi_precision);
  ASSERT_NE(rule, nullptr);
  constexpr size_t kCount = 1003;  // not a multiple of the vector width or block size
  constexpr int kSteps = 60;
  const bool master = d.dtype != DType::kFloat32 && d.multi_precision;
  const bool rounded = d.dtype != DType::kFloat32 && !d.multi_precision;

  OwnedTensor x(d.dtype, kCount, rule->Layout(d.dtype).num_buffers());
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<double> ref_w(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    x.set_weight(i, normal(rng));
    ref_w[i] = x.weight(i);
  }
  ASSERT_OK(rule->InitState(x.Whole()));
  ScalarReference ref(rule->name(), rule->hyper_parameters(), kCount);

  std::vector<double> ref_g(kCount);
  std::vector<double> stored(kCount);
  for (int t = 1; t <= kSteps; ++t) {
    for (size_t i = 0; i < kCount; ++i) {
      x.set_grad(i, normal(rng));
      ref_g[i] = x.grad(i);
      stored[i] = x.weight(i);  // what LAMB/LARS take the weight norm of
    }
    const StepArgs args = rule->Step(t, t);
    const absl::Status s = rule->Update(x.Whole(), args);
    ASSERT_OK(s);
    ref.Step(args, &ref_w, ref_g, master ? &stored : nullptr);
    if (rounded) {
      for (double& v : ref_w) v = RoundTo(d.dtype, static_cast<float>(v));
    }
  }

  double max_err = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const double r = ref_w[i];
    if (d.dtype == DType::kFloat32) {
      EXPECT_NEAR(x.weight(i), r, 1e-5 * std::abs(r) + 1e-5) << "element " << i;
    } else {
      // Rounded every step, a flip at a larger magnitude stays as an absolute error.
      const double tol = master ? Ulp16(d.dtype) * std::abs(r) + 1e-5
                                : 3 * Ulp16(d.dtype) * std::max(std::abs(r), 1.0);
      EXPECT_NEAR(x.weight(i), r, tol) << "element " << i;
      if (master) {
        EXPECT_NEAR(x.state(0)[i], r, 1e-5 * std::abs(r) + 1e-5) << "master " << i;
      }
    }
    max_err = std::max(max_err, std::abs(x.weight(i) - r));
    if (::testing::Test::HasFailure()) break;
  }
  RecordProperty("max_abs_error", std::to_string(max_err));
}

// Tails of every length, including 0 and 1, on the dispatched kernels.
TEST_P(RuleTest, SmallSizes) {
  const auto& [c, d] = GetParam();
  const std::unique_ptr<UpdateRule> rule = MakeRule(c, d.multi_precision);
  ASSERT_NE(rule, nullptr);
  const bool master = d.dtype != DType::kFloat32 && d.multi_precision;
  for (size_t count : {0, 1, 7, 8, 9, 17, 31}) {
    OwnedTensor x(d.dtype, count, rule->Layout(d.dtype).num_buffers());
    std::mt19937 rng(static_cast<unsigned>(count));
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<double> ref_w(count), ref_g(count), stored(count);
    for (size_t i = 0; i < count; ++i) {
      x.set_weight(i, normal(rng));
      ref_w[i] = x.weight(i);
    }
    ASSERT_OK(rule->InitState(x.Whole()));
    ScalarReference ref(rule->name(), rule->hyper_parameters(), count);
    for (int t = 1; t <= 3; ++t) {
      for (size_t i = 0; i < count; ++i) {
        x.set_grad(i, normal(rng));
        ref_g[i] = x.grad(i);
        stored[i] = x.weight(i);
      }
      const StepArgs args = rule->Step(t, t);
      ASSERT_OK(rule->Update(x.Whole(), args));
      ref.Step(args, &ref_w, ref_g, master ? &stored : nullptr);
      if (d.dtype != DType::kFloat32 && !master) {
        for (double& v : ref_w) v = RoundTo(d.dtype, static_cast<float>(v));
      }
    }
    const double rel = d.dtype == DType::kFloat32 ? 1e-5 : 3 * Ulp16(d.dtype);
    for (size_t i = 0; i < count; ++i) {
      EXPECT_NEAR(x.weight(i), ref_w[i], rel * std::max(std::abs(ref_w[i]), 1.0))
          << "count " << count << " element " << i;
    }
  }
}

// Runs 20 steps with the kernels of `isa`; returns weights and state bytes.
std::vector<unsigned char> RunWithIsa(const char* isa, const RuleCase& c, const DTypeCase& d) {
  EXPECT_TRUE(internal::ForceKernelIsaForTesting(isa));
  const std::unique_ptr<UpdateRule> rule = MakeRule(c, d.multi_precision);
  constexpr size_t kCount = 2053;
  OwnedTensor x(d.dtype, kCount, rule->Layout(d.dtype).num_buffers());
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (size_t i = 0; i < kCount; ++i) x.set_weight(i, normal(rng));
  EXPECT_OK(rule->InitState(x.Whole()));
  for (int t = 1; t <= 20; ++t) {
    for (size_t i = 0; i < kCount; ++i) x.set_grad(i, normal(rng));
    EXPECT_OK(rule->Update(x.Whole(), rule->Step(t, t)));
  }
  std::vector<unsigned char> out = x.weight_bytes();
  for (size_t j = 0; j < rule->Layout(d.dtype).num_buffers(); ++j) {
    const auto* b = reinterpret_cast<const unsigned char*>(x.state(j).data());
    out.insert(out.end(), b, b + kCount * sizeof(float));
  }
  internal::ForceKernelIsaForTesting(nullptr);
  return out;
}

TEST_P(RuleTest, Avx2EqualsPortableBitForBit) {
  const auto& [c, d] = GetParam();
  if (!internal::ForceKernelIsaForTesting("avx2")) GTEST_SKIP() << "no AVX2 on this CPU";
  const std::vector<unsigned char> avx2 = RunWithIsa("avx2", c, d);
  const std::vector<unsigned char> portable = RunWithIsa("sse2", c, d);
  ASSERT_EQ(avx2.size(), portable.size());
  EXPECT_EQ(std::memcmp(avx2.data(), portable.data(), avx2.size()), 0);
}

// Apply with Partition::weight_copy aliasing the gradient (what the server does: the
// summed gradient becomes the reply) equals a plain Apply bit for bit: weights, state, and
// the copy. 2053 elements: two blocks of the 16-bit path and a tail.
TEST_P(RuleTest, WeightCopyOverTheGradientEqualsPlainUpdate) {
  const auto& [c, d] = GetParam();
  const std::unique_ptr<UpdateRule> rule = MakeRule(c, d.multi_precision);
  ASSERT_NE(rule, nullptr);
  constexpr size_t kCount = 2053;
  const size_t nstate = rule->Layout(d.dtype).num_buffers();
  OwnedTensor plain(d.dtype, kCount, nstate);
  OwnedTensor fused(d.dtype, kCount, nstate);
  std::mt19937 rng(7);
  SetSameWeights(&rng, &plain, &fused);
  std::normal_distribution<float> normal(0.f, 1.f);
  ASSERT_OK(rule->InitState(plain.Whole()));
  ASSERT_OK(rule->InitState(fused.Whole()));
  for (int t = 1; t <= 5; ++t) {
    for (size_t i = 0; i < kCount; ++i) {
      const float g = normal(rng);
      plain.set_grad(i, g);
      fused.set_grad(i, g);
    }
    const StepArgs args = rule->Step(t, t);
    ASSERT_OK(rule->Update(plain.Whole(), args));
    Partition p = fused.Whole();
    absl::StatusOr<NormPartials> sums = rule->Prepare(p, args);
    ASSERT_OK(sums);
    p.weight_copy = const_cast<void*>(p.grad);
    ASSERT_OK(rule->Apply(p, args, FinishNorms(*sums)));
    ASSERT_EQ(plain.weight_bytes(), fused.weight_bytes()) << "step " << t;
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(fused.grad(i), fused.weight(i)) << "step " << t << " element " << i;
    }
    for (size_t j = 0; j < nstate; ++j) {
      ASSERT_EQ(plain.state(j), fused.state(j)) << "step " << t << " state " << j;
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<RuleTest::ParamType>& info) {
  const auto& [c, d] = info.param;
  std::string name = std::string(c.label) + "_" + std::string(DTypeName(d.dtype));
  if (d.dtype != DType::kFloat32) name += d.multi_precision ? "_master" : "_rounded";
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllRules, RuleTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::Values(DTypeCase{DType::kFloat32, false},
                                                              DTypeCase{DType::kFloat16, true},
                                                              DTypeCase{DType::kBFloat16, true},
                                                              DTypeCase{DType::kFloat16, false},
                                                              DTypeCase{DType::kBFloat16, false})),
                         CaseName);

}  // namespace
}  // namespace optimizers
}  // namespace hybridps
