// Adam, AdamW and LAMB.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optimizers/kernels.h"
#include "optimizers/rules.h"

namespace hybridps {
namespace optimizers {
namespace internal {
namespace {

// lr * sqrt(1 - beta2^t) / (1 - beta1^t), in double as MXNet's Python computes it.
double BiasCorrectedLr(double lr, double beta1, double beta2, int64_t t) {
  const double coef1 = 1. - std::pow(beta1, static_cast<double>(t));
  const double coef2 = 1. - std::pow(beta2, static_cast<double>(t));
  return lr * (std::sqrt(coef2) / coef1);
}

// MXNet 1.9.1 Adam: the bias correction goes into lr in Python, then adam_update:
//   g = clip(rescale_grad*grad + wd*w); m = beta1*m + (1-beta1)*g;
//   v = beta2*v + (1-beta2)*g^2; w -= lr * m / (sqrt(v) + epsilon).
class Adam final : public UpdateRule {
 public:
  explicit Adam(RuleInit i) : UpdateRule(std::move(i), {"mean", "var"}) {}

 private:
  void PlanApply(const StepArgs& s, const TensorNorms&, Plan* plan) const override {
    StepArgs corrected = s;
    corrected.lr = BiasCorrectedLr(s.lr, P("beta1"), P("beta2"), s.t);
    plan->args = BaseKernelArgs(*this, corrected, ClipConvention::kIfTruthy, LrWd::kKwargs);
    plan->args.beta1 = KwParam(*this, "beta1");
    plan->args.beta2 = KwParam(*this, "beta2");
    plan->args.epsilon = KwParam(*this, "epsilon");
    plan->kernel = KernelId::kAdam;
  }
};

// AdamW with MXNet 1.9.1's contrib adamw_update (MXNet 1.9.1 has the operator but no
// Python optimizer): g = clip(rescale_grad*grad); moments as Adam;
//   w -= eta * (lr * m / (sqrt(v) + epsilon) + wd * w)
// with lr the scheduled learning rate and eta a constant multiplier. correct_bias=1 folds
// Adam's bias correction into lr (as MXNet 2's AdamW and GluonNLP's BERTAdam do).
class AdamW final : public UpdateRule {
 public:
  explicit AdamW(RuleInit i) : UpdateRule(std::move(i), {"mean", "var"}) {}

 private:
  void PlanApply(const StepArgs& s, const TensorNorms&, Plan* plan) const override {
    StepArgs step = s;
    if (P("correct_bias") != 0) step.lr = BiasCorrectedLr(s.lr, P("beta1"), P("beta2"), s.t);
    // rescale_grad is an NDArray input of adamw_update.
    plan->args = BaseKernelArgs(*this, step, ClipConvention::kIfTruthy, LrWd::kKwargs,
                                /*rescale_exact=*/true);
    if (plan->args.clip >= 0) plan->args.clip = KwParam(*this, "clip_gradient");  // a kwarg
    plan->args.beta1 = KwParam(*this, "beta1");
    plan->args.beta2 = KwParam(*this, "beta2");
    plan->args.epsilon = KwParam(*this, "epsilon");
    plan->args.eta = KwParam(*this, "eta");
    plan->kernel = KernelId::kAdamW;
  }
};

// LAMB (You et al. 2019) as MXNet's multi_lamb_update, which its Updater uses:
//   phase 1 (Prepare): g = clip(rescale_grad*grad); moments as Adam; with bias_correction
//     m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t) (else m, v);
//     u = m_hat / (sqrt(v_hat) + epsilon) + wd * w; partial sums of w^2 and u^2.
//   phase 2 (Apply): r1 = |w| clamped to [lower_bound, upper_bound] where set, r2 = |u|;
//     w -= lr * (r1 > 0 and r2 > 0 ? r1 / r2 : 1) * u, u recomputed from the moments.
class Lamb final : public UpdateRule {
 public:
  explicit Lamb(RuleInit i) : UpdateRule(std::move(i), {"mean", "var"}) {}
  bool needs_tensor_norms() const override { return true; }

 private:
  KernelArgs Args(const StepArgs& s) const {
    // learning_rates and wds are tuple kwargs of multi_lamb_update: exactly rounded.
    KernelArgs a = BaseKernelArgs(*this, s, ClipConvention::kIfTruthy, LrWd::kExact);
    a.beta1 = KwParam(*this, "beta1");
    a.beta2 = KwParam(*this, "beta2");
    a.epsilon = KwParam(*this, "epsilon");
    a.bias_correction = P("bias_correction") != 0;
    const float t = static_cast<float>(s.t);
    a.bias1 = 1.0f - std::pow(a.beta1, t);  // float powf, as the operator
    a.bias2 = 1.0f - std::pow(a.beta2, t);
    return a;
  }

  void PlanPrepare(const StepArgs& s, Plan* plan) const override {
    plan->args = Args(s);
    plan->kernel = KernelId::kLambPhase1;
    plan->sum_weight_sq = true;
  }

  void PlanApply(const StepArgs& s, const TensorNorms& norms, Plan* plan) const override {
    plan->args = Args(s);
    float r1 = static_cast<float>(norms.weight_norm);
    const float r2 = static_cast<float>(norms.update_norm);
    const float lower = TruthyOrOff(*this, "lower_bound");
    const float upper = TruthyOrOff(*this, "upper_bound");
    if (lower >= 0) r1 = std::max(r1, lower);
    if (upper >= 0) r1 = std::min(r1, upper);
    const float r = (r1 == 0.0f || r2 == 0.0f) ? 1.0f : r1 / r2;
    plan->args.lr = plan->args.lr * r;
    plan->kernel = KernelId::kLambPhase2;
  }
};

template <class R>
std::unique_ptr<UpdateRule> Make(RuleInit init) {
  return std::make_unique<R>(std::move(init));
}

}  // namespace

std::vector<RuleDef> AdamFamilyRules() {
  return {
      {"adam",
       0.001,
       {{"beta1", 0.9, Check::kUnit},
        {"beta2", 0.999, Check::kUnit},
        {"epsilon", 1e-8, Check::kNonNegative},
        {"lazy_update", 1.0, Check::kBool}},
       nullptr,
       Make<Adam>},
      {"adamw",
       0.001,
       {{"beta1", 0.9, Check::kUnit},
        {"beta2", 0.999, Check::kUnit},
        {"epsilon", 1e-8, Check::kNonNegative},
        {"eta", 1.0, Check::kNonNegative},
        {"correct_bias", 0.0, Check::kBool}},
       nullptr,
       Make<AdamW>},
      {"lamb",
       0.001,
       {{"beta1", 0.9, Check::kUnit},
        {"beta2", 0.999, Check::kUnit},
        {"epsilon", 1e-6, Check::kNonNegative},
        {"lower_bound", std::nullopt, Check::kFinite},
        {"upper_bound", std::nullopt, Check::kFinite},
        {"bias_correction", 1.0, Check::kBool}},
       nullptr,
       Make<Lamb>},
  };
}

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps
