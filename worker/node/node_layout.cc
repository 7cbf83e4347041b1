#include "worker/node/node_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hybridps {

absl::StatusOr<NodeLayout> NodeLayoutFromWelcome(const wire::Welcome& w, int rank) {
  NodeLayout l;
  l.job_id = w.job_id();
  l.num_nodes = w.num_nodes() > 0 ? w.num_nodes() : w.num_workers();
  if (w.workers_size() != w.num_workers() || rank < 0 || rank >= w.workers_size()) {
    return absl::InternalError("the scheduler's welcome does not list every worker");
  }
  const wire::NodeInfo& me = w.workers(rank);
  l.node = w.num_nodes() > 0 ? me.node() : rank;
  l.local_rank = me.local_rank();
  l.local_size = std::max(1, me.local_size());
  l.host = me.host();
  l.gpu_reduce_nccl = me.gpu_reduce_nccl() && l.local_size > 1;
  l.node_of.resize(w.num_workers());
  std::vector<std::string> said;
  std::vector<int> by_local(l.local_size, -1);
  bool ok = true;
  for (int r = 0; r < w.num_workers(); ++r) {
    const wire::NodeInfo& n = w.workers(r);
    l.node_of[r] = w.num_nodes() > 0 ? n.node() : r;
    if (l.node_of[r] != l.node) continue;
    said.push_back(absl::StrCat("worker ", r, " on ", n.host(), " local rank ", n.local_rank(),
                                " of ", n.local_size()));
    if (n.local_size() != l.local_size || n.local_rank() < 0 ||
        n.local_rank() >= l.local_size || by_local[n.local_rank()] >= 0) {
      ok = false;
    } else {
      by_local[n.local_rank()] = r;
    }
  }
  if (!ok || std::count(by_local.begin(), by_local.end(), -1) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", l.node, " (", l.host, ") must have ", l.local_size,
        " workers with local ranks 0..", l.local_size - 1, " but has: ",
        absl::StrJoin(said, "; "),
        " (check HYBRIDPS_LOCAL_RANK, HYBRIDPS_LOCAL_SIZE and HYBRIDPS_NODE_ID)"));
  }
  l.members = by_local;
  for (int r : l.members) l.pids.push_back(w.workers(r).pid());
  return l;
}

CrossPlace CrossPlaceOf(const wire::Welcome& welcome, int rank) {
  CrossPlace c{0, 0};
  if (rank < 0 || rank >= welcome.workers_size()) {
    return CrossPlace{rank, std::max(1, welcome.workers_size())};  // no list: one group
  }
  const int mine = welcome.workers(rank).local_rank();
  for (int r = 0; r < welcome.workers_size(); ++r) {
    if (welcome.workers(r).local_rank() != mine) continue;
    ++c.size;
    if (r < rank) ++c.rank;
  }
  return c;
}

}  // namespace hybridps
