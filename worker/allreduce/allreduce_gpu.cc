// The dist_allreduce store's GPU tensors on NCCL (see allreduce_store.h): the id shared
// at Start, the checks at submission, the executor's NCCL collectives. Built only with
// HYBRIDPS_WITH_NCCL.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/allreduce/allreduce_op.h"
#include "worker/allreduce/allreduce_store.h"
#include "worker/comm/gloo_comm.h"
#include "worker/comm/nccl_comm.h"

namespace hybridps {

namespace nego = negotiation;

// Rank 0 makes the id when it sees a GPU and passes it, or why it has none, through the
// rendezvous store ("+" id or "-" reason). Every rank learns the same.
absl::Status AllreduceStore::ShareNcclId() {
  absl::StatusOr<std::string> shared = FromRankZero("nccl/", [] {
    absl::StatusOr<std::string> id;
    auto count = CudaDeviceCount();
    if (!count.ok()) {
      id = count.status();
    } else if (*count == 0) {
      id = absl::NotFoundError("cudaGetDeviceCount reports 0 devices");
    } else {
      id = NewNcclId();
    }
    return id.ok() ? absl::StrCat("+", *id) : absl::StrCat("-", id.status().message());
  });
  if (!shared.ok()) return shared.status();
  const std::string& value = *shared;
  if (value.empty() || (value[0] != '+' && value[0] != '-')) {
    return absl::DataLossError("rendezvous: malformed NCCL id from rank 0");
  }
  if (value[0] == '+') {
    nccl_id_ = value.substr(1);
  } else {
    nccl_unavailable_ = absl::StrCat(
        "this job has no NCCL communicator: rank 0 has no GPU (", value.substr(1), ")");
  }
  return absl::OkStatus();
}

absl::Status AllreduceStore::CheckGpuTensor(absl::string_view name, const TensorView& t,
                                            absl::string_view what) {
  const std::string where = absl::StrCat("tensor '", name, "': ", what, " (on GPU ",
                                         t.device_id, ")");
  if (t.data == nullptr && t.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", t.count, " elements but no data"));
  }
  if (nccl_id_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": ", nccl_unavailable_));
  }
  int device;
  {
    absl::MutexLock lock(&mu_);
    device = gpu_device_;
  }
  if (device < 0) {  // the first GPU tensor: its device becomes the worker's
    auto count = CudaDeviceCount();
    if (!count.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": ", count.status().message()));
    }
    if (t.device_id < 0 || t.device_id >= *count) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": this process sees ", *count, " CUDA device(s)"));
    }
    absl::MutexLock lock(&mu_);
    if (gpu_device_ < 0) gpu_device_ = t.device_id;
    device = gpu_device_;
  }
  if (t.device_id != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": this worker reduces GPU tensors on GPU ", device,
        " (the device of its first GPU tensor); NCCL runs one GPU per worker"));
  }
  if (t.count > 0) {
    cudaPointerAttributes attr{};
    absl::Status s =
        CudaStatus(cudaPointerGetAttributes(&attr, t.data), "cudaPointerGetAttributes");
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
    if ((attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
        attr.device != device) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": its data is not memory of GPU ", device));
    }
  }
  return absl::OkStatus();
}

absl::Status AllreduceStore::BrokenStatus() {
  absl::MutexLock lock(&mu_);
  return broken_;
}

absl::Status AllreduceStore::ExecuteGpu(const nego::Action& a,
                                        const std::vector<std::shared_ptr<Op>>& listed) {
  const absl::Time deadline = absl::Now() + options_.op_timeout;
  const NcclComm::Interrupt broken = [this] { return BrokenStatus(); };
  GpuWork work;
  work.deadline = deadline;
  std::vector<NcclComm::Call> calls;
  for (size_t i : a.entries) {
    Op* op = listed[i].get();
    work.ops.push_back(op);
    if (op->in.count == 0) continue;  // every rank skips it: the count was agreed on
    NcclComm::Call c;
    c.broadcast = a.type == nego::Action::Type::kBroadcast;
    c.dtype = a.dtype;
    c.in = op->in.data;
    c.out = op->out.data;
    c.count = op->in.count;
    c.root = op->root;
    calls.push_back(c);
  }
  absl::Status s;
  if (!calls.empty()) {
    if (nccl_ == nullptr) {
      int device;
      {
        absl::MutexLock lock(&mu_);
        device = gpu_device_;  // set: this rank submitted the action's GPU tensors
      }
      auto comm = NcclComm::Create(rank_, num_workers_, device, nccl_id_, deadline, broken);
      if (comm.ok()) {
        nccl_ = std::move(*comm);
        HPS_LOG(INFO) << "NCCL communicator of " << num_workers_ << " ranks on GPU " << device;
      } else {
        s = comm.status();
      }
    }
    if (s.ok()) {
      auto ticket = nccl_->Enqueue(calls, deadline, broken);
      if (ticket.ok()) {
        work.ticket = *ticket;
      } else {
        s = ticket.status();
      }
    }
  }
  if (!s.ok()) {
    for (Op* op : work.ops) Finish(op, s);
    return s;  // the peers' collectives cannot complete: the store breaks
  }
  {
    absl::MutexLock lock(&mu_);
    if (!calls.empty()) ++stats_.nccl_groups;
    stats_.nccl_tensors += work.ops.size();
  }
  gpu_work_.push_back(std::move(work));
  return absl::OkStatus();
}

absl::Status AllreduceStore::FinishGpu(absl::Status failure) {
  if (gpu_work_.empty()) return failure;
  // Work enqueued before a failure might never complete (the peers may be gone).
  if (!failure.ok() && nccl_ != nullptr) nccl_->Abort();
  const NcclComm::Interrupt broken = [this] { return BrokenStatus(); };
  for (GpuWork& w : gpu_work_) {
    absl::Status s = failure;
    if (s.ok() && w.ticket != 0) {
      s = nccl_->WaitFor(w.ticket, w.deadline, broken);
      failure = s;
    }
    for (Op* op : w.ops) Finish(op, s);
  }
  gpu_work_.clear();
  return failure;
}

void AllreduceStore::CloseGpu(bool broken) {
  if (nccl_ == nullptr) return;
  if (broken) {
    nccl_->Abort();
  } else {
    nccl_->Close(absl::Now() + options_.heartbeat_timeout);
  }
  nccl_.reset();
}

}  // namespace hybridps
