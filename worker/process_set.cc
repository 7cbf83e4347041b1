#include "worker/process_set.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/status.h"
#include "common/transport.h"
#include "scheduler/scheduler.h"
#include "worker/forwarding_store.h"

namespace hybridps {
namespace {

// The set's scheduler, on its lowest member: one thread serving until the members left.
class SetScheduler {
 public:
  static absl::StatusOr<std::unique_ptr<SetScheduler>> Start(const Options& options,
                                                             std::string tag) {
    std::unique_ptr<SetScheduler> s(new SetScheduler());
    s->ctx_ = std::make_unique<Context>();
    ASSIGN_OR_RETURN(s->scheduler_, Scheduler::Create(*s->ctx_, options));
    s->endpoint_ = DialableEndpoint(s->scheduler_->endpoint());
    SetScheduler* self = s.get();
    s->thread_ = std::thread([self, tag = std::move(tag)] {
      pthread_setname_np(pthread_self(), "hps-set-sched");
      ScopedLogTag pin(tag);  // the process keeps its own tag
      absl::Status st = self->scheduler_->Run();
      if (!st.ok() && !self->stopping_.load()) HPS_LOG(WARNING) << st.message();
      self->done_.Notify();
    });
    return s;
  }

  ~SetScheduler() { Finish(absl::ZeroDuration()); }

  const std::string& endpoint() const { return endpoint_; }

  // Waits up to `timeout` for the scheduler to end by itself (every member left), then
  // stops it.
  void Finish(absl::Duration timeout) {
    if (!thread_.joinable()) return;
    if (!done_.WaitForNotificationWithTimeout(timeout)) {
      stopping_.store(true);
      scheduler_->Stop();
    }
    thread_.join();
    scheduler_.reset();  // its socket, before the context
    ctx_.reset();
  }

 private:
  SetScheduler() = default;

  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Scheduler> scheduler_;
  std::string endpoint_;
  std::atomic<bool> stopping_{false};
  absl::Notification done_;
  std::thread thread_;
};

// A member's store of the set: the dist_allreduce store, and on the lowest member the
// set's scheduler, which ends after the store left.
class ProcessSetStore : public ForwardingStore {
 public:
  ProcessSetStore(std::unique_ptr<KVStore> inner, std::unique_ptr<SetScheduler> scheduler,
                  absl::Duration leave_timeout)
      : inner_(std::move(inner)),
        scheduler_(std::move(scheduler)),
        leave_timeout_(leave_timeout) {}
  ~ProcessSetStore() override { (void)Shutdown(); }

  absl::Status Shutdown() override {
    absl::Status s = inner_->Shutdown();
    absl::MutexLock lock(&mu_);
    if (scheduler_) {
      scheduler_->Finish(leave_timeout_);
      scheduler_.reset();
    }
    return s;
  }

 private:
  KVStore& target() const override { return *inner_; }

  std::unique_ptr<KVStore> inner_;
  absl::Mutex mu_;
  std::unique_ptr<SetScheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  const absl::Duration leave_timeout_;
};

// What this worker's `ranks` get wrong ("" when they are distinct ranks of the job).
std::string RanksProblem(const std::vector<int>& ranks, int num_workers) {
  if (ranks.empty()) return "it has no ranks";
  std::vector<bool> seen(num_workers, false);
  for (int r : ranks) {
    if (r < 0 || r >= num_workers) {
      return absl::StrCat("rank ", r, " is not a worker of this job of ", num_workers);
    }
    if (seen[r]) return absl::StrCat("rank ", r, " is given twice");
    seen[r] = true;
  }
  return "";
}

// The parent's grouping of workers into nodes (the scheduler's GroupNodes): the workers
// of one key are local ranks of one node.
int64_t NodeKey(const Options& options, int rank) {
  std::string key;
  if (options.local_size > 1) {
    std::string node = options.node_id;
    if (node.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      node = host;
    }
    key = absl::StrCat("node:", node, "/", options.local_size);
  } else {
    key = absl::StrCat("rank:", rank);
  }
  return static_cast<int64_t>(Fnv1a64(key));
}

// Broadcasts `t` from `root` under hybridps.process_set.<id>.<what>. `owner` holds `t`'s
// memory and lives until the operation completes: one whose wait ran out of time may
// still write to it (kvstore.h).
absl::StatusOr<Handle> BroadcastOwned(KVStore& parent, int id, absl::string_view what,
                                      std::shared_ptr<const void> owner, TensorView t,
                                      int root) {
  ASSIGN_OR_RETURN(Handle h, parent.BroadcastAsync(
                                 absl::StrCat("hybridps.process_set.", id, ".", what), t, root));
  h.HoldUntilDone(std::move(owner));
  return h;
}

// Every worker's `mine` (all of one length), by one broadcast from each worker under
// names hybridps.process_set.<id>.<step>.<rank>.
absl::StatusOr<std::vector<std::vector<int64_t>>> ShareViews(KVStore& parent, int id,
                                                            absl::string_view step,
                                                            std::vector<int64_t> mine) {
  const int n = parent.num_workers();
  auto all = std::make_shared<std::vector<std::vector<int64_t>>>(
      n, std::vector<int64_t>(mine.size(), 0));
  (*all)[parent.rank()] = std::move(mine);
  std::vector<Handle> handles;
  absl::Status status;
  for (int r = 0; r < n && status.ok(); ++r) {
    TensorView t;
    t.data = (*all)[r].data();
    t.count = (*all)[r].size();
    t.dtype = DType::kInt64;
    absl::StatusOr<Handle> h =
        BroadcastOwned(parent, id, absl::StrCat(step, ".", r), all, t, r);
    if (h.ok()) {
      handles.push_back(std::move(*h));
    } else {
      status = h.status();
    }
  }
  for (Handle& h : handles) {
    absl::Status s = h.Wait();
    if (status.ok()) status = s;
  }
  RETURN_IF_ERROR(status);
  return *all;
}

std::string RankList(const std::vector<int64_t>& view) {
  std::vector<int> ranks;
  for (size_t i = 2; i < view.size(); ++i) {
    if (view[i] != 0) ranks.push_back(static_cast<int>(i - 2));
  }
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

// The leader's answer to the members, in a fixed-size broadcast: a status byte, then the
// scheduler's endpoint or the reason it could not start.
constexpr size_t kAnswerBytes = 512;
constexpr uint8_t kAnswerOk = 1;
constexpr uint8_t kAnswerFailed = 2;

}  // namespace

absl::StatusOr<std::unique_ptr<KVStore>> CreateProcessSet(KVStore& parent,
                                                         const Options& options,
                                                         const std::vector<int>& ranks,
                                                         int id, const std::string& refusal) {
  const int n = parent.num_workers();
  const int me = parent.rank();
  const std::string problem = refusal.empty() ? RanksProblem(ranks, n) : refusal;
  // This worker's view: [its node key, whether it refuses the set, one flag per rank].
  std::vector<int64_t> mine(2 + n, 0);
  mine[0] = NodeKey(options, me);
  mine[1] = problem.empty() ? 0 : 1;
  if (problem.empty()) {
    for (int r : ranks) mine[2 + r] = 1;
  }
  ASSIGN_OR_RETURN(auto views, ShareViews(parent, id, "worker", std::move(mine)));

  const std::string what = absl::StrCat("process set ", id);
  std::vector<int> wrong;
  for (int r = 0; r < n; ++r) {
    if (views[r][1] != 0) wrong.push_back(r);
  }
  if (!wrong.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", problem.empty() ? "" : absl::StrCat("refused on this worker: ", problem,
                                                         "; "),
        "worker", wrong.size() > 1 ? "s " : " ", absl::StrJoin(wrong, ", "),
        " refused it (ranks that are not distinct workers of this job of ", n,
        ", or a set that exists already)"));
  }
  for (int r = 1; r < n; ++r) {
    if (!std::equal(views[r].begin() + 2, views[r].end(), views[0].begin() + 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the workers disagree on its ranks: worker 0 gave ", RankList(views[0]),
          ", worker ", r, " gave ", RankList(views[r]),
          "; every worker of the job must add the same process sets in the same order"));
    }
  }
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (views[0][2 + r] != 0) members.push_back(r);
  }
  const int leader = members.front();
  const auto it = std::find(members.begin(), members.end(), me);
  const bool member = it != members.end();

  Options sub = options;
  sub.num_workers = static_cast<int>(members.size());
  sub.num_servers = 0;
  sub.extra_servers = 0;
  sub.backend = "dist_allreduce";
  sub.deployment = "colocated";
  sub.rank = member ? static_cast<int>(it - members.begin()) : -1;
  sub.local_rank = 0;
  sub.local_size = 0;
  for (int r : members) {
    if (views[r][0] != views[me][0]) continue;
    if (r < me) ++sub.local_rank;
    ++sub.local_size;
  }
  sub.local_size = std::max(1, sub.local_size);
  if (sub.local_size == 1) sub.local_rank = 0;
  sub.mpi_world_rank = -1;
  sub.port_file.clear();
  sub.timeline.clear();
  sub.bind_to = "none";  // the job's store bound the process already

  // The tag of the lines about this set: the process's, and the set.
  const std::string tag = LogTag();
  const std::string set_tag = absl::StrCat(tag, tag.empty() ? "" : " ", what);
  std::unique_ptr<SetScheduler> scheduler;
  auto answer = std::make_shared<std::vector<uint8_t>>(kAnswerBytes, 0);
  if (me == leader) {
    Options sched = sub;
    sched.role = Role::kScheduler;
    sched.rank = -1;
    sched.scheduler_endpoint = PeerBindEndpoint(options.interface, options.SchedulerEndpoint());
    absl::StatusOr<std::unique_ptr<SetScheduler>> started =
        SetScheduler::Start(sched, absl::StrCat(set_tag, " scheduler"));
    std::string text;
    if (started.ok()) {
      scheduler = std::move(*started);
      (*answer)[0] = kAnswerOk;
      text = scheduler->endpoint();
    } else {
      (*answer)[0] = kAnswerFailed;
      text = std::string(started.status().message());
    }
    std::memcpy(answer->data() + 1, text.data(), std::min(text.size(), kAnswerBytes - 2));
  }
  {
    TensorView t;
    t.data = answer->data();
    t.count = answer->size();
    t.dtype = DType::kUInt8;
    ASSIGN_OR_RETURN(Handle h, BroadcastOwned(parent, id, "scheduler", answer, t, leader));
    RETURN_IF_ERROR(h.Wait());
  }
  // The members join the set's job; then every worker learns which members could, so
  // that either all of them have the set or none does.
  absl::StatusOr<std::unique_ptr<KVStore>> store = std::unique_ptr<KVStore>();
  if (member) {
    const std::string text(reinterpret_cast<const char*>(answer->data() + 1));
    if ((*answer)[0] != kAnswerOk) {
      store = absl::UnavailableError(
          absl::StrCat("its scheduler on worker ", leader, " could not start: ", text));
    } else {
      sub.scheduler_endpoint = text;
      // The set's store does not rename the process's lines; its own joining ones say
      // which set they are about.
      ScopedLogTag pin(set_tag);
      store = KVStore::Create("dist_allreduce", sub);
    }
  }
  ASSIGN_OR_RETURN(auto joined, ShareViews(parent, id, "joined", {store.ok() ? 0 : 1}));
  std::vector<int> failed;
  for (int r = 0; r < n; ++r) {
    if (joined[r][0] != 0) failed.push_back(r);
  }
  if (!failed.empty()) {
    if (store.ok() && *store) (void)(*store)->Shutdown();
    if (scheduler) scheduler->Finish(options.heartbeat_timeout);
    return absl::UnavailableError(absl::StrCat(
        what, ": ", store.ok() ? "" : absl::StrCat(store.status().message(), "; "),
        "worker", failed.size() > 1 ? "s " : " ", absl::StrJoin(failed, ", "),
        " could not join it"));
  }
  if (!member) return std::unique_ptr<KVStore>();
  return std::unique_ptr<KVStore>(
      new ProcessSetStore(std::move(*store), std::move(scheduler), options.op_timeout));
}

}  // namespace hybridps
