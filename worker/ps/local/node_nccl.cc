// NodeCollectives on NCCL (worker/ps/local/node_gpu_reduce.h): one communicator among a node's
// local ranks, made on the reducer's thread; its waits poll with deadlines and stop when
// Abort() was called, with its reason (NcclComm then aborts the communicator).
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "worker/comm/cuda_util.h"
#include "worker/comm/nccl_comm.h"
#include "worker/ps/local/node_gpu_reduce.h"

namespace hybridps {
namespace {

class NcclNodeCollectives : public NodeCollectives {
 public:
  explicit NcclNodeCollectives(ShmAllreduce* exchange) : exchange_(exchange) {}

  absl::Status Open(int device, absl::Time deadline) override {
    // Each rank's GPU (with NCCL_HOSTID, which lets ranks of one GPU pose as hosts), so
    // that ranks sharing a GPU get an error that says so rather than NCCL's "invalid usage".
    char bus[32] = {0};
    RETURN_IF_ERROR(CudaStatus(cudaDeviceGetPCIBusId(bus, sizeof bus - 1, device),
                               "cudaDeviceGetPCIBusId"));
    const char* host_id = std::getenv("NCCL_HOSTID");
    const std::string gpu = absl::StrCat(bus, "|", host_id != nullptr ? host_id : "");
    ASSIGN_OR_RETURN(auto gpus, exchange_->Allgather(gpu, deadline - absl::Now()));
    for (size_t a = 0; a < gpus.size(); ++a) {  // every rank checks every pair: all fail
      for (size_t b = a + 1; b < gpus.size(); ++b) {
        if (gpus[a] != gpus[b]) continue;
        return absl::FailedPreconditionError(absl::StrCat(
            "local ranks ", a, " and ", b, " of this node both put their tensors on the GPU "
            "at PCI ", gpus[a].substr(0, gpus[a].find('|')), ": the node's NCCL reduction "
            "needs one GPU per local rank (use gpu(local_rank)), or set "
            "HYBRIDPS_GPU_LOCAL_REDUCE=host"));
      }
    }
    std::string id;
    if (exchange_->local_rank() == 0) {
      ASSIGN_OR_RETURN(id, NewNcclId());
    }
    ASSIGN_OR_RETURN(auto ids, exchange_->Allgather(id, deadline - absl::Now()));
    ASSIGN_OR_RETURN(comm_, NcclComm::Create(exchange_->local_rank(), exchange_->local_size(),
                                             device, ids[0], deadline, Interrupt()));
    return absl::OkStatus();
  }
  absl::Status Reduce(const std::vector<NodeTensor>& tensors, absl::Time deadline) override {
    return Run(Calls(/*broadcast=*/false, tensors), deadline);
  }
  absl::Status Broadcast(const std::vector<NodeTensor>& tensors,
                         absl::Time deadline) override {
    return Run(Calls(/*broadcast=*/true, tensors), deadline);
  }
  void Abort(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    if (why_.ok()) why_ = why.ok() ? absl::AbortedError("the node's GPU reduction stopped") : why;
  }

 private:
  NcclComm::Interrupt Interrupt() {
    return [this]() -> absl::Status {
      absl::MutexLock lock(&mu_);
      return why_;
    };
  }
  // Per tensor and non-empty part: ncclReduce(in -> out) or ncclBroadcast(out, in place),
  // rooted at the part's pusher.
  static std::vector<NcclComm::Call> Calls(bool broadcast,
                                           const std::vector<NodeTensor>& tensors) {
    std::vector<NcclComm::Call> calls;
    for (const NodeTensor& t : tensors) {
      const size_t es = DTypeSize(t.dtype);
      for (const NodePart& p : *t.parts) {
        if (p.count == 0) continue;
        NcclComm::Call c;
        c.broadcast = broadcast;
        c.reduce = !broadcast;
        c.dtype = t.dtype;
        c.in = static_cast<const char*>(broadcast ? t.out : t.in) + p.offset * es;
        c.out = static_cast<char*>(t.out) + p.offset * es;
        c.count = p.count;
        c.root = p.pusher;
        calls.push_back(c);
      }
    }
    return calls;
  }
  absl::Status Run(const std::vector<NcclComm::Call>& calls, absl::Time deadline) {
    if (comm_ == nullptr) return absl::FailedPreconditionError("no NCCL communicator");
    if (calls.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(uint64_t ticket, comm_->Enqueue(calls, deadline, Interrupt()));
    return comm_->WaitFor(ticket, deadline, Interrupt());
  }

  ShmAllreduce* exchange_;
  std::unique_ptr<NcclComm> comm_;
  absl::Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);  // non-OK once aborted
};

}  // namespace

std::unique_ptr<NodeCollectives> NewNcclNodeCollectives(ShmAllreduce* exchange,
                                                        const NodeLayout& /*layout*/) {
  return std::make_unique<NcclNodeCollectives>(exchange);
}

}  // namespace hybridps
