#include "tests/optimizers/reference.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace hybridps {
namespace optimizers {
namespace testing {
namespace {

double Sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }

double Norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

}  // namespace

ScalarReference::ScalarReference(std::string rule, std::map<std::string, double> params,
                                 size_t count)
    : rule_(std::move(rule)), p_(std::move(params)), s0_(count), s1_(count), s2_(count) {}

double ScalarReference::Get(const char* name) const { return p_.at(name); }
bool ScalarReference::Has(const char* name) const { return p_.count(name) != 0; }

// clip_gradient applies when given and non-zero (AdaGrad: when given).
double ScalarReference::ClipGrad(double x, bool clip_zero_too) const {
  if (!Has("clip_gradient")) return x;
  const double c = Get("clip_gradient");
  if (c < 0 || (c == 0 && !clip_zero_too)) return x;
  return std::clamp(x, -c, c);
}

void ScalarReference::Step(const StepArgs& step, std::vector<double>* wp,
                           const std::vector<double>& g, const std::vector<double>* norm_weights) {
  std::vector<double>& w = *wp;
  const size_t n = w.size();
  const double lr = step.lr;
  const double wd = step.wd;
  const double rescale = Get("rescale_grad");
  const double t = static_cast<double>(step.t);

  if (rule_ == "sgd" || rule_ == "lars") {
    double rate = lr;
    double mu = Get("momentum");
    if (rule_ == "lars") {
      const double wn = Norm(norm_weights != nullptr ? *norm_weights : w);
      const double gn = Norm(g);
      if (step.layer_adaptation && wn > 0 && gn > 0) {
        rate = lr * Get("eta") * wn / (gn * rescale + wd * wn + Get("eps"));
      }
      if (mu > 0 && Get("momentum_correction") != 0 && step.prev_lr != 0) {
        mu *= step.lr / step.prev_lr;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const double gi = ClipGrad(rescale * g[i], false);
      const double m = mu * s0_[i] - rate * wd * w[i] - rate * gi;
      s0_[i] = m;
      w[i] += m;
    }
  } else if (rule_ == "nag") {
    const double mu = Get("momentum");
    for (size_t i = 0; i < n; ++i) {
      const double gi = ClipGrad(rescale * g[i], false);
      if (mu == 0) {
        w[i] = (1 - lr * wd) * w[i] - lr * gi;
        continue;
      }
      const double m = mu * s0_[i];
      const double wn = w[i] - m + (1 + mu) * (m - lr * (gi + wd * w[i]));
      s0_[i] = m - lr * (gi + wd * wn);  // the in-place operator sees the new weight
      w[i] = wn;
    }
  } else if (rule_ == "signum") {
    const double mu = Get("momentum");
    for (size_t i = 0; i < n; ++i) {
      if (mu == 0) {
        w[i] = (1 - lr * wd) * w[i] - lr * Sign(g[i]);
        continue;
      }
      const double gi = ClipGrad(rescale * g[i], false);
      s0_[i] = mu * s0_[i] - (1 - mu) * (wd * w[i] + gi);
      w[i] = (1 - lr * Get("wd_lh")) * w[i] + lr * Sign(s0_[i]);
    }
  } else if (rule_ == "adam" || rule_ == "adamw") {
    const double b1 = Get("beta1");
    const double b2 = Get("beta2");
    const double eps = Get("epsilon");
    const bool adamw = rule_ == "adamw";
    double rate = lr;
    if (!adamw || Get("correct_bias") != 0) {
      rate = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    }
    for (size_t i = 0; i < n; ++i) {
      const double gi = ClipGrad(rescale * g[i] + (adamw ? 0 : wd * w[i]), false);
      s0_[i] = b1 * s0_[i] + (1 - b1) * gi;
      s1_[i] = b2 * s1_[i] + (1 - b2) * gi * gi;
      const double dir = s0_[i] / (std::sqrt(s1_[i]) + eps);
      if (adamw) {
        w[i] -= Get("eta") * (rate * dir + wd * w[i]);
      } else {
        w[i] -= rate * dir;
      }
    }
  } else if (rule_ == "adagrad") {
    for (size_t i = 0; i < n; ++i) {
      const double gi = ClipGrad(rescale * g[i], true);
      s0_[i] += gi * gi;
      w[i] -= lr * (gi / std::sqrt(s0_[i] + Get("eps")) + wd * w[i]);
    }
  } else if (rule_ == "rmsprop") {
    const double g1 = Get("gamma1");
    const double g2 = Get("gamma2");
    const double eps = Get("epsilon");
    const bool centered = Get("centered") != 0;
    const double cw = Has("clip_weights") ? Get("clip_weights") : 0;
    for (size_t i = 0; i < n; ++i) {
      const double gi = ClipGrad(rescale * g[i] + wd * w[i], false);
      s0_[i] = (1 - g1) * gi * gi + g1 * s0_[i];
      if (centered) {
        s1_[i] = (1 - g1) * gi + g1 * s1_[i];
        s2_[i] = g2 * s2_[i] - lr * gi / std::sqrt(s0_[i] - s1_[i] * s1_[i] + eps);
        w[i] += s2_[i];
      } else {
        w[i] -= lr * gi / std::sqrt(s0_[i] + eps);
      }
      if (cw > 0) w[i] = std::clamp(w[i], -cw, cw);
    }
  } else if (rule_ == "lamb") {
    const double b1 = Get("beta1");
    const double b2 = Get("beta2");
    const double eps = Get("epsilon");
    const bool bias = Get("bias_correction") != 0;
    std::vector<double> u(n);
    for (size_t i = 0; i < n; ++i) {
      const double gi = ClipGrad(rescale * g[i], false);
      s0_[i] = b1 * s0_[i] + (1 - b1) * gi;
      s1_[i] = b2 * s1_[i] + (1 - b2) * gi * gi;
      const double m = bias ? s0_[i] / (1 - std::pow(b1, t)) : s0_[i];
      const double v = bias ? s1_[i] / (1 - std::pow(b2, t)) : s1_[i];
      u[i] = m / (std::sqrt(v) + eps) + wd * w[i];
    }
    double r1 = Norm(norm_weights != nullptr ? *norm_weights : w);
    const double r2 = Norm(u);
    if (Has("lower_bound") && Get("lower_bound") > 0) r1 = std::max(r1, Get("lower_bound"));
    if (Has("upper_bound") && Get("upper_bound") > 0) r1 = std::min(r1, Get("upper_bound"));
    const double ratio = (r1 == 0 || r2 == 0) ? 1.0 : r1 / r2;
    for (size_t i = 0; i < n; ++i) w[i] -= lr * ratio * u[i];
  } else {
    throw std::invalid_argument("no reference for rule " + rule_);
  }
}

}  // namespace testing
}  // namespace optimizers
}  // namespace hybridps
