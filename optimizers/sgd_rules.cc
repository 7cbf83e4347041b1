// SGD, NAG, Signum and LARS: MXNet 1.9.1's SGD, NAG, Signum and LARS optimizers as its
// Updater runs them (SGD and LARS through the aggregated multi_*sgd* operators).
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "optimizers/kernels.h"
#include "optimizers/rules.h"

namespace hybridps {
namespace optimizers {
namespace internal {
namespace {

std::vector<std::string> MomentumState(double momentum) {
  if (momentum == 0) return {};
  return {"mom"};
}

// SGD: mom = momentum*mom - lr*wd*w - lr*clip(rescale_grad*grad); w += mom (MXNet's
// Updater calls multi_sgd_mom_update; multi_sgd_update, the same with mom = 0, without
// momentum). lazy_update only matters for row-sparse gradients.
class Sgd final : public UpdateRule {
 public:
  explicit Sgd(RuleInit i) : UpdateRule(std::move(i), MomentumState(i.params.at("momentum"))) {}

 private:
  void PlanApply(const StepArgs& s, const TensorNorms&, Plan* plan) const override {
    // lrs and wds are tuple kwargs of multi_sgd(_mom)_update: exactly rounded.
    plan->args = BaseKernelArgs(*this, s, ClipConvention::kIfTruthy, LrWd::kExact);
    plan->args.momentum = KwParam(*this, "momentum");
    plan->kernel = P("momentum") != 0 ? KernelId::kSgdMom : KernelId::kSgd;
  }
};

// NAG: nag_mom_update (sgd_update without momentum).
class Nag final : public UpdateRule {
 public:
  explicit Nag(RuleInit i) : UpdateRule(std::move(i), MomentumState(i.params.at("momentum"))) {}

 private:
  void PlanApply(const StepArgs& s, const TensorNorms&, Plan* plan) const override {
    plan->args = BaseKernelArgs(*this, s, ClipConvention::kIfTruthy, LrWd::kKwargs);
    plan->args.momentum = KwParam(*this, "momentum");
    plan->kernel = P("momentum") != 0 ? KernelId::kNagMom : KernelId::kSgdPlain;
  }
};

// Signum: signum_update; without momentum signsgd_update.
class Signum final : public UpdateRule {
 public:
  explicit Signum(RuleInit i) : UpdateRule(std::move(i), MomentumState(i.params.at("momentum"))) {}

 private:
  void PlanApply(const StepArgs& s, const TensorNorms&, Plan* plan) const override {
    plan->args = BaseKernelArgs(*this, s, ClipConvention::kIfTruthy, LrWd::kKwargs);
    plan->args.momentum = KwParam(*this, "momentum");
    plan->args.wd_lh = KwParam(*this, "wd_lh");
    plan->kernel = P("momentum") != 0 ? KernelId::kSignum : KernelId::kSignSgd;
  }
};

absl::Status CheckSignum(const std::map<std::string, double>& p) {
  if (p.at("momentum") == 0 && p.at("wd_lh") != 0) {
    return absl::InvalidArgumentError(
        "hyper-parameter 'wd_lh' needs momentum > 0 (MXNet 1.9.1's signsgd_update, used "
        "without momentum, has no wd_lh and fails)");
  }
  return absl::OkStatus();
}

// LARS (You et al. 2017) as MXNet's aggregated path: per tensor
//   lr' = lr * eta * |w| / (|grad| * rescale_grad + wd * |w| + eps)   if |w| > 0 and |grad| > 0
// (|.| over the whole tensor, from Prepare's partial sums), then the SGD update with lr'.
// With momentum_correction the momentum is scaled by lr / prev_lr.
class Lars final : public UpdateRule {
 public:
  explicit Lars(RuleInit i) : UpdateRule(std::move(i), MomentumState(i.params.at("momentum"))) {}
  bool needs_tensor_norms() const override { return true; }

 private:
  void PlanPrepare(const StepArgs&, Plan* plan) const override {
    plan->sum_weight_sq = true;
    plan->sum_grad_sq = true;
  }
  void PlanApply(const StepArgs& s, const TensorNorms& norms, Plan* plan) const override {
    // lrs and wds are float32 NDArrays: exactly rounded; eta, eps, momentum are kwargs.
    plan->args = BaseKernelArgs(*this, s, ClipConvention::kIfTruthy, LrWd::kExact);
    KernelArgs& a = plan->args;
    if (s.layer_adaptation) {  // multi_lars, in float
      const float w_norm = static_cast<float>(norms.weight_norm);
      const float g_norm = static_cast<float>(norms.update_norm);
      if (w_norm > 0 && g_norm > 0) {
        const float eta = KwParam(*this, "eta");
        const float eps = KwParam(*this, "eps");
        a.lr = a.lr * eta * w_norm / (g_norm * a.rescale + a.wd * w_norm + eps);
      }
    }
    const double momentum = P("momentum");
    if (momentum > 0) {
      const bool correct = P("momentum_correction") != 0 && s.prev_lr != 0;
      a.momentum = Kw(correct ? momentum * (s.lr / s.prev_lr) : momentum);
      plan->kernel = KernelId::kSgdMom;
    } else {
      plan->kernel = KernelId::kSgd;
    }
  }
};

template <class R>
std::unique_ptr<UpdateRule> Make(RuleInit init) {
  return std::make_unique<R>(std::move(init));
}

}  // namespace

std::vector<RuleDef> SgdFamilyRules() {
  return {
      {"sgd",
       std::nullopt,
       {{"momentum", 0.0, Check::kUnit}, {"lazy_update", 1.0, Check::kBool}},
       nullptr,
       Make<Sgd>},
      {"nag", std::nullopt, {{"momentum", 0.0, Check::kUnit}}, nullptr, Make<Nag>},
      {"signum",
       0.01,
       {{"momentum", 0.9, Check::kUnit}, {"wd_lh", 0.0, Check::kNonNegative}},
       CheckSignum,
       Make<Signum>},
      {"lars",
       std::nullopt,
       {{"momentum", 0.0, Check::kUnit},
        {"lazy_update", 1.0, Check::kBool},
        {"eta", 0.001, Check::kNonNegative},
        {"eps", 0.0, Check::kNonNegative},
        {"momentum_correction", 1.0, Check::kBool}},
       nullptr,
       Make<Lars>},
  };
}

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps
