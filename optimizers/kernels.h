// Internal to optimizers/: the vectorised float32 update kernels and their dispatch.
//
// Each kernel applies one MXNet update operator to n float32 elements, with the same
// float operations in the same order as the operator's CPU code (so results match MXNet
// to the last bit where MXNet's compiler did not reorder). Kernels run on AVX2 (+F16C)
// when the CPU has it, else on portable scalar code; both give bit-identical results
// (no FMA contraction: the folder builds with -ffp-contract=off).
#ifndef HYBRIDPS_OPTIMIZERS_KERNELS_H_
#define HYBRIDPS_OPTIMIZERS_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "optimizers/update_rule.h"

namespace hybridps {
namespace optimizers {
namespace internal {

// Float scalars of one kernel call (MXNet's operators take float parameters).
struct KernelArgs {
  float lr = 0;
  float wd = 0;
  float rescale = 1;
  float clip = -1;  // clip_gradient; applied when >= 0 (the operators' convention)
  float momentum = 0;
  float beta1 = 0;
  float beta2 = 0;
  float epsilon = 0;
  float gamma1 = 0;
  float gamma2 = 0;
  float wd_lh = 0;
  float eta = 1;
  float clip_weights = -1;  // applied when >= 0
  bool bias_correction = false;
  float bias1 = 1;  // LAMB with bias_correction: 1 - beta1^t and 1 - beta2^t (powf)
  float bias2 = 1;
};

enum class KernelId : uint8_t {
  kNone = 0,         // no update (the plan skips the step)
  kSgd,              // multi_sgd_update (also LARS's preloaded_multi_sgd_update)
  kSgdMom,           // multi_sgd_mom_update (also LARS's preloaded variant); st: mom
  kSgdPlain,         // sgd_update: NAG without momentum
  kNagMom,           // nag_mom_update (in place: the momentum sees the new weight); st: mom
  kSignSgd,          // signsgd_update
  kSignum,           // signum_update; st: mom
  kAdam,             // adam_update; st: mean, var
  kAdamW,            // contrib adamw_update; st: mean, var
  kAdaGrad,          // AdaGrad's NDArray expression (dense); st: history
  kRmsProp,          // rmsprop_update; st: n
  kRmsPropCentered,  // rmspropalex_update; st: n, g, delta
  kLambPhase1,       // multi_lamb step 1: moments, and sum of g^2 into the accumulator
  kLambPhase2,       // multi_lamb step 2: w -= lr * g with g recomputed from the moments
  kNumKernels,
};

// Sums of squares in 8 double lanes (element i goes to lane i % 8) so that every ISA adds
// in the same order; Total() adds the lanes in a fixed tree.
struct SumAcc {
  double lane[8] = {};
  double Total() const {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

// w: the float32 weights (or master copy) updated in place; g: float32 gradient; st: three
// pointers, the rule's state buffers after the master copy (unused ones null); acc: sums
// (kLambPhase1 only).
using UpdateKernel = void (*)(const KernelArgs& a, float* w, const float* g, float* const* st,
                              size_t n, SumAcc* acc);

struct KernelTable {
  const char* isa;
  UpdateKernel update[static_cast<size_t>(KernelId::kNumKernels)];
  void (*sum_sq)(const float* x, size_t n, SumAcc* acc);  // acc += x^2 lane-wise
  void (*widen_f16)(const uint16_t* src, float* dst, size_t n);
  void (*narrow_f16)(const float* src, uint16_t* dst, size_t n);  // round to nearest even
  void (*widen_bf16)(const uint16_t* src, float* dst, size_t n);
  void (*narrow_bf16)(const float* src, uint16_t* dst, size_t n);  // round to nearest even
};

// The table for this CPU (or the one a test forced).
const KernelTable& Kernels();

// Test hook: routes later calls to "avx2" or the portable table ("sse2" on x86-64,
// "generic" elsewhere); nullptr restores detection. False, changing nothing, when this CPU
// cannot run `isa`.
bool ForceKernelIsaForTesting(const char* isa);

}  // namespace internal

// What a phase of an UpdateRule runs (see UpdateRule::PlanApply).
struct UpdateRule::Plan {
  internal::KernelId kernel = internal::KernelId::kNone;
  internal::KernelArgs args;
  bool sum_weight_sq = false;  // Prepare: sum w^2 of the stored weights
  bool sum_grad_sq = false;    // Prepare: sum grad^2 of the stored gradient (LARS)
};

}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_OPTIMIZERS_KERNELS_H_
