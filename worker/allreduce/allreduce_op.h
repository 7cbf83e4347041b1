// The dist_allreduce store's operation record, shared by its two source files
// (allreduce_store.cc: submission, the I/O thread; allreduce_executor.cc: the executor).
// Internal to worker/.
#ifndef HYBRIDPS_WORKER_ALLREDUCE_ALLREDUCE_OP_H_
#define HYBRIDPS_WORKER_ALLREDUCE_ALLREDUCE_OP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "worker/allreduce/allreduce_store.h"

namespace hybridps {

struct AllreduceStore::Op {
  std::string name;
  negotiation::OpKind kind = negotiation::OpKind::kPushPull;
  TensorView in, out;
  int root = -1;
  int priority = 0;
  uint32_t occurrence = 0;
  uint64_t seq = 0;
  absl::Time submitted, deadline, next_warning;
  // Round holder only: per rank, whether it ever listed this operation in a round (the
  // deadline error names those that never did).
  std::vector<bool> seen;
  int rounds_listed = 0;  // round holder only
  bool in_round = false;  // guarded by mu_: a round is running it; Break leaves it
  // The operation's handle, within it: Submit gives the user a Handle that shares the
  // Op, so that an operation is one allocation.
  HandleState state;
  HandleState* const handle = &state;

  std::string Describe() const {
    return absl::StrCat(negotiation::OpKindName(kind), " of '", name, "' (", in.count, " ",
                        DTypeName(in.dtype), " elements",
                        in.device == Device::kGPU ? absl::StrCat(" on GPU ", in.device_id) : "",
                        ")");
  }
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_ALLREDUCE_ALLREDUCE_OP_H_
