// The wall clock as absl::Time, read with clock_gettime(CLOCK_REALTIME) (in the vDSO,
// without a system call, on the usual TSC and kvm-clock clock sources). The same clock as
// absl::Now(), which interpolates it from the cycle counter under its own sequence lock
// and costs more (docs/design/allreduce.md). For the per-operation paths of the
// dist_allreduce executor, the handles and the shared-memory exchange; elsewhere
// absl::Now() is fine.
#ifndef HYBRIDPS_COMMON_CLOCK_H_
#define HYBRIDPS_COMMON_CLOCK_H_

#include <time.h>

#include "absl/time/time.h"

namespace hybridps {

inline absl::Time WallNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return absl::TimeFromTimespec(ts);
}

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_CLOCK_H_
