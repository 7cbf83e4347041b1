// NCCL for the dist_allreduce store's GPU tensors (built only with HYBRIDPS_WITH_NCCL):
// one communicator over all workers, one GPU per worker, its collectives on a dedicated
// stream. Plain C++ on the CUDA runtime and NCCL: no kernels of our own.
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0, NCCL >= 2.14): no NCCL
// call waits for peers. Every wait here polls (ncclCommGetAsyncError, cudaEventQuery)
// with a deadline and an interrupt; when either fires, or NCCL reports an error, the
// communicator is aborted (ncclCommAbort) so that nothing stays stuck in NCCL, and every
// later call fails.
//
// Threading: one thread at a time (the store's executor). Create makes the device
// current on the calling thread; later calls must come from that thread.
#ifndef HYBRIDPS_WORKER_COMM_NCCL_COMM_H_
#define HYBRIDPS_WORKER_COMM_NCCL_COMM_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "worker/comm/cuda_util.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "hybridps needs NCCL >= 2.14 (non-blocking communicators; bfloat16 needs 2.10)"
#endif

namespace hybridps {

// NCCL's element type for `dtype` (every DType has one).
ncclDataType_t NcclDataType(DType dtype);
// "ncclAllReduce failed: invalid argument (NCCL error 4): <NCCL's last error>"; OK for
// ncclSuccess. Unavailable for ncclSystemError and ncclRemoteError (network, peers),
// Internal otherwise.
absl::Status NcclStatus(ncclResult_t result, absl::string_view call);
// A new communicator id (NCCL_UNIQUE_ID_BYTES bytes): rank 0 makes it, every rank
// passes it to NcclComm::Create.
absl::StatusOr<std::string> NewNcclId();

class NcclComm {
 public:
  // Polled while waiting: a non-OK status stops the wait with that status (and aborts).
  using Interrupt = std::function<absl::Status()>;

  // Joins the communicator of `size` ranks named by `id` as `rank`, on `device`.
  // Collective: every rank calls it; fails at `deadline` when not all do.
  static absl::StatusOr<std::unique_ptr<NcclComm>> Create(int rank, int size, int device,
                                                          absl::string_view id,
                                                          absl::Time deadline,
                                                          const Interrupt& interrupt);
  // Aborts the communicator unless Close ended it.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int device() const { return device_; }

  // One collective: a sum-allreduce of `count` elements from `in` into `out` (`out` may
  // equal `in`, else they must not overlap), or, with `broadcast`, root's `in` into every
  // rank's `out` (in place when equal), or, with `reduce`, the sum into root's `out` only.
  struct Call {
    bool broadcast = false;
    bool reduce = false;
    DType dtype = DType::kFloat32;
    const void* in = nullptr;
    void* out = nullptr;
    size_t count = 0;
    int root = 0;
  };
  // Enqueues `calls` on the stream as one NCCL group (one launch) and returns a ticket
  // for WaitFor. Returns once enqueued; the buffers must stay valid until WaitFor(ticket)
  // returned OK (or the communicator was aborted).
  absl::StatusOr<uint64_t> Enqueue(const std::vector<Call>& calls, absl::Time deadline,
                                   const Interrupt& interrupt);
  // Waits until the work of `ticket` (and everything enqueued before it) has completed.
  absl::Status WaitFor(uint64_t ticket, absl::Time deadline, const Interrupt& interrupt);
  // Ends the communicator in order (ncclCommFinalize, then ncclCommDestroy), aborting it
  // if that does not complete by `deadline`.
  void Close(absl::Time deadline);
  // Aborts whatever runs; every later call fails.
  void Abort();

 private:
  explicit NcclComm(int device) : device_(device) {}
  // Waits while the communicator's state is ncclInProgress after `call` returned
  // `result`; aborts on an error, the deadline or the interrupt.
  absl::Status Settle(ncclResult_t result, absl::string_view call, absl::Time deadline,
                      const Interrupt& interrupt);
  absl::Status Fail(absl::Status status);  // aborts, returns `status`

  int device_;
  ncclComm_t comm_ = nullptr;  // null once aborted or closed
  cudaStream_t stream_ = nullptr;
  uint64_t next_ticket_ = 1;
  std::deque<std::pair<uint64_t, cudaEvent_t>> inflight_;  // by ticket
  std::vector<cudaEvent_t> spare_events_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_COMM_NCCL_COMM_H_
