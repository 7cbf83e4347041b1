// Binding a worker process to its share of its host's CPUs (Options::bind_to, hybridrun
// --bind-to core), as mpirun --bind-to core does: on one host the local ranks' waiting
// threads then never share a core, and the shared-memory collectives' spinning barriers
// cost a microsecond or two instead of a scheduler round trip.
#ifndef HYBRIDPS_COMMON_AFFINITY_H_
#define HYBRIDPS_COMMON_AFFINITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hybridps {

// The CPUs of local rank `local_rank` of `local_size` that share `allowed` (ascending):
// floor(|allowed| / local_size) consecutive ones, at least one; with more ranks than
// CPUs the ranks take the CPUs in turn. Empty when `allowed` is empty or the rank is out
// of range.
std::vector<int> CpuShare(const std::vector<int>& allowed, int local_rank, int local_size);

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string CpuList(const std::vector<int>& cpus);

// The CPUs this process may run on (its affinity mask), ascending.
absl::StatusOr<std::vector<int>> AllowedCpus();

// Binds every thread of this process, and so every thread they start later, to `cpus`
// (local rank `local_rank` of `local_size`'s CpuShare of AllowedCpus()); returns them.
absl::StatusOr<std::vector<int>> BindLocalRank(int local_rank, int local_size);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_AFFINITY_H_
