#include "worker/comm/nccl_comm.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"

namespace hybridps {
namespace {

// Polling: spin (yielding) for the first polls, then sleep between them.
class Backoff {
 public:
  void Pause() {
    if (++polls_ < 200) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(50));
    }
  }

 private:
  int polls_ = 0;
};

// The common check of every wait: the deadline, then the interrupt.
absl::Status CheckWait(absl::string_view what, absl::Time deadline,
                       const NcclComm::Interrupt& interrupt) {
  if (absl::Now() > deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " did not complete in time (a peer may have stopped)"));
  }
  return interrupt ? interrupt() : absl::OkStatus();
}

}  // namespace

ncclDataType_t NcclDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  return ncclFloat32;  // not reached: every DType is handled above
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view call) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(nullptr);
  // A network or peer failure is Unavailable (the store then waits for the scheduler to
  // name a dead peer, as after a Gloo failure); anything else Internal.
  const bool peer = result == ncclSystemError || result == ncclRemoteError;
  std::string message = absl::StrCat(call, " failed: ", ncclGetErrorString(result),
                                     " (NCCL error ", static_cast<int>(result), ")");
  if (last != nullptr && *last != '\0') absl::StrAppend(&message, ": ", last);
  return absl::Status(peer ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal,
                      message);
}

absl::StatusOr<std::string> NewNcclId() {
  ncclUniqueId id;
  RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, sizeof id.internal);
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(int rank, int size, int device,
                                                           absl::string_view id,
                                                           absl::Time deadline,
                                                           const Interrupt& interrupt) {
  ncclUniqueId uid;
  if (id.size() != sizeof uid.internal) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL id has ", sizeof uid.internal, " bytes, not ", id.size()));
  }
  std::memcpy(uid.internal, id.data(), id.size());
  RETURN_IF_ERROR(UseDevice(device));
  std::unique_ptr<NcclComm> c(new NcclComm(device));
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags"));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&c->comm_, size, uid, rank, &config);
  if (c->comm_ == nullptr) {
    RETURN_IF_ERROR(NcclStatus(r == ncclSuccess ? ncclInternalError : r,
                               "ncclCommInitRankConfig"));
  }
  RETURN_IF_ERROR(c->Settle(
      r, absl::StrCat("ncclCommInitRankConfig (rank ", rank, " of ", size, ", GPU ", device, ")"),
      deadline, interrupt));
  return c;
}

NcclComm::~NcclComm() {
  Abort();
  for (auto& [ticket, ev] : inflight_) cudaEventDestroy(ev);
  for (cudaEvent_t ev : spare_events_) cudaEventDestroy(ev);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclComm::Abort() {
  if (comm_ == nullptr) return;
  const ncclResult_t r = ncclCommAbort(comm_);
  if (r != ncclSuccess) HPS_LOG(WARNING) << NcclStatus(r, "ncclCommAbort").message();
  comm_ = nullptr;
}

absl::Status NcclComm::Fail(absl::Status status) {
  Abort();
  return status;
}

absl::Status NcclComm::Settle(ncclResult_t result, absl::string_view call, absl::Time deadline,
                              const Interrupt& interrupt) {
  Backoff backoff;
  while (result == ncclSuccess || result == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) return Fail(NcclStatus(q, "ncclCommGetAsyncError"));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      result = state;
      break;
    }
    absl::Status s = CheckWait(call, deadline, interrupt);
    if (!s.ok()) return Fail(s);
    backoff.Pause();
  }
  return Fail(NcclStatus(result, call));
}

absl::StatusOr<uint64_t> NcclComm::Enqueue(const std::vector<Call>& calls, absl::Time deadline,
                                           const Interrupt& interrupt) {
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        "the NCCL communicator was aborted after an earlier failure");
  }
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return Fail(NcclStatus(r, "ncclGroupStart"));
  for (const Call& c : calls) {
    const ncclDataType_t type = NcclDataType(c.dtype);
    r = c.broadcast ? ncclBroadcast(c.in, c.out, c.count, type, c.root, comm_, stream_)
        : c.reduce  ? ncclReduce(c.in, c.out, c.count, type, ncclSum, c.root, comm_, stream_)
                    : ncclAllReduce(c.in, c.out, c.count, type, ncclSum, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclGroupEnd();
      return Fail(NcclStatus(r, c.broadcast ? "ncclBroadcast"
                                : c.reduce  ? "ncclReduce"
                                            : "ncclAllReduce"));
    }
  }
  RETURN_IF_ERROR(Settle(ncclGroupEnd(), "ncclGroupEnd", deadline, interrupt));
  cudaEvent_t ev = nullptr;
  if (spare_events_.empty()) {
    absl::Status s =
        CudaStatus(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    if (!s.ok()) return Fail(s);
  } else {
    ev = spare_events_.back();
    spare_events_.pop_back();
  }
  const uint64_t ticket = next_ticket_++;
  inflight_.emplace_back(ticket, ev);
  absl::Status s = CudaStatus(cudaEventRecord(ev, stream_), "cudaEventRecord");
  if (!s.ok()) return Fail(s);
  return ticket;
}

absl::Status NcclComm::WaitFor(uint64_t ticket, absl::Time deadline, const Interrupt& interrupt) {
  Backoff backoff;
  while (!inflight_.empty() && inflight_.front().first <= ticket) {
    if (comm_ == nullptr) {
      return absl::FailedPreconditionError(
          "the NCCL communicator was aborted after an earlier failure");
    }
    const cudaError_t e = cudaEventQuery(inflight_.front().second);
    if (e == cudaSuccess) {
      spare_events_.push_back(inflight_.front().second);
      inflight_.pop_front();
      continue;
    }
    if (e != cudaErrorNotReady) return Fail(CudaStatus(e, "cudaEventQuery"));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) return Fail(NcclStatus(q, "ncclCommGetAsyncError"));
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(NcclStatus(state, "an NCCL collective (asynchronous error)"));
    }
    absl::Status s = CheckWait("an NCCL collective", deadline, interrupt);
    if (!s.ok()) return Fail(s);
    backoff.Pause();
  }
  return absl::OkStatus();
}

void NcclComm::Close(absl::Time deadline) {
  if (comm_ == nullptr) return;
  absl::Status s = Settle(ncclCommFinalize(comm_), "ncclCommFinalize", deadline, nullptr);
  if (!s.ok()) {
    HPS_LOG(WARNING) << "closing the NCCL communicator: " << s.message() << " (aborted it)";
    return;
  }
  const ncclResult_t r = ncclCommDestroy(comm_);
  if (r != ncclSuccess) HPS_LOG(WARNING) << NcclStatus(r, "ncclCommDestroy").message();
  comm_ = nullptr;
}

}  // namespace hybridps
