// A tensor split into k partitions, updated with the two-phase protocol (Prepare on every
// partition, sum the partials, FinishNorms, Apply on every partition), equals the same
// tensor updated whole. Only the association of the double norm sums differs, so the
// tolerance is float rounding (rel 1e-6); the elementwise rules must match bit for bit.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optimizers/update_rule.h"
#include "tests/optimizers/test_util.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace optimizers {
namespace {

using testing::OwnedTensor;
using testing::SetSameWeights;

struct SplitCase {
  std::string rule;
  std::map<std::string, double> params;
  DType dtype;
  bool multi_precision;
};

// Partition boundaries of `count` elements into `k` uneven parts (k = 1: one part).
std::vector<size_t> Bounds(size_t count, size_t k) {
  std::vector<size_t> b = {0};
  for (size_t i = 1; i < k; ++i) b.push_back(count * i * i / (k * k));  // uneven sizes
  b.push_back(count);
  return b;
}

class SplitTest : public ::testing::TestWithParam<std::tuple<SplitCase, size_t>> {};

TEST_P(SplitTest, PartitionedEqualsWhole) {
  const auto& [c, k] = GetParam();
  OptimizerSpec spec;
  spec.rule = c.rule;
  spec.params = c.params;
  spec.multi_precision = c.multi_precision;
  auto rule = MakeUpdateRule(spec);
  ASSERT_OK(rule);
  const UpdateRule& r = **rule;

  constexpr size_t kCount = 4099;
  const size_t nstate = r.Layout(c.dtype).num_buffers();
  OwnedTensor whole(c.dtype, kCount, nstate);
  OwnedTensor split(c.dtype, kCount, nstate);
  std::mt19937 rng(7);
  SetSameWeights(&rng, &whole, &split);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::vector<size_t> bounds = Bounds(kCount, k);
  std::vector<Partition> parts;
  for (size_t j = 0; j + 1 < bounds.size(); ++j) {
    parts.push_back(split.View(bounds[j], bounds[j + 1] - bounds[j]));
  }
  ASSERT_OK(r.InitState(whole.Whole()));
  for (const Partition& p : parts) ASSERT_OK(r.InitState(p));

  for (int t = 1; t <= 50; ++t) {
    for (size_t i = 0; i < kCount; ++i) {
      const float g = normal(rng);
      whole.set_grad(i, g);
      split.set_grad(i, g);
    }
    StepArgs args = r.Step(t, t);
    ASSERT_OK(r.Update(whole.Whole(), args));
    NormPartials total;
    for (const Partition& p : parts) {  // phase 1, as if on different servers
      absl::StatusOr<NormPartials> mine = r.Prepare(p, args);
      ASSERT_OK(mine);
      total += *mine;
    }
    const TensorNorms norms = FinishNorms(total);
    for (const Partition& p : parts) ASSERT_OK(r.Apply(p, args, norms));
  }

  for (size_t i = 0; i < kCount; ++i) {
    const float a = whole.weight(i);
    const float b = split.weight(i);
    if (r.needs_tensor_norms()) {
      ASSERT_NEAR(b, a, 1e-6 * std::abs(a) + 1e-7) << "element " << i;
    } else {
      ASSERT_EQ(a, b) << "element " << i;
    }
  }
}

std::vector<SplitCase> Cases() {
  return {
      {"lamb", {{"learning_rate", 0.01}, {"wd", 0.01}}, DType::kFloat32, false},
      {"lamb", {{"learning_rate", 0.01}, {"upper_bound", 30}}, DType::kFloat16, true},
      {"lamb", {{"learning_rate", 0.01}}, DType::kBFloat16, false},
      {"lars", {{"momentum", 0.9}, {"eta", 0.01}, {"wd", 1e-4}}, DType::kFloat32, false},
      {"lars", {{"eta", 0.01}}, DType::kFloat16, true},
      {"adam", {}, DType::kFloat32, false},
      {"sgd", {{"momentum", 0.9}}, DType::kBFloat16, true},
  };
}

INSTANTIATE_TEST_SUITE_P(TwoPhase, SplitTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::Values(1, 2, 3, 7)));

// The single-phase rules report no norms and need none.
TEST(SplitTest, ElementwiseRulesReportNoNorms) {
  OptimizerSpec spec;
  spec.rule = "adam";
  auto rule = MakeUpdateRule(spec);
  ASSERT_OK(rule);
  EXPECT_FALSE((*rule)->needs_tensor_norms());
  OwnedTensor x(DType::kFloat32, 16, 2);
  absl::StatusOr<NormPartials> p = (*rule)->Prepare(x.Whole(), (*rule)->Step(1, 1));
  ASSERT_OK(p);
  EXPECT_EQ(p->weight_sq, 0);
  EXPECT_EQ(p->update_sq, 0);
  EXPECT_EQ(x.state(0)[0], 0);  // Prepare left the state alone
}

// LARS with layer_adaptation = false (bias, gamma, beta) is plain SGD with momentum.
TEST(SplitTest, LarsExemptParametersTakePlainSgd) {
  OptimizerSpec lars;
  lars.rule = "lars";
  lars.params = {{"momentum", 0.9}, {"eta", 0.01}, {"momentum_correction", 0}};
  OptimizerSpec sgd = lars;
  sgd.rule = "sgd";
  sgd.params = {{"momentum", 0.9}};
  auto a = MakeUpdateRule(lars);
  auto b = MakeUpdateRule(sgd);
  ASSERT_TRUE(a.ok() && b.ok());
  OwnedTensor x(DType::kFloat32, 100, 1);
  OwnedTensor y(DType::kFloat32, 100, 1);
  for (size_t i = 0; i < 100; ++i) {
    x.set_weight(i, 0.01f * static_cast<float>(i));
    y.set_weight(i, 0.01f * static_cast<float>(i));
    x.set_grad(i, 1.f - 0.02f * static_cast<float>(i));
    y.set_grad(i, 1.f - 0.02f * static_cast<float>(i));
  }
  StepArgs args = (*a)->Step(1, 1);
  args.layer_adaptation = false;
  ASSERT_OK((*a)->Update(x.Whole(), args));
  ASSERT_OK((*b)->Update(y.Whole(), (*b)->Step(1, 1)));
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(x.weight(i), y.weight(i));
  EXPECT_TRUE(IsLarsExemptName("dense0_bias"));
  EXPECT_TRUE(IsLarsExemptName("batchnorm0_gamma"));
  EXPECT_FALSE(IsLarsExemptName("dense0_weight"));
}

}  // namespace
}  // namespace optimizers
}  // namespace hybridps
