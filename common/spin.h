// Busy-wait helpers for the optional spinning of I/O loops and waits (Options::spin).
#ifndef HYBRIDPS_COMMON_SPIN_H_
#define HYBRIDPS_COMMON_SPIN_H_

#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

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

// Options::spin for a poll loop: for `spin` after a poll that found work, poll again at
// once (pausing briefly) instead of sleeping until the loop's own timeout. One per loop
// thread.
class PollSpin {
 public:
  explicit PollSpin(absl::Duration spin) : spin_(spin) {}
  // The timeout to poll with, given the loop's own.
  absl::Duration Timeout(absl::Time now, absl::Duration timeout) {
    spinning_ = now - last_activity_ < spin_;
    return spinning_ ? absl::ZeroDuration() : timeout;
  }
  // After the poll: `ready` items were ready.
  void Polled(int ready) {
    if (ready > 0 && spin_ > absl::ZeroDuration()) {
      last_activity_ = absl::Now();
    } else if (spinning_) {
      CpuRelax();
    }
  }

 private:
  const absl::Duration spin_;
  absl::Time last_activity_ = absl::InfinitePast();
  bool spinning_ = false;
};

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_SPIN_H_
