// A whole job — scheduler, servers and workers — as threads of the test process, over
// inproc://, ipc:// or tcp:// loopback; for dist_allreduce the workers reach each other
// through Gloo over tcp loopback.
#ifndef HYBRIDPS_TESTS_CLUSTER_LOCAL_CLUSTER_H_
#define HYBRIDPS_TESTS_CLUSTER_LOCAL_CLUSTER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/options.h"
#include "common/transport.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "worker/kvstore.h"
#include "worker/ps/ps_gpu.h"
#include "worker/ps/ps_store.h"

namespace hybridps::testing {

// The parameter-server store of a dist_hybrid worker (a PsStore, or the one a CUDA build's
// PsGpuStore owns); nullptr for other stores.
inline PsStore* PsOf(KVStore* kv) {
  if (auto* ps = dynamic_cast<PsStore*>(kv)) return ps;
  if (auto* gpu = dynamic_cast<PsGpuStore*>(kv)) return gpu->ps();
  return nullptr;
}

// The job token of the test clusters and of RawPeer's handshakes unless a test says.
inline constexpr char kTestJobToken[] = "test-job-token";

struct ClusterConfig {
  // "dist_hybrid", or "dist_allreduce": no servers are started (the scheduler expects
  // none, whatever `servers` says); its Gloo traffic is tcp loopback whatever `transport`.
  std::string backend = "dist_hybrid";
  int workers = 2;
  int servers = 1;
  // Local ranks per node: workers i*local_size .. (i+1)*local_size-1 form node i; with
  // dist_hybrid they reduce in shared memory first, with dist_allreduce a job of one node
  // runs its CPU allreduces in shared memory. `workers` must be a multiple.
  int local_size = 1;
  // Tensors up to this size reduce on the I/O thread, larger ones on the reducer thread.
  size_t local_inline_bytes = Options().local_inline_bytes;
  std::string transport = "inproc";  // inproc | ipc | tcp
  size_t partition_bytes = 4 << 20;
  size_t credit_bytes = Options().credit_bytes;
  size_t wire_chunk_bytes = Options().wire_chunk_bytes;
  size_t server_window_bytes = Options().server_window_bytes;
  absl::Duration server_window_patience = Options().server_window_patience;
  absl::Duration burst_gather = Options().burst_gather;
  // Key placement (Options::deployment, extra_servers) and connections per server.
  std::string deployment = "colocated";
  int extra_servers = 0;
  int max_server_lanes = Options().max_server_lanes;
  int server_threads = 2;
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration heartbeat_timeout = absl::Seconds(2);  // 1 s once flagged a thread stalled by load
  absl::Duration op_timeout = absl::Seconds(30);
  absl::Duration start_timeout = absl::Seconds(20);
  // Inbound messages larger than this are refused by ZeroMQ on every data socket.
  size_t max_message_bytes = Options().max_message_bytes;
  // dist_allreduce: fusion threshold, cycle time, stall warning, and whether threads
  // waiting on a handle run the due rounds themselves.
  size_t fusion_bytes = Options().fusion_bytes;
  size_t fusion_max_tensor_bytes = Options().fusion_max_tensor_bytes;
  absl::Duration cycle_time = Options().cycle_time;
  absl::Duration stall_warning = Options().stall_warning;
  int caller_rounds = Options().caller_rounds;
  // Off unless a test turns it on: the workers of a test cluster are "nodes" of one host,
  // so the probe would time loopback, and the tests that count eager operations would
  // depend on its verdict.
  int eager_probe = 0;
  // Called with each worker's rank and options before it starts (tests of workers whose
  // settings differ); null: all alike.
  std::function<void(int, Options*)> worker_options;
  // Every process's job token (the handshake's key).
  std::string job_token = kTestJobToken;
  int encrypt = 0;  // HYBRIDPS_ENCRYPT
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const ClusterConfig& config);
  // Shuts the workers down, then waits for the servers and the scheduler to end.
  ~LocalCluster();

  KVStore* worker(int i) { return workers_[i].get(); }
  Server* server(int i) { return servers_[i].get(); }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // Runs fn(rank, store) on one thread per worker and joins them.
  void RunOnWorkers(const std::function<void(int, KVStore*)>& fn);
  // Stops server i as if it had crashed (it stops answering and heartbeating).
  void KillServer(int i);
  // Destroys worker i's store (leaving the job in order).
  void CloseWorker(int i) { workers_[i].reset(); }
  const Options& options() const { return options_; }

 private:
  LocalCluster() = default;
  std::shared_ptr<Context> ctx_;
  Options options_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread scheduler_thread_;
  std::shared_ptr<std::atomic<bool>> scheduler_done_ = std::make_shared<std::atomic<bool>>();
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::thread> server_threads_;
  std::vector<std::unique_ptr<KVStore>> workers_;
};

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_LOCAL_CLUSTER_H_
