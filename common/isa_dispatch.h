// Run-time choice of a kernel table by the CPU's instruction set: the AVX2 table where the
// CPU has AVX2 and F16C and the OS saves the YMM registers (x86-64), else the portable one.
// Detected on first use; tests force either (Force). The server's sums (common/reduce.cc)
// and the optimizers' kernels (optimizers/kernels.cc) each keep one; `Table` is any type
// with a `const char* isa` naming its instruction set.
#ifndef HYBRIDPS_COMMON_ISA_DISPATCH_H_
#define HYBRIDPS_COMMON_ISA_DISPATCH_H_

#include <atomic>

#include "absl/strings/string_view.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace hybridps {

// Whether the AVX2 kernels (AVX2 and F16C) can run here.
inline bool CpuHasAvx2F16c() {
#if defined(__x86_64__)
  __builtin_cpu_init();  // also checks that the OS saves the YMM registers
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  // F16C from CPUID leaf 1: older clangs reject __builtin_cpu_supports("f16c").
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && f16c;
#else
  return false;
#endif
}

template <typename Table>
class IsaDispatch {
 public:
  // `avx2`: nullptr where the build has no AVX2 kernels. Both outlive the dispatch.
  constexpr IsaDispatch(const Table* portable, const Table* avx2)
      : portable_(portable), avx2_(avx2) {}

  // The table in use (any thread).
  const Table& Get() {
    const Table* t = table_.load(std::memory_order_acquire);
    if (t == nullptr) {
      t = Detect();  // idempotent, so a race only repeats the detection
      table_.store(t, std::memory_order_release);
    }
    return *t;
  }
  // Tests: routes later calls to the table named `isa` ("avx2" or the portable one's
  // name); nullptr restores the detected one. False when that table cannot run here.
  bool Force(const char* isa) {
    if (isa == nullptr) {
      table_.store(Detect(), std::memory_order_release);
      return true;
    }
    const absl::string_view name(isa);
    if (name == portable_->isa) {
      table_.store(portable_, std::memory_order_release);
      return true;
    }
    if (avx2_ != nullptr && name == avx2_->isa && CpuHasAvx2F16c()) {
      table_.store(avx2_, std::memory_order_release);
      return true;
    }
    return false;
  }

 private:
  const Table* Detect() const {
    return avx2_ != nullptr && CpuHasAvx2F16c() ? avx2_ : portable_;
  }

  const Table* portable_;
  const Table* avx2_;
  std::atomic<const Table*> table_{nullptr};  // nullptr until the first use
};

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_ISA_DISPATCH_H_
