// AdaGrad and RMSProp (both variants).
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

// MXNet 1.9.1 AdaGrad, dense path (NDArray arithmetic in Python):
//   g = rescale_grad*grad, clipped to [-clip_gradient, clip_gradient] whenever
//   clip_gradient is not None (0 included); history += g^2;
//   w += (g / sqrt(history + eps) + w*wd) * -lr.
class AdaGrad final : public UpdateRule {
 public:
  explicit AdaGrad(RuleInit i) : UpdateRule(std::move(i), {"history"}) {}

 private:
  void PlanApply(const StepArgs& s, const TensorNorms&, Plan* plan) const override {
    // NDArray arithmetic with Python scalars (double parameters): exactly rounded.
    plan->args = BaseKernelArgs(*this, s, ClipConvention::kIfNotNone, LrWd::kExact,
                                /*rescale_exact=*/true);
    plan->args.epsilon = static_cast<float>(P("eps"));
    plan->kernel = KernelId::kAdaGrad;
  }
};

// MXNet 1.9.1 RMSProp. centered=0: rmsprop_update (Tieleman & Hinton):
//   g = clip(rescale_grad*grad + wd*w); n = (1-gamma1)*g^2 + gamma1*n;
//   w -= lr * g / sqrt(n + epsilon).
// centered=1: rmspropalex_update (Graves 2013, eq. 38-45), with gamma2 the momentum:
//   n as above; s = (1-gamma1)*g + gamma1*s; delta = gamma2*delta - lr*g/sqrt(n - s^2 + eps);
//   w += delta.
// Both clip the new weights to [-clip_weights, clip_weights] when clip_weights is set.
std::vector<std::string> RmsPropState(bool centered) {
  if (centered) return {"n", "g", "delta"};
  return {"n"};
}

class RmsProp final : public UpdateRule {
 public:
  explicit RmsProp(RuleInit i)
      : UpdateRule(std::move(i), RmsPropState(i.params.at("centered") != 0)) {}

 private:
  bool centered() const { return P("centered") != 0; }
  void PlanApply(const StepArgs& s, const TensorNorms&, Plan* plan) const override {
    plan->args = BaseKernelArgs(*this, s, ClipConvention::kIfTruthy, LrWd::kKwargs);
    plan->args.gamma1 = KwParam(*this, "gamma1");
    plan->args.gamma2 = KwParam(*this, "gamma2");
    plan->args.epsilon = KwParam(*this, "epsilon");
    plan->args.clip_weights = TruthyOrOff(*this, "clip_weights");
    plan->kernel = centered() ? KernelId::kRmsPropCentered : KernelId::kRmsProp;
  }
};

template <class R>
std::unique_ptr<UpdateRule> Make(RuleInit init) {
  return std::make_unique<R>(std::move(init));
}

}  // namespace

std::vector<RuleDef> AdaptiveRules() {
  return {
      {"adagrad", std::nullopt, {{"eps", 1e-7, Check::kNonNegative}}, nullptr, Make<AdaGrad>},
      {"rmsprop",
       0.001,
       {{"gamma1", 0.9, Check::kUnit},
        {"gamma2", 0.9, Check::kUnit},
        {"epsilon", 1e-8, Check::kNonNegative},
        {"centered", 0.0, Check::kBool},
        {"clip_weights", std::nullopt, Check::kNotNaN}},
       nullptr,
       Make<RmsProp>},
  };
}

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps
