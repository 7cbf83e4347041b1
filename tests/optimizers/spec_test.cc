// MakeUpdateRule: names, defaults, rejected specs; state layouts; argument checks.
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optimizers/update_rule.h"
#include "tests/optimizers/test_util.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace optimizers {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::OwnedTensor;

OptimizerSpec Spec(std::string rule, std::map<std::string, double> params = {}) {
  OptimizerSpec s;
  s.rule = std::move(rule);
  s.params = std::move(params);
  return s;
}

std::string Error(const OptimizerSpec& spec) {
  auto rule = MakeUpdateRule(spec);
  EXPECT_FALSE(rule.ok()) << spec.rule;
  return rule.ok() ? "" : std::string(rule.status().message());
}

TEST(SpecTest, KnownRules) {
  EXPECT_THAT(KnownRules(), ElementsAre("adagrad", "adam", "adamw", "lamb", "lars", "nag",
                                        "rmsprop", "sgd", "signum"));
  for (const std::string& r : KnownRules()) EXPECT_OK(MakeUpdateRule(Spec(r))) << r;
  auto adam = MakeUpdateRule(Spec("Adam"));  // case-insensitive, like MXNet
  ASSERT_OK(adam);
  EXPECT_EQ((*adam)->name(), "adam");
}

TEST(SpecTest, UnknownRuleListsTheKnownOnes) {
  const std::string e = Error(Spec("adamax"));
  EXPECT_THAT(e, HasSubstr("'adamax'"));
  EXPECT_THAT(e, HasSubstr("adagrad, adam, adamw, lamb, lars, nag, rmsprop, sgd, signum"));
}

TEST(SpecTest, UnknownParameterIsNamed) {
  const std::string e = Error(Spec("sgd", {{"betaa", 0.9}}));
  EXPECT_THAT(e, HasSubstr("'betaa'"));
  EXPECT_THAT(e, HasSubstr("momentum"));  // lists the rule's parameters
  EXPECT_THAT(Error(Spec("adam", {{"eps", 1e-8}})), HasSubstr("'eps'"));  // adam's is epsilon
  EXPECT_THAT(Error(Spec("adagrad", {{"epsilon", 1e-8}})), HasSubstr("'epsilon'"));
  EXPECT_THAT(Error(Spec("sgd", {{"multi_precision", 1}})), HasSubstr("OptimizerSpec::multi"));
}

TEST(SpecTest, BadValuesNameTheParameter) {
  const double nan = std::nan("");
  struct Bad {
    const char* rule;
    const char* param;
    double value;
  };
  for (const Bad& b : std::vector<Bad>{{"sgd", "learning_rate", nan},
                                       {"sgd", "learning_rate", -0.1},
                                       {"sgd", "learning_rate", INFINITY},
                                       {"sgd", "momentum", 1.0},
                                       {"sgd", "momentum", -0.5},
                                       {"sgd", "wd", -1e-4},
                                       {"sgd", "rescale_grad", 0.0},
                                       {"sgd", "clip_gradient", nan},
                                       {"sgd", "lazy_update", 2},
                                       {"adam", "beta1", 1.0},
                                       {"adam", "beta2", -0.1},
                                       {"adam", "epsilon", -1e-8},
                                       {"adamw", "eta", -1},
                                       {"adagrad", "eps", nan},
                                       {"rmsprop", "gamma1", 1.5},
                                       {"rmsprop", "centered", 0.5},
                                       {"lamb", "lower_bound", INFINITY},
                                       {"lars", "eta", -0.001},
                                       {"signum", "wd_lh", -1}}) {
    const std::string e = Error(Spec(b.rule, {{b.param, b.value}}));
    EXPECT_THAT(e, HasSubstr(std::string("'") + b.param + "'")) << b.rule << " " << b.param;
  }
  // MXNet's signsgd_update (Signum without momentum) has no wd_lh.
  EXPECT_THAT(Error(Spec("signum", {{"momentum", 0}, {"wd_lh", 0.1}})), HasSubstr("wd_lh"));
}

TEST(SpecTest, BadScheduleIsRejected) {
  OptimizerSpec s = Spec("sgd");
  s.schedule.kind = LrScheduleKind::kFactor;
  s.schedule.factor = 2;
  EXPECT_THAT(Error(s), HasSubstr("factor"));
}

TEST(SpecTest, MxnetDefaults) {
  auto check = [](const char* rule, std::map<std::string, double> want) {
    auto r = MakeUpdateRule(Spec(rule));
    ASSERT_OK(r);
    for (const auto& [k, v] : want) EXPECT_EQ((*r)->param(k), v) << rule << " " << k;
  };
  check("sgd", {{"momentum", 0}, {"wd", 0}, {"rescale_grad", 1}});
  check("signum", {{"learning_rate", 0.01}, {"momentum", 0.9}, {"wd_lh", 0}});
  check("adam", {{"learning_rate", 0.001}, {"beta1", 0.9}, {"beta2", 0.999}, {"epsilon", 1e-8}});
  check("adagrad", {{"eps", 1e-7}});
  check("rmsprop", {{"learning_rate", 0.001},
                    {"gamma1", 0.9},
                    {"gamma2", 0.9},
                    {"epsilon", 1e-8},
                    {"centered", 0}});
  check("lamb", {{"learning_rate", 0.001}, {"epsilon", 1e-6}, {"bias_correction", 1}});
  check("lars", {{"eta", 0.001}, {"eps", 0}, {"momentum_correction", 1}});
  auto sgd = MakeUpdateRule(Spec("sgd"));
  EXPECT_FALSE((*sgd)->param("learning_rate").has_value());  // None
  EXPECT_FALSE((*sgd)->param("clip_gradient").has_value());
  EXPECT_DOUBLE_EQ((*sgd)->LearningRate(1), 0.01);
}

TEST(SpecTest, StepAppliesMultipliers) {
  OptimizerSpec s = Spec("sgd", {{"learning_rate", 0.1}, {"wd", 0.01}});
  s.schedule.kind = LrScheduleKind::kFactor;
  s.schedule.step = 2;
  s.schedule.factor = 0.5;
  auto r = MakeUpdateRule(s);
  ASSERT_OK(r);
  const StepArgs a = (*r)->Step(3, 3, 2.0, 0.0);
  EXPECT_EQ(a.t, 3);
  EXPECT_DOUBLE_EQ(a.lr, 0.1 * 0.5 * 2.0);  // learning_rate replaces the schedule's base_lr
  EXPECT_DOUBLE_EQ(a.prev_lr, 0.1 * 2.0);
  EXPECT_DOUBLE_EQ(a.wd, 0.0);
}

TEST(SpecTest, Layouts) {
  auto layout = [](OptimizerSpec s, DType d) {
    auto r = MakeUpdateRule(s);
    EXPECT_OK(r);
    return (*r)->Layout(d).buffers;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(layout(Spec("sgd"), DType::kFloat32), V{});
  EXPECT_EQ(layout(Spec("sgd", {{"momentum", 0.9}}), DType::kFloat32), V{"mom"});
  OptimizerSpec mp = Spec("sgd", {{"momentum", 0.9}});
  mp.multi_precision = true;
  EXPECT_EQ(layout(mp, DType::kFloat16), (V{"weight32", "mom"}));
  EXPECT_EQ(layout(mp, DType::kFloat32), V{"mom"});
  EXPECT_EQ(layout(Spec("sgd", {{"momentum", 0.9}}), DType::kBFloat16), V{"mom"});
  EXPECT_EQ(layout(Spec("adam"), DType::kFloat32), (V{"mean", "var"}));
  EXPECT_EQ(layout(Spec("rmsprop", {{"centered", 1}}), DType::kFloat32), (V{"n", "g", "delta"}));
  EXPECT_EQ(layout(Spec("adagrad"), DType::kFloat32), V{"history"});
  EXPECT_EQ(layout(Spec("signum", {{"momentum", 0}}), DType::kFloat32), V{});
}

TEST(SpecTest, InitStateCopiesTheMasterAndZeroesTheRest) {
  OptimizerSpec s = Spec("adam");
  s.multi_precision = true;
  auto r = MakeUpdateRule(s);
  ASSERT_OK(r);
  OwnedTensor x(DType::kFloat16, 5, 3);
  for (size_t i = 0; i < 5; ++i) {
    x.set_weight(i, 0.1f * static_cast<float>(i));
    x.state(1)[i] = 7;
  }
  ASSERT_OK((*r)->InitState(x.Whole()));
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(x.state(0)[i], x.weight(i));
    EXPECT_EQ(x.state(1)[i], 0);
    EXPECT_EQ(x.state(2)[i], 0);
  }
}

TEST(SpecTest, BadPartitionsAndArgsAreRejectedUnchanged) {
  auto r = MakeUpdateRule(Spec("sgd", {{"momentum", 0.9}}));
  ASSERT_OK(r);
  const UpdateRule& rule = **r;
  OwnedTensor x(DType::kFloat32, 8, 1);
  x.set_weight(0, 1.f);
  x.set_grad(0, 1.f);
  const StepArgs ok = rule.Step(1, 1);
  EXPECT_OK(rule.Apply(x.Whole(), ok, {}));
  const float after_one = x.weight(0);

  OwnedTensor no_state(DType::kFloat32, 8, 0);
  EXPECT_THAT(rule.Apply(no_state.Whole(), ok, {}).message(), HasSubstr("state buffers"));
  OwnedTensor ints(DType::kInt32, 8, 1);
  EXPECT_THAT(rule.Apply(ints.Whole(), ok, {}).message(), HasSubstr("int32"));
  StepArgs bad = ok;
  bad.t = 0;
  EXPECT_THAT(rule.Apply(x.Whole(), bad, {}).message(), HasSubstr("t = 0"));
  bad = ok;
  bad.lr = std::nan("");
  EXPECT_FALSE(rule.Apply(x.Whole(), bad, {}).ok());
  Partition null = x.Whole();
  null.grad = nullptr;
  EXPECT_FALSE(rule.Apply(null, ok, {}).ok());
  EXPECT_EQ(x.weight(0), after_one);

  auto lamb = MakeUpdateRule(Spec("lamb"));
  OwnedTensor y(DType::kFloat32, 8, 2);
  EXPECT_FALSE((*lamb)->Apply(y.Whole(), ok, TensorNorms{std::nan(""), 1}).ok());
}

}  // namespace
}  // namespace optimizers
}  // namespace hybridps
