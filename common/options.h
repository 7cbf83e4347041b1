// Typed options of every role, with their defaults. The environment is read in exactly
// one place: OptionsFromEnvironment() (options.cc). Nothing else calls getenv.
#ifndef HYBRIDPS_COMMON_OPTIONS_H_
#define HYBRIDPS_COMMON_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hybridps {

enum class Role { kScheduler, kServer, kWorker };
absl::string_view RoleName(Role role);

struct Options {
  // HYBRIDPS_ROLE: scheduler | server | worker.
  Role role = Role::kWorker;
  // HYBRIDPS_SCHEDULER_ADDR / HYBRIDPS_SCHEDULER_PORT. The scheduler binds
  // tcp://<scheduler_addr>:<scheduler_port> (port 0: an ephemeral port, written to
  // port_file). Alternatively HYBRIDPS_SCHEDULER_ENDPOINT gives a full ZeroMQ endpoint
  // (tcp://, ipc:// or inproc://) and overrides both.
  std::string scheduler_addr = "127.0.0.1";
  int scheduler_port = 0;
  std::string scheduler_endpoint;
  // HYBRIDPS_PORT_FILE: where the scheduler writes the port it bound (atomically).
  std::string port_file;
  // HYBRIDPS_NUM_WORKERS / HYBRIDPS_NUM_SERVERS: the job's size.
  int num_workers = 1;
  int num_servers = 1;
  // HYBRIDPS_RANK: the rank (among the workers, or among the servers) this process asks
  // for; -1: assigned by the scheduler in order of registration.
  int rank = -1;
  // mpirun's rank of this process when mpirun started the whole job (-1 otherwise): each
  // process logs it beside its own role and rank, since mpirun names failures by it.
  int mpi_world_rank = -1;
  // HYBRIDPS_LOCAL_RANK / HYBRIDPS_LOCAL_SIZE: position inside the node. When not set,
  // taken from Open MPI (OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE), MPICH/Hydra
  // (MPI_LOCALRANKID / MPI_LOCALNRANKS) or Slurm (SLURM_LOCALID / SLURM_NTASKS_PER_NODE).
  // With local_size > 1 the local ranks of a node reduce in shared memory first and only
  // one push per partition leaves the node.
  int local_rank = 0;
  int local_size = 1;
  // Workers started by mpirun or srun: when a HYBRIDPS_ variable among RANK, NUM_WORKERS,
  // LOCAL_RANK and LOCAL_SIZE is absent it is taken from the launcher's own, first found:
  //   rank        OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID
  //   num_workers OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS
  //   local_rank  OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID
  //   local_size  OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE,
  //               this node's entry of SLURM_TASKS_PER_NODE ("2(x3),1") by SLURM_NODEID
  // HYBRIDPS_DEPLOYMENT: colocated | dedicated | mixed — where the servers run, which
  // decides key placement. colocated and dedicated spread bytes evenly over the servers;
  // mixed (a server on each of the n worker hosts plus HYBRIDPS_EXTRA_SERVERS=k servers
  // on extra hosts, ranks n..n+k-1) gives the k extra servers the BytePS-optimal share
  // 2k(n-1)/(n(n+k)-2k) of the bytes (see partition.h).
  std::string deployment = "colocated";
  int extra_servers = 0;
  // HYBRIDPS_NODE_ID: workers with local_size > 1 that give the same node id form one node
  // (default: the host name). Lets several nodes share one host (tests, benchmarks).
  std::string node_id;
  // HYBRIDPS_LOCAL_SLOTS: tensor partitions a node can reduce locally over the job (one
  // slot of about 512 bytes of shared memory each; the data itself takes local_size + 1
  // copies of each tensor in /dev/shm).
  int local_slots = 16384;
  // HYBRIDPS_BACKEND: dist_hybrid | dist_allreduce.
  std::string backend = "dist_hybrid";
  // HYBRIDPS_INTERFACE: the address servers bind and advertise (an IPv4 address or an
  // interface name). Empty: the scheduler address if it is local, else 0.0.0.0 with the
  // host's name resolved for the address book.
  std::string interface;
  // HYBRIDPS_TRANSPORT: tcp | ipc | inproc — how servers bind their data endpoint.
  std::string transport = "tcp";
  // HYBRIDPS_JOB_TOKEN / HYBRIDPS_JOB_TOKEN_FILE: the job's secret (hybridrun makes a
  // random one per job), or the file (mode 0600, first line) that holds it; one of the two
  // is required. Every connection opens with a handshake in which both sides prove they
  // hold it without sending it (common/auth.h), so a process without it cannot join the
  // job; against someone who can read or alter the traffic, add HYBRIDPS_ENCRYPT=1
  // (docs/security.md).
  std::string job_token;
  // HYBRIDPS_ENCRYPT: 1: every link to the scheduler and the servers is encrypted and
  // authenticated per message (ZeroMQ CURVE, keys bound to the job token; common/auth.h);
  // 0 (default): the links are authenticated at connection (the token handshake) but
  // travel in clear. dist_allreduce's Gloo and NCCL links are never encrypted
  // (docs/security.md). Every process must set it alike: one that differs cannot connect.
  int encrypt = 0;
  // HYBRIDPS_PARTITION_BYTES: a tensor is split into partitions of at most this size.
  size_t partition_bytes = 4 << 20;
  // HYBRIDPS_WIRE_CHUNK_BYTES: a partition travels to its server as requests of at most
  // this size, so its push, sum and pull overlap (0: one request per partition). Small
  // enough that a server's window (below) spans several requests.
  size_t wire_chunk_bytes = 256 << 10;
  // HYBRIDPS_LOCAL_INLINE_BYTES: nodes of several local ranks reduce tensors of at most
  // this many bytes on the worker's I/O thread (no hand-off: lowest latency) and larger
  // ones on a reducer thread (their copies and sums overlap the network). Every local
  // rank of a node must use the same value. Unset, it is 1 MiB, or every tensor when the
  // node has at most one CPU per local rank (kInlineEverything): the reducer thread then
  // has no core to overlap on (docs/design/defaults.md).
  size_t local_inline_bytes = 1 << 20;
  static constexpr size_t kInlineEverything = ~size_t{0};
  // HYBRIDPS_SERVER_THREADS: engine threads of a server (0: one per core, at most 4).
  int server_threads = 0;
  // HYBRIDPS_CREDIT_BYTES: payload bytes a worker has handed to the transport and not yet
  // written out, at most. Small enough that the pushes leave in priority order across all
  // servers (a deep queue per server lets the workers' flows drift apart, and a server
  // cannot answer a round until every worker's push of it arrived), large enough to keep
  // every connection busy.
  size_t credit_bytes = 16 << 20;
  // HYBRIDPS_SERVER_WINDOW_BYTES: payload bytes a worker may have pushed to one server
  // without the answers, per connection to it (max_server_lanes; 0: no window). A server
  // answers a round only when every node's push of it arrived, so bytes a worker sends
  // ahead of the others to one server only take link and queue room from them there; with
  // the window full, the worker sends to its other servers instead (or waits). The window
  // counts, for a partition, the unanswered pushes to its server that come before it in
  // the order every worker shares (priority, then key, then partition): pushes after it
  // that went early do not hold it up, and all unanswered pushes to a server stay within
  // two windows. A partition that comes before all of them is never held, so workers that
  // issue tensors in different orders cannot hold each other up, and a window smaller than
  // a partition still lets one partition per server go at a time. At most 1 TiB. 1 MiB: on
  // shared links fewer bytes queue at a server's link and fewer are lost
  // (docs/design/defaults.md); raise it where a server's link drains much more than that
  // per round trip.
  size_t server_window_bytes = 1 << 20;
  // HYBRIDPS_MAX_SERVER_LANES: TCP connections a worker opens to one server (1..16). A
  // server gets its byte share (partition.h's ServerShare) over the smallest server's
  // share, rounded, connections, at most this many; even placements (colocated,
  // dedicated) use one. TCP divides a congested link between connections, not bytes, so
  // a server that should get more bytes gets more connections. A partition always uses
  // the same connection, so its rounds stay in order. The window above grows with the
  // connections (docs/design/defaults.md).
  int max_server_lanes = 4;
  // A partition held by a window goes anyway once nothing was sent for this long (a
  // safety net: the shared order already rules out waiting on each other). Not read from
  // the environment.
  absl::Duration server_window_patience = absl::Milliseconds(20);
  // HYBRIDPS_SPIN_US: after each burst of activity the worker's I/O thread, the server's
  // loop and a thread waiting on a handle keep polling without sleeping for this long
  // (0: never; at most 10000). It saves the thread wake-ups of small operations, which
  // cost tens of microseconds each on VMs, at the price of busy cores while operations
  // run; meant for hosts with cores to spare.
  absl::Duration spin = absl::ZeroDuration();
  // HYBRIDPS_BURST_GATHER_US: operations submitted less than this apart while earlier
  // ones are still in flight form a burst; the worker gathers the burst (until a gap this
  // long, at most ten times it) before dispatching it, so it leaves in priority order
  // whatever the thread timing, and every worker's first window holds the same
  // partitions (a server answers a round only when every worker's push of it arrived).
  // An operation submitted to an idle store, or after a longer gap, leaves at once.
  // 0: no gathering. Long enough that a briefly descheduled submitter does not split the
  // burst on some workers only (docs/design/defaults.md). The price: while a burst is
  // gathered (10 ms at most) only earlier work is on the link.
  absl::Duration burst_gather = absl::Milliseconds(1);
  // HYBRIDPS_MAX_MESSAGE_BYTES: larger inbound messages are refused by the transport.
  size_t max_message_bytes = size_t{1} << 30;
  // HYBRIDPS_HEARTBEAT_INTERVAL_MS / HYBRIDPS_HEARTBEAT_TIMEOUT_MS: liveness. A peer
  // silent for longer than the timeout is declared dead and everyone is told.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // HYBRIDPS_TIMEOUT_MS: deadline of one operation (a push_pull, a barrier).
  absl::Duration op_timeout = absl::Seconds(120);
  // Slack on top of the moment a store fails an operation at the latest (its op_timeout
  // and what it may take after it to fail it cleanly): Handle::Wait() gives up only then,
  // so that it reports a store whose threads are stuck rather than a loaded machine.
  // Not set from the environment.
  absl::Duration wait_grace = absl::Seconds(30);
  // HYBRIDPS_START_TIMEOUT_MS: how long a process waits for the whole job to register.
  absl::Duration start_timeout = absl::Seconds(60);
  // HYBRIDPS_LOG_LEVEL: 0 errors, 1 warnings, 2 info (default), 3 debug; every process.
  int log_level = 2;
  // dist_allreduce only. HYBRIDPS_FUSION_BYTES: push_pulls smaller than this that are
  // ready in the same cycle are packed (per dtype) into fusion buffers of at most this
  // size and reduced together; 0 turns fusion off. Rank 0's value is used by every worker.
  size_t fusion_bytes = 64 << 20;
  // HYBRIDPS_FUSION_MAX_TENSOR_BYTES (dist_allreduce, CPU tensors): a push_pull larger
  // than this is reduced alone, in place, instead of being copied into a fusion buffer and
  // back. Fusion pays for small tensors, whose allreduces are bound by latency; for a
  // large one the two copies cost more than its own collective's start
  // (docs/design/defaults.md). When every worker is on one host (allreduces in shared
  // memory) 128 KiB at most: a collective there costs a few microseconds. GPU tensors are
  // always fused (device copies are cheap). Rank 0's value (and its fusion_bytes) is used
  // by every worker.
  size_t fusion_max_tensor_bytes = 2 << 20;
  // HYBRIDPS_LOCAL_ALLREDUCE (dist_allreduce, CPU tensors): 1: when every worker of the
  // job is on one host (one node of several local ranks), allreduces run in shared memory
  // (worker/node/shm_allreduce.h) instead of through Gloo's ring over loopback TCP; 0: always
  // Gloo. Rank 0's value is used by every worker.
  int local_allreduce = 1;
  // HYBRIDPS_GPU_LOCAL_REDUCE (dist_hybrid, GPU tensors, nodes of several local ranks):
  // "auto" (default): "nccl" on a node whose every local rank sees at least as many GPUs as
  // the node has local ranks (one GPU each, as with gpu(local_rank)) in a build with NCCL,
  // else "host"; the scheduler decides per node, so a node's ranks always agree. "host":
  // each GPU's tensor is copied to the host and the node's ranks sum in shared memory
  // (worker/ps/local/local_reduce.h). "nccl": the node's GPUs sum each partition with NCCL
  // into the rank that pushes it, and broadcast the result back
  // (worker/ps/local/node_gpu_reduce.h; builds with NCCL; local ranks on one GPU need
  // "host"). Every worker must set it alike.
  std::string gpu_local_reduce = "auto";
  // Not an environment variable: the GPUs this process could reduce on with NCCL, which the
  // GPU store fills in before it registers (0: none, or a build without NCCL), for "auto".
  int nccl_gpus = 0;
  // HYBRIDPS_MXNET_MERGE (the MXNet plugin, a pushpull of one array per device, every one
  // of them off the host, i.e. GPUs): "device" (default): the arrays are summed on one of
  // their devices (chosen per key, spread by bytes as MXNet's CommDevice does), and only
  // that sum goes to the host; "host": each array is copied to the host and summed there
  // (as MXNet's dist_sync does).
  std::string mxnet_merge = "device";
  // HYBRIDPS_HIERARCHICAL_ALLREDUCE (dist_allreduce, CPU tensors, jobs over several nodes
  // with local_allreduce on): 1: each node sums in shared memory, its local rank 0
  // allreduces the node's sum with the other nodes' over Gloo, and the node's ranks copy
  // the result out; 0 (default): one Gloo ring over every worker. Rank 0's value is used.
  int hierarchical_allreduce = 0;
  // HYBRIDPS_EAGER_BYTES (dist_allreduce, CPU tensors): a push_pull of up to this size
  // divided by (workers - 1), or a broadcast, travels inside the negotiation message and
  // is summed from it: no collective after the negotiation. At most 2 MiB; 0: off
  // (docs/design/defaults.md). With 3 workers or more each sends n - 1 copies of the
  // tensor where the allreduce moves 2(n - 1)/n of it: slow links (about 1 Gbit/s) favour
  // 262144 (the allreduce after the negotiation then goes in two direct steps,
  // direct_allreduce_bytes), fast ones this one (docs/performance.md, across hosts);
  // eager_probe chooses between them at the start.
  size_t eager_bytes = 1 << 20;
  // HYBRIDPS_EAGER_PROBE (dist_allreduce, 3 workers or more on several nodes, over Gloo):
  // 1 (default): at the start the workers time, on their own links, tensors of 4 KiB up to
  // eager_bytes / (workers - 1) sent eagerly against the negotiation and the allreduce,
  // and push_pulls go eagerly up to the size at which eager's gains, summed from the
  // smallest size up, peak (a size counts as a gain unless eager took over 1.1x the
  // allreduce; rank 0's timings decide for all; 48 operations per size, going up until
  // eager clearly loses: a fraction of a second on fast links and on 1 Gbit/s ones). 0:
  // eager_bytes as it is. Rank 0's value is used.
  int eager_probe = 1;
  // HYBRIDPS_TWO_SHOT_BYTES (dist_allreduce, 2 workers, CPU tensors): push_pulls larger
  // than the eager ones and up to this size are two-shots: each worker sends the other's
  // half with the negotiation, sums its own half, and the two swap their summed halves —
  // two exchanges where negotiating and running the ring take three. At most 8 MiB; 0:
  // off (the ring after the negotiation). A two-shot runs when both workers sent their
  // halves, else the ring does.
  size_t two_shot_bytes = 0;
  // HYBRIDPS_DIRECT_TWO_SHOT (dist_allreduce, 3 to 8 workers over Gloo, CPU tensors): 1
  // (default): a push_pull that goes directly (direct_allreduce_bytes, larger than the
  // eager ones), is this worker's only such operation in its round and ran alone and
  // directly the last time (a tensor repeated every iteration, not fused with others)
  // sends every other worker its share with the negotiation message, and the workers then
  // only send their summed shares: a two-shot, one step after the negotiation where the
  // direct allreduce takes two. It runs when every worker sent its shares in the same
  // round (else the direct allreduce does). 0: off.
  int direct_two_shot = 1;
  // HYBRIDPS_DIRECT_ALLREDUCE_BYTES (dist_allreduce, CPU tensors over Gloo, 3 workers or
  // more): allreduces up to this size go directly between every pair of workers — each
  // sends every other its share and sums its own, then sends its summed share to every
  // other: two steps where the ring takes 2(n - 1), with the ring's bytes. Larger ones
  // take the ring. 0: always the ring. Rank 0's value is used. Not with more than 8
  // workers; in hierarchical jobs, between 3 to 8 nodes' leaders. Above 1 MiB the ring
  // kept slow links busier (docs/performance.md, across hosts); fast links gain up to
  // 16 MiB.
  size_t direct_allreduce_bytes = 1 << 20;
  // HYBRIDPS_CYCLE_TIME_MS: while operations are pending, workers agree on what to run
  // at most once per cycle (tensors submitted within one cycle can be fused). No cycles
  // run while the job is idle.
  absl::Duration cycle_time = absl::Milliseconds(1);
  // HYBRIDPS_CALLER_ROUNDS: 1: a thread waiting on a handle does the store's work for it
  // itself instead of waking a background thread and waiting to be woken; 0: only the
  // background threads do. dist_allreduce, CPU tensors: the negotiation round and the
  // collective that are due, while no other thread is in one. dist_hybrid, CPU tensors:
  // the worker's I/O (sends, replies), one thread at a time, until the waited-for
  // operation completed, on a worker that is its node's only local rank
  // (worker/ps/ps_store.h). dist_hybrid, GPU tensors: the staging steps (copies to and
  // from the host, hand-over to the CPU path), one thread at a time, until the
  // waited-for operation completed (worker/gpu/gpu_staging.h).
  int caller_rounds = 1;
  // HYBRIDPS_BIND_TO: "core" makes each worker bind itself, every thread it has and
  // starts, to its local rank's share of the cores it may use (floor(cores / local
  // size) whole cores; one hardware thread each with more local ranks than cores), as
  // mpirun --bind-to core binds ranks to cores; hybridrun --bind-to core sets it: small
  // collectives on one host then wait on cores of their own. "none" (default): no binding;
  // keep it when a worker needs more CPUs than its share (MXNet's CPU operators, data
  // loading) or its launcher already binds it.
  std::string bind_to = "none";
  // HYBRIDPS_TIMELINE: a path prefix; each worker and server then records where
  // its operations spend their time and writes PREFIX.worker-0.json, PREFIX.server-1.json,
  // … (Chrome trace events) when it ends. hybridrun --timeline-filename FILE sets it and
  // merges the files into FILE. Empty (default): off.
  std::string timeline;
  // HYBRIDPS_SUMMARY_EVERY_MS: each dist_hybrid server logs one line this often: rounds/s,
  // bytes/s in and out, and whose push was the last of its rounds (the slowest worker).
  // hybridrun --summary-every SECONDS sets it. 0 (default): none.
  absl::Duration summary_every = absl::ZeroDuration();
  // HYBRIDPS_STALL_WARNING_MS: an operation that some workers submitted and others have
  // not for this long is logged, naming the missing ranks (it fails at op_timeout, and
  // the error names them too). dist_allreduce: by the workers' negotiation; dist_hybrid:
  // each server tells the workers waiting in such a round whom it waits for (rank, host,
  // pid), every this long, and a node's local ranks log which of them has not contributed;
  // barriers: the scheduler tells those waiting in one.
  absl::Duration stall_warning = absl::Seconds(60);

  // InvalidArgument naming the field if a value is out of range.
  absl::Status Validate() const;
  // The ZeroMQ endpoint of the scheduler.
  std::string SchedulerEndpoint() const;
  // The largest payload frame a worker sends or a server answers with: a wire chunk, or a
  // whole partition when partitions are smaller or chunks are off.
  size_t LargestDataFrame() const;
  // Room for a data message's header frame and the optimizer's requests, on top of
  // LargestDataFrame(): max_message_bytes must be at least their sum.
  static constexpr size_t kMessageHeadroom = 64 << 10;
};

// Reads every HYBRIDPS_* variable; unknown values or malformed numbers are an error that
// names the variable. Variables not set keep the defaults above. `role`: the role of a
// binary that knows it (hybridps-scheduler, hybridps-server), else HYBRIDPS_ROLE's
// (default worker). Under `mpirun` starting the whole job (one app context per role),
// the role is checked and the rank and counts come from Open MPI's variables.
absl::StatusOr<Options> OptionsFromEnvironment(std::optional<Role> role = std::nullopt);

// " (mpirun rank 4)" when mpirun started the whole job, else "": for the start-up lines.
std::string LauncherNote(const Options& options);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_OPTIONS_H_
