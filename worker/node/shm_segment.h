// A node's POSIX shared-memory segment, as its local ranks map it: local rank 0 creates
// it, the others wait for it and map it. The node's shared-memory collectives
// (shm_allreduce.h) and dist_hybrid's local reduction (worker/ps/local/) both start so.
// The caller lays the segment out, unmaps `bytes` at the address when done, and unlinks
// the name once every local rank has mapped it (so nothing is left if a process dies).
#ifndef HYBRIDPS_WORKER_NODE_SHM_SEGMENT_H_
#define HYBRIDPS_WORKER_NODE_SHM_SEGMENT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hybridps {

// Local rank 0: removes a stale segment of that name (a job that died), creates it
// (exclusively, mode 0600), reserves its pages and maps them. A /dev/shm too small for
// `bytes` is ResourceExhausted here rather than a SIGBUS at the first touch. On failure
// nothing is left behind; the error names the segment and the system's reason.
absl::StatusOr<void*> CreateShmSegment(const std::string& name, size_t bytes);

// The other local ranks: waits until the segment exists with at least `bytes`, at most
// until `deadline` (DeadlineExceeded: "local rank 0 did not create NAME in time"), and
// maps it. A failed mapping unlinks the name: the job will not use it.
absl::StatusOr<void*> AttachShmSegment(const std::string& name, size_t bytes,
                                       absl::Time deadline);

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_NODE_SHM_SEGMENT_H_
