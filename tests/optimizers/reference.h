// Straightforward double-precision reference implementations of the update rules, written
// from MXNet 1.9.1's documented formulas (not from optimizers/kernels_body.inc), one
// element at a time, for the tests to compare the vectorised rules against.
#ifndef HYBRIDPS_TESTS_OPTIMIZERS_REFERENCE_H_
#define HYBRIDPS_TESTS_OPTIMIZERS_REFERENCE_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "optimizers/update_rule.h"

namespace hybridps {
namespace optimizers {
namespace testing {

class ScalarReference {
 public:
  // `params`: the rule's resolved hyper-parameters (UpdateRule::hyper_parameters()).
  ScalarReference(std::string rule, std::map<std::string, double> params, size_t count);

  // One update of a whole tensor: w (the float32 weights or master copy, in double) and g
  // (the gradient as stored). LAMB and LARS take |w| from `norm_weights` when given (MXNet
  // uses the stored float16 weights under multi_precision), else from w.
  void Step(const StepArgs& step, std::vector<double>* w, const std::vector<double>& g,
            const std::vector<double>* norm_weights = nullptr);

 private:
  double Get(const char* name) const;
  bool Has(const char* name) const;
  double ClipGrad(double x, bool clip_zero_too) const;

  std::string rule_;
  std::map<std::string, double> p_;
  std::vector<double> s0_, s1_, s2_;  // momentum / mean / history / n; var / g; delta
};

}  // namespace testing
}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_TESTS_OPTIMIZERS_REFERENCE_H_
