// The eager probe of dist_allreduce (Options::eager_probe): at the start, the workers time
// on their own links a push_pull that rides with the negotiation (eager: every rank sends
// the whole tensor to every other, n - 1 copies) against one that negotiates and then runs
// the allreduce (2(n - 1)/n of the tensor, one more step), and keep eager only for the
// sizes at which it was not slower. Fast links favour eager up to large sizes (a step
// saved), slow ones lose with it from small sizes on (the extra copies). Internal to
// worker/.
#ifndef HYBRIDPS_WORKER_ALLREDUCE_EAGER_PROBE_H_
#define HYBRIDPS_WORKER_ALLREDUCE_EAGER_PROBE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/allreduce/cpu_collectives.h"

namespace hybridps {

struct EagerProbe {
  // The smallest size timed: up to it a push_pull goes eagerly whatever the timings.
  static constexpr size_t kSmallest = 4096;
  struct Timing {
    size_t bytes;
    double eager_us;      // per operation, this rank's fastest sample
    double allreduce_us;  // per operation, this rank's fastest sample
  };
  // The sizes timed, largest first (those above the point where rank 0 stopped are not);
  // every rank's own, only rank 0's decide.
  std::vector<Timing> timings;
  // The largest tensor (bytes) that goes eagerly, rank 0's verdict on every rank: going up
  // from the smallest size, each size's gain from eager (1.1 - eager / allreduce, negative
  // where eager was more than 10 % slower) is summed, and the limit is the size at which
  // the sum is largest (kSmallest when it never gets above 0).
  size_t limit = 0;
  // "256 KiB eager 2100 us / allreduce 1300 us; ..." for the log.
  std::string Describe() const;
};

// A collective: every worker of the job calls it at the same point with the same
// `largest` (bytes, at least kSmallest) and `reps`, before the store's first round (it
// uses `cpu`'s exchange, and leaves no exchange posted). Times the halvings of `largest`
// from the smallest (at least kSmallest) up, at each size `reps` samples of 4 operations
// back to back eagerly and as many through the allreduce, in turn, after one of each to
// warm up. After each size rank 0 says whether to go on (not once eager clearly lost: the
// summed gain fell 1 below its peak); its verdict is broadcast.
absl::StatusOr<EagerProbe> ProbeEagerLimit(CpuCollectives* cpu, size_t largest, int reps,
                                           absl::Duration timeout);

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_ALLREDUCE_EAGER_PROBE_H_
