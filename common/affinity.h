// Binding a worker process to its share of its host's cores (Options::bind_to, hybridrun
// --bind-to core), as mpirun --bind-to core binds each rank to a core: on one host the
// local ranks' waiting threads then never share a core, and the shared-memory
// collectives' barriers cost a microsecond or two instead of a scheduler round trip.
#ifndef HYBRIDPS_COMMON_AFFINITY_H_
#define HYBRIDPS_COMMON_AFFINITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hybridps {

// A core: the CPUs (hardware threads) that share it, ascending.
using Core = std::vector<int>;

// The cores that `cpus` (ascending) belong to, from the kernel's topology (sysfs
// physical_package_id and core_id; a CPU whose topology cannot be read is a core of its
// own), ordered by their first CPU. Only the CPUs of `cpus` are listed.
std::vector<Core> CoresOf(const std::vector<int>& cpus);

// The CPUs of local rank `local_rank` of `local_size` sharing `cores`: with at least as
// many cores as ranks, floor(cores / local_size) consecutive whole cores; with fewer, one
// CPU per rank, taken in turn from the cores' first hardware threads, then their second
// ones, and so on (ranks spread over the cores first). Empty when there are no cores or
// the rank is out of range.
std::vector<int> CpuShare(const std::vector<Core>& cores, int local_rank, int local_size);

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string CpuList(const std::vector<int>& cpus);

// The CPUs the calling thread may run on (its affinity mask), ascending.
absl::StatusOr<std::vector<int>> AllowedCpus();

// Binds every thread of this process, and so every thread they start later, to local
// rank `local_rank` of `local_size`'s CpuShare of the CPUs the process was allowed before
// its first binding (a second store does not split a share again); returns the calling
// thread's mask read back.
absl::StatusOr<std::vector<int>> BindLocalRank(int local_rank, int local_size);

// Undoes one BindLocalRank (a store that failed to start): when no other binding is
// left, gives every thread back the mask the process had before the first.
void UndoBinding();

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_AFFINITY_H_
