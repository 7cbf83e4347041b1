// Busy-wait helpers for the optional spinning of I/O loops and waits (Options::spin).
#ifndef HYBRIDPS_COMMON_SPIN_H_
#define HYBRIDPS_COMMON_SPIN_H_

#include <thread>

namespace hybridps {

// A short pause in a polling loop (lets the other hyperthread of the core run).
inline void CpuRelax() {
  for (int i = 0; i < 16; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
}

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_SPIN_H_
