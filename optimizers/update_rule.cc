#include "optimizers/update_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizers/kernels.h"
#include "optimizers/mxnet_float.h"
#include "optimizers/rules.h"

namespace hybridps {
namespace optimizers {
namespace {

using internal::Check;
using internal::KernelTable;
using internal::ParamDef;
using internal::RuleDef;
using internal::SumAcc;

// 16-bit weights are widened and updated in blocks of this many elements (a multiple of 8,
// so the sum-of-squares lanes line up with a single pass).
constexpr size_t kBlock = 1024;
constexpr size_t kMaxRuleState = 3;

const std::vector<RuleDef>& Rules() {
  static const std::vector<RuleDef>* const rules = [] {
    auto* all = new std::vector<RuleDef>();
    for (auto family :
         {internal::SgdFamilyRules, internal::AdamFamilyRules, internal::AdaptiveRules}) {
      for (RuleDef& d : family()) all->push_back(std::move(d));
    }
    std::sort(all->begin(), all->end(),
              [](const RuleDef& a, const RuleDef& b) { return std::strcmp(a.name, b.name) < 0; });
    return all;
  }();
  return *rules;
}

const RuleDef* FindRule(absl::string_view name) {
  for (const RuleDef& d : Rules()) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// The parameters every rule takes (MXNet's Optimizer base class); learning_rate's
// default is the rule's.
std::vector<ParamDef> AllParams(const RuleDef& rule) {
  std::vector<ParamDef> all = {
      {"learning_rate", rule.default_learning_rate, Check::kNonNegative},
      {"wd", 0.0, Check::kNonNegative},
      {"rescale_grad", 1.0, Check::kPositive},
      {"clip_gradient", std::nullopt, Check::kNotNaN},
  };
  all.insert(all.end(), rule.params.begin(), rule.params.end());
  return all;
}

absl::Status CheckValue(absl::string_view rule, const ParamDef& def, double v) {
  const char* want = nullptr;
  switch (def.check) {
    case Check::kFinite:
      if (!std::isfinite(v)) want = "a finite number";
      break;
    case Check::kNotNaN:
      if (std::isnan(v)) want = "a number (not NaN)";
      break;
    case Check::kNonNegative:
      if (!(std::isfinite(v) && v >= 0)) want = "finite and >= 0";
      break;
    case Check::kPositive:
      if (!(std::isfinite(v) && v > 0)) want = "finite and > 0";
      break;
    case Check::kUnit:
      if (!(v >= 0 && v < 1)) want = "in [0, 1)";
      break;
    case Check::kBool:
      if (v != 0 && v != 1) want = "0 or 1 (a boolean)";
      break;
  }
  if (want == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("optimizer '", rule, "': hyper-parameter '",
                                                 def.name, "' = ", v, " must be ", want));
}

bool IsMaster(DType dtype, bool multi_precision) {
  return dtype != DType::kFloat32 && multi_precision;
}

}  // namespace

TensorNorms FinishNorms(const NormPartials& total) {
  return {std::sqrt(total.weight_sq), std::sqrt(total.update_sq)};
}

UpdateRule::UpdateRule(internal::RuleInit&& init, std::vector<std::string> state_names)
    : name_(std::move(init.name)),
      spec_(std::move(init.spec)),
      params_(std::move(init.params)),
      learning_rate_(init.learning_rate) {
  for (const auto& [k, v] : params_) kw_params_[k] = internal::MxnetKwargFloat(v);
  layout_.buffers = state_names;
  master_layout_.buffers.push_back("weight32");
  for (std::string& n : state_names) master_layout_.buffers.push_back(std::move(n));
}

std::optional<double> UpdateRule::param(absl::string_view name) const {
  const auto it = params_.find(std::string(name));
  if (it == params_.end()) return std::nullopt;
  return it->second;
}

double UpdateRule::P(const char* name) const { return params_.at(name); }

float UpdateRule::KwP(const char* name) const { return kw_params_.find(name)->second; }

double UpdateRule::LearningRate(int64_t num_update) const {
  return ScheduledLearningRate(spec_.schedule, learning_rate_, num_update);
}

double UpdateRule::weight_decay() const { return P("wd"); }

StepArgs UpdateRule::Step(int64_t t, int64_t num_update, double lr_mult, double wd_mult) const {
  StepArgs a;
  a.t = t;
  a.lr = LearningRate(num_update) * lr_mult;
  a.wd = weight_decay() * wd_mult;
  a.prev_lr = num_update > 1 ? LearningRate(num_update - 1) * lr_mult : a.lr;
  return a;
}

bool UpdateRule::SupportsDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

StateLayout UpdateRule::Layout(DType weight_dtype) const {
  return IsMaster(weight_dtype, spec_.multi_precision) ? master_layout_ : layout_;
}

absl::Status UpdateRule::Check(const Partition& p, const StepArgs& args) const {
  if (!SupportsDType(p.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer '", name_, "': weight dtype ",
                                                   DTypeName(p.dtype),
                                                   " not supported (float32, float16, bfloat16)"));
  }
  const size_t want = IsMaster(p.dtype, spec_.multi_precision) ? master_layout_.num_buffers()
                                                               : layout_.num_buffers();
  if (p.state.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer '", name_, "': ", p.state.size(),
                                                   " state buffers given, layout has ", want));
  }
  if (p.count > 0) {
    if (p.weight == nullptr || p.grad == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer '", name_, "': null weight or grad"));
    }
    for (float* s : p.state) {
      if (s == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer '", name_, "': null state buffer"));
      }
    }
  }
  if (args.t < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer '", name_, "': update count t = ", args.t, " must be >= 1"));
  }
  if (!(std::isfinite(args.lr) && args.lr >= 0) || !std::isfinite(args.wd) ||
      !(std::isfinite(args.prev_lr) && args.prev_lr >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer '", name_, "': lr = ", args.lr,
                                                   ", prev_lr = ", args.prev_lr, ", wd = ", args.wd,
                                                   " must be finite, lr >= 0"));
  }
  return absl::OkStatus();
}

absl::Status UpdateRule::InitState(const Partition& p) const {
  if (absl::Status s = Check(p, StepArgs{}); !s.ok()) return s;
  for (float* s : p.state) std::fill(s, s + p.count, 0.f);
  if (IsMaster(p.dtype, spec_.multi_precision)) {
    const KernelTable& k = internal::Kernels();
    const auto* w = static_cast<const uint16_t*>(p.weight);
    (p.dtype == DType::kFloat16 ? k.widen_f16 : k.widen_bf16)(w, p.state[0], p.count);
  }
  return absl::OkStatus();
}

void UpdateRule::PlanPrepare(const StepArgs&, Plan*) const {}

absl::StatusOr<NormPartials> UpdateRule::Prepare(const Partition& p, const StepArgs& args) const {
  if (absl::Status s = Check(p, args); !s.ok()) return s;
  NormPartials sums;
  if (!needs_tensor_norms()) return sums;
  Plan plan;
  PlanPrepare(args, &plan);
  Run(p, plan, &sums);
  return sums;
}

absl::Status UpdateRule::Apply(const Partition& p, const StepArgs& args,
                               const TensorNorms& norms) const {
  if (absl::Status s = Check(p, args); !s.ok()) return s;
  if (needs_tensor_norms() && !(std::isfinite(norms.weight_norm) && norms.weight_norm >= 0 &&
                                std::isfinite(norms.update_norm) && norms.update_norm >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer '", name_, "': tensor norms ",
                                                   norms.weight_norm, ", ", norms.update_norm,
                                                   " must be finite and >= 0"));
  }
  Plan plan;
  PlanApply(args, norms, &plan);
  Run(p, plan, nullptr);
  return absl::OkStatus();
}

absl::Status UpdateRule::Update(const Partition& p, const StepArgs& args) const {
  absl::StatusOr<NormPartials> sums = Prepare(p, args);
  if (!sums.ok()) return sums.status();
  return Apply(p, args, FinishNorms(*sums));
}

// Apply (sums == nullptr: the kernel's weights are stored back) or Prepare (sums: the
// plan's sums of squares; weights are left alone).
void UpdateRule::Run(const Partition& p, const Plan& plan, NormPartials* sums) const {
  const KernelTable& k = internal::Kernels();
  const internal::UpdateKernel fn = plan.kernel == internal::KernelId::kNone
                                        ? nullptr
                                        : k.update[static_cast<size_t>(plan.kernel)];
  const bool master = IsMaster(p.dtype, spec_.multi_precision);
  const size_t first = master ? 1 : 0;
  float* st[kMaxRuleState] = {};
  for (size_t j = first; j < p.state.size() && j - first < kMaxRuleState; ++j) {
    st[j - first] = p.state[j];
  }
  SumAcc weight_sq;
  SumAcc update_sq;  // LARS: the gradient's; LAMB: the kernel's direction
  const size_t n = p.count;

  // Apply with Partition::weight_copy: elements [off, off + len) of the weights to the copy.
  const size_t elem = DTypeSize(p.dtype);
  auto* const copy = sums == nullptr ? static_cast<unsigned char*>(p.weight_copy) : nullptr;
  auto copy_out = [&](size_t off, size_t len) {
    if (copy != nullptr) {
      std::memcpy(copy + off * elem, static_cast<const unsigned char*>(p.weight) + off * elem,
                  len * elem);
    }
  };

  if (p.dtype == DType::kFloat32) {
    auto* w = static_cast<float*>(p.weight);
    const auto* g = static_cast<const float*>(p.grad);
    if (plan.sum_weight_sq) k.sum_sq(w, n, &weight_sq);
    if (plan.sum_grad_sq) k.sum_sq(g, n, &update_sq);
    if (copy == nullptr) {
      if (fn != nullptr) fn(plan.args, w, g, st, n, &update_sq);
    } else {
      // In blocks, each copied while in L1: no second pass over the weights. Only Apply
      // gets here, whose kernels sum nothing, so the blocks cannot change a result.
      for (size_t off = 0; off < n; off += kBlock) {
        const size_t len = std::min(kBlock, n - off);
        float* st_block[kMaxRuleState] = {};
        for (size_t j = 0; j < kMaxRuleState; ++j) {
          if (st[j] != nullptr) st_block[j] = st[j] + off;
        }
        if (fn != nullptr) fn(plan.args, w + off, g + off, st_block, len, &update_sq);
        copy_out(off, len);
      }
    }
  } else {
    const bool half = p.dtype == DType::kFloat16;
    const auto widen = half ? k.widen_f16 : k.widen_bf16;
    const auto narrow = half ? k.narrow_f16 : k.narrow_bf16;
    auto* w16 = static_cast<uint16_t*>(p.weight);
    const auto* g16 = static_cast<const uint16_t*>(p.grad);
    float wbuf[kBlock];
    float gbuf[kBlock];
    for (size_t off = 0; off < n; off += kBlock) {
      const size_t len = std::min(kBlock, n - off);
      float* st_block[kMaxRuleState] = {};
      for (size_t j = 0; j < kMaxRuleState; ++j) {
        if (st[j] != nullptr) st_block[j] = st[j] + off;
      }
      widen(g16 + off, gbuf, len);
      if (plan.sum_grad_sq) k.sum_sq(gbuf, len, &update_sq);
      // MXNet's LAMB and LARS take the weight norm of the stored (16-bit) weights.
      if (!master || plan.sum_weight_sq) widen(w16 + off, wbuf, len);
      if (plan.sum_weight_sq) k.sum_sq(wbuf, len, &weight_sq);
      if (fn != nullptr) {
        float* w = master ? p.state[0] + off : wbuf;
        fn(plan.args, w, gbuf, st_block, len, &update_sq);
        if (sums == nullptr) narrow(w, w16 + off, len);
      }
      copy_out(off, len);
    }
  }
  if (sums != nullptr) {
    sums->weight_sq = weight_sq.Total();
    sums->update_sq = update_sq.Total();
  }
}

absl::StatusOr<std::unique_ptr<UpdateRule>> MakeUpdateRule(const OptimizerSpec& spec) {
  const std::string name = absl::AsciiStrToLower(spec.rule);
  const RuleDef* def = FindRule(name);
  if (def == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer rule '", spec.rule,
                     "'; known rules: ", absl::StrJoin(KnownRules(), ", ")));
  }
  const std::vector<ParamDef> defs = AllParams(*def);
  for (const auto& [key, value] : spec.params) {
    // An init-capture: clang before 16 cannot capture a structured binding (clang-check).
    const auto it = std::find_if(defs.begin(), defs.end(),
                                 [&k = key](const ParamDef& d) { return k == d.name; });
    if (it == defs.end()) {
      std::string hint;
      if (key == "multi_precision") hint = " (set OptimizerSpec::multi_precision)";
      if (key == "lr_scheduler") hint = " (set OptimizerSpec::schedule)";
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer '", name, "' has no hyper-parameter '", key, "'", hint,
                       "; known: ", absl::StrJoin(RuleParamNames(name), ", ")));
    }
    if (absl::Status s = CheckValue(name, *it, value); !s.ok()) return s;
  }
  std::map<std::string, double> params;
  for (const ParamDef& d : defs) {
    const auto given = spec.params.find(d.name);
    if (given != spec.params.end()) {
      params[d.name] = given->second;
    } else if (d.value.has_value()) {
      params[d.name] = *d.value;
    }
  }
  if (def->check != nullptr) {
    if (absl::Status s = def->check(params); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer '", name, "': ", s.message()));
    }
  }
  if (absl::Status s = ValidateLrSchedule(spec.schedule); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer '", name, "': ", s.message()));
  }
  internal::RuleInit init;
  init.name = name;
  init.spec = spec;
  init.spec.rule = name;
  const auto lr = params.find("learning_rate");
  if (lr != params.end()) init.learning_rate = lr->second;
  init.params = std::move(params);
  return def->make(std::move(init));
}

std::vector<std::string> KnownRules() {
  std::vector<std::string> names;
  for (const RuleDef& d : Rules()) names.push_back(d.name);
  return names;
}

std::vector<std::string> RuleParamNames(absl::string_view rule) {
  const RuleDef* def = FindRule(absl::AsciiStrToLower(rule));
  std::vector<std::string> names;
  if (def == nullptr) return names;
  for (const ParamDef& d : AllParams(*def)) names.push_back(d.name);
  std::sort(names.begin(), names.end());
  return names;
}

bool IsLarsExemptName(absl::string_view param_name) {
  return absl::EndsWith(param_name, "gamma") || absl::EndsWith(param_name, "beta") ||
         absl::EndsWith(param_name, "bias");
}

namespace internal {

KernelArgs BaseKernelArgs(const UpdateRule& rule, const StepArgs& step, ClipConvention clip,
                          LrWd lr_wd, bool rescale_exact) {
  KernelArgs a;
  const bool kw = lr_wd == LrWd::kKwargs;
  a.lr = kw ? Kw(step.lr) : static_cast<float>(step.lr);
  a.wd = kw ? Kw(step.wd) : static_cast<float>(step.wd);
  const double rescale = *rule.param("rescale_grad");
  a.rescale = rescale_exact ? static_cast<float>(rescale) : KwParam(rule, "rescale_grad");
  const std::optional<double> c = rule.param("clip_gradient");
  if (c.has_value() && (clip == ClipConvention::kIfNotNone || *c != 0)) {
    a.clip = rescale_exact ? static_cast<float>(*c) : KwParam(rule, "clip_gradient");
  }
  return a;
}

float Kw(double v) { return MxnetKwargFloat(v); }

float KwParam(const UpdateRule& rule, const char* name) { return rule.KwP(name); }

float TruthyOrOff(const UpdateRule& rule, const char* name) {
  const std::optional<double> v = rule.param(name);
  return v.has_value() && *v != 0 ? KwParam(rule, name) : -1.f;
}

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps
