// A host-memory stand-in for NCCL among a node's local ranks (NodeCollectives of
// worker/ps/local/node_gpu_reduce.h), for tests without a GPU: the collectives run over a
// shared-memory segment of the node's own (ShmAllreduce). As with NCCL, a non-root rank's
// reduce output is left undefined (here: garbage), so that a missing broadcast shows.
// Used by node_gpu_reduce_test.cc and the conformance suite.
#ifndef HYBRIDPS_TESTS_CLUSTER_HOST_COLLECTIVES_H_
#define HYBRIDPS_TESTS_CLUSTER_HOST_COLLECTIVES_H_

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "worker/ps/local/local_reduce.h"
#include "worker/ps/local/node_gpu_reduce.h"
#include "worker/node/shm_allreduce.h"

namespace hybridps::testing {

// NodeCollectives over a shared-memory segment of the node's own.
class HostCollectives : public NodeCollectives {
 public:
  struct Faults {
    int fail_reduce = -1;  // the n-th Reduce (0-based) fails at this rank
  };
  HostCollectives(ShmAllreduce* exchange, std::string name, Faults faults)
      : local_rank_(exchange->local_rank()), local_size_(exchange->local_size()),
        name_(std::move(name)), faults_(faults) {}

  absl::Status Open(int device, absl::Time deadline) override {
    device_ = device;
    auto s = ShmAllreduce::Open(name_, local_rank_, local_size_, 64 << 10, deadline);
    if (!s.ok()) return s.status();
    shm_ = std::move(*s);
    absl::MutexLock lock(&mu_);
    opened_ = shm_.get();
    return absl::OkStatus();
  }
  absl::Status Reduce(const std::vector<NodeTensor>& tensors, absl::Time deadline) override {
    if (reduces_++ == faults_.fail_reduce) {
      return absl::InternalError("ncclReduce failed: unhandled cuda error (NCCL error 1)");
    }
    for (const NodeTensor& t : tensors) {
      const size_t es = DTypeSize(t.dtype);
      for (const NodePart& p : *t.parts) {
        std::vector<char> sum(p.count * es + 1);
        RETURN_IF_ERROR(shm_->Allreduce(t.dtype, static_cast<const char*>(t.in) + p.offset * es,
                                        sum.data(), p.count, deadline - absl::Now()));
        char* dst = static_cast<char*>(t.out) + p.offset * es;
        if (p.pusher == local_rank_) {
          std::memcpy(dst, sum.data(), p.count * es);
        } else {
          std::memset(dst, 0x7b, p.count * es);  // undefined at non-roots
        }
      }
    }
    return absl::OkStatus();
  }
  absl::Status Broadcast(const std::vector<NodeTensor>& tensors,
                         absl::Time deadline) override {
    for (const NodeTensor& t : tensors) {
      const size_t es = DTypeSize(t.dtype);
      for (const NodePart& p : *t.parts) {
        RETURN_IF_ERROR(shm_->Broadcast(t.dtype, static_cast<char*>(t.out) + p.offset * es,
                                        p.count, p.pusher, deadline - absl::Now()));
      }
    }
    return absl::OkStatus();
  }
  void Abort(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);  // any thread (the store's, when it breaks)
    if (opened_ != nullptr) opened_->Abort(why);
  }
  int device() const { return device_; }

 private:
  int local_rank_, local_size_;
  std::string name_;
  Faults faults_;
  int reduces_ = 0;
  int device_ = -1;
  std::unique_ptr<ShmAllreduce> shm_;  // the reducer's thread
  absl::Mutex mu_;
  ShmAllreduce* opened_ ABSL_GUARDED_BY(mu_) = nullptr;  // shm_, for Abort
};

// The stand-in for a node: one segment per job and node (what MakeCollectives gets).
inline std::unique_ptr<NodeCollectives> MakeHostCollectives(
    ShmAllreduce* exchange, const NodeLayout& layout, HostCollectives::Faults faults = {}) {
  return std::make_unique<HostCollectives>(
      exchange, absl::StrCat("/hps-t-nc-", getpid(), "-", layout.job_id, "-n", layout.node),
      faults);
}

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_HOST_COLLECTIVES_H_
