#include "tests/cluster/local_cluster.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace hybridps::testing {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const ClusterConfig& c) {
  static std::atomic<int> counter{0};
  std::unique_ptr<LocalCluster> cl(new LocalCluster());
  cl->ctx_ = std::make_shared<Context>();
  Options& o = cl->options_;
  const bool allreduce = c.backend == "dist_allreduce";
  o.backend = c.backend;
  o.num_workers = c.workers;
  o.num_servers = allreduce ? 0 : c.servers;
  o.transport = c.transport;
  o.partition_bytes = c.partition_bytes;
  o.local_inline_bytes = c.local_inline_bytes;
  o.credit_bytes = c.credit_bytes;
  o.wire_chunk_bytes = c.wire_chunk_bytes;
  o.server_window_bytes = c.server_window_bytes;
  o.server_window_patience = c.server_window_patience;
  o.burst_gather = c.burst_gather;
  o.deployment = c.deployment;
  o.extra_servers = c.extra_servers;
  o.max_server_lanes = c.max_server_lanes;
  o.server_threads = c.server_threads;
  o.heartbeat_interval = c.heartbeat_interval;
  o.heartbeat_timeout = c.heartbeat_timeout;
  o.op_timeout = c.op_timeout;
  o.start_timeout = c.start_timeout;
  o.max_message_bytes = c.max_message_bytes;
  o.fusion_bytes = c.fusion_bytes;
  o.fusion_max_tensor_bytes = c.fusion_max_tensor_bytes;
  o.caller_rounds = c.caller_rounds;
  o.eager_probe = c.eager_probe;
  o.cycle_time = c.cycle_time;
  o.stall_warning = c.stall_warning;
  o.log_level = 1;
  o.job_token = c.job_token;
  o.encrypt = c.encrypt;
  const int id = counter++;
  if (c.transport == "inproc") {
    o.scheduler_endpoint = absl::StrCat("inproc://scheduler-", id);
  } else if (c.transport == "ipc") {
    o.scheduler_endpoint = absl::StrCat("ipc://@hybridps-test-", getpid(), "-", id);
  } else {
    o.scheduler_endpoint = "tcp://127.0.0.1:0";
  }
  Options so = o;
  so.role = Role::kScheduler;
  ASSIGN_OR_RETURN(cl->scheduler_, Scheduler::Create(*cl->ctx_, so));
  o.scheduler_endpoint = cl->scheduler_->endpoint();
  Scheduler* sched = cl->scheduler_.get();
  cl->scheduler_thread_ = std::thread([sched, done = cl->scheduler_done_] {
    (void)sched->Run();
    done->store(true);
  });
  for (int i = 0; i < o.num_servers; ++i) {
    Options sv = o;
    sv.role = Role::kServer;
    ASSIGN_OR_RETURN(auto server, Server::Create(*cl->ctx_, sv));
    Server* raw = server.get();
    cl->servers_.push_back(std::move(server));
    cl->server_threads_.emplace_back([raw] { (void)raw->Run(); });
  }
  cl->workers_.resize(c.workers);
  std::vector<absl::Status> status(c.workers);
  std::vector<std::thread> threads;
  for (int i = 0; i < c.workers; ++i) {
    threads.emplace_back([&, i] {
      Options wo = o;
      wo.role = Role::kWorker;
      wo.rank = i;
      wo.local_size = c.local_size;
      wo.local_rank = i % c.local_size;
      wo.node_id = absl::StrCat("node", i / c.local_size);
      if (c.worker_options) c.worker_options(i, &wo);
      auto store = KVStore::Create(c.backend, wo, cl->ctx_);
      if (store.ok()) {
        cl->workers_[i] = std::move(*store);
      } else {
        status[i] = store.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& s : status) RETURN_IF_ERROR(s);
  return cl;
}

LocalCluster::~LocalCluster() {
  std::vector<std::thread> threads;
  for (auto& w : workers_) {
    threads.emplace_back([&w] { w.reset(); });
  }
  for (auto& t : threads) t.join();
  // With every worker gone the scheduler shuts the servers down (after declaring dead any
  // worker that left without finalising); Stop() bounds it anyway.
  const absl::Time deadline = absl::Now() + 3 * options_.heartbeat_timeout;
  while (!scheduler_done_->load() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  scheduler_->Stop();
  scheduler_thread_.join();
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (server_threads_[i].joinable()) {
      servers_[i]->Stop();
      server_threads_[i].join();
    }
  }
  servers_.clear();
  scheduler_.reset();
}

void LocalCluster::RunOnWorkers(const std::function<void(int, KVStore*)>& fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < num_workers(); ++i) {
    threads.emplace_back([&, i] { fn(i, workers_[i].get()); });
  }
  for (auto& t : threads) t.join();
}

void LocalCluster::KillServer(int i) {
  servers_[i]->Stop();
  server_threads_[i].join();
}

}  // namespace hybridps::testing
