// Internal to optimizers/: how the rule files describe their rules to MakeUpdateRule.
#ifndef HYBRIDPS_OPTIMIZERS_RULES_H_
#define HYBRIDPS_OPTIMIZERS_RULES_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "optimizers/kernels.h"
#include "optimizers/update_rule.h"

namespace hybridps {
namespace optimizers {
namespace internal {

// What a hyper-parameter's value must be.
enum class Check : uint8_t {
  kFinite,       // any finite number
  kNotNaN,       // anything but NaN (infinities allowed)
  kNonNegative,  // finite and >= 0
  kPositive,     // finite and > 0
  kUnit,         // finite, in [0, 1)
  kBool,         // 0 or 1
};

struct ParamDef {
  const char* name;
  std::optional<double> value;  // MXNet's default; nullopt for None
  Check check;
};

// A validated spec, ready for a rule's constructor.
struct RuleInit {
  std::string name;
  OptimizerSpec spec;
  std::map<std::string, double> params;  // every parameter with a value, defaults included
  std::optional<double> learning_rate;   // MXNet's learning_rate argument (None: nullopt)
};

struct RuleDef {
  const char* name;
  std::optional<double> default_learning_rate;  // MXNet's default for learning_rate
  std::vector<ParamDef> params;                 // the rule's own, beyond the common ones
  // Cross-parameter checks on the resolved parameters; null when there are none.
  absl::Status (*check)(const std::map<std::string, double>& params);
  std::unique_ptr<UpdateRule> (*make)(RuleInit init);
};

// Each rule file's rules: sgd, nag, signum, lars / adam, adamw, lamb / adagrad, rmsprop.
std::vector<RuleDef> SgdFamilyRules();
std::vector<RuleDef> AdamFamilyRules();
std::vector<RuleDef> AdaptiveRules();

// How a rule's Python code passes clip_gradient to its operator.
enum class ClipConvention : uint8_t {
  kIfTruthy,   // `if self.clip_gradient:` (absent or 0: off), the fused operators
  kIfNotNone,  // `if self.clip_gradient is not None:` (AdaGrad: 0 clips to 0)
};

// How an operator receives lr and wd: as float kwargs (parsed by dmlc, see
// optimizers/mxnet_float.h) or exactly rounded (a tuple kwarg, an NDArray, a double).
enum class LrWd : uint8_t { kKwargs, kExact };

// lr, wd, rescale_grad and clip_gradient of `rule` for one step, as floats the way the
// rule's MXNet operator receives them (rescale_grad and clip_gradient as kwargs unless
// `rescale_exact`).
KernelArgs BaseKernelArgs(const UpdateRule& rule, const StepArgs& step, ClipConvention clip,
                          LrWd lr_wd, bool rescale_exact = false);

// A float kwarg as the operator sees it (MxnetKwargFloat), and a hyper-parameter that has
// a value, so passed.
float Kw(double v);
float KwParam(const UpdateRule& rule, const char* name);

// A hyper-parameter passed as an operator kwarg only `if self.<name>:` (MXNet), as the
// operators' "off" value -1 otherwise: clip_weights, lower_bound, upper_bound.
float TruthyOrOff(const UpdateRule& rule, const char* name);

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_OPTIMIZERS_RULES_H_
