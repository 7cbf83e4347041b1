// Process sets (Horovod's hvd.add_process_set): a subset of a job's workers that runs
// collectives among themselves while the other workers do something else.
//
//   // every worker of the job, collectively, in the same order:
//   auto evens = *hybridps::CreateProcessSet(*kv, options, {0, 2}, /*id=*/1);
//   if (evens) RETURN_IF_ERROR(evens->PushPull("x", t, t));  // sums over workers 0 and 2
//
// A process set is a dist_allreduce store of its own over its members. Its scheduler runs
// in a thread of its lowest member, which tells the others where it listens through one
// broadcast of the parent store. Its ranks follow the members' parent ranks in order;
// members that are local ranks of one node in the parent are local ranks of one node in
// it (they reduce in shared memory). Every KVStore operation works on it, with the
// failures of a dist_allreduce job: a member that dies fails the set's operations, naming
// it. Shutting the set's store down (or destroying it) leaves the set; on the lowest
// member that call then blocks until the other members left too (up to
// options.op_timeout, after which its scheduler stops), so every member should leave.
#ifndef HYBRIDPS_WORKER_PROCESS_SET_H_
#define HYBRIDPS_WORKER_PROCESS_SET_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/options.h"
#include "worker/kvstore.h"

namespace hybridps {

// Collective over every worker of `parent`, members or not: all pass the same `ranks`
// (parent ranks, in any order, without repeats) and the same `id` (a number of the
// caller's that names the parent tensors the workers exchange, and the set in errors).
// `options`: exactly the ones `parent` was created with (the nodes are grouped by their
// node_id and local_size). Members get the set's store; the others nullptr. Ranks out of
// range, repeated or disagreeing between the workers, and a member that cannot join,
// fail on every worker with an error that names them. Needs a build with Gloo
// (dist_allreduce).
// `refusal`: non-empty when the caller refuses this set on this worker (e.g. it has a
// set of these ranks already); every worker then fails with it, through the same
// exchange, so that none waits for the others.
absl::StatusOr<std::unique_ptr<KVStore>> CreateProcessSet(KVStore& parent,
                                                         const Options& options,
                                                         const std::vector<int>& ranks,
                                                         int id,
                                                         const std::string& refusal = "");

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PROCESS_SET_H_
