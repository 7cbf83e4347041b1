#include "common/options.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/partition.h"
#include "common/status.h"

namespace hybridps {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kScheduler:
      return "scheduler";
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

absl::Status Options::Validate() const {
  auto bad = [](absl::string_view what, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, absl::Duration>) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid option ", what, "=", absl::FormatDuration(v)));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("invalid option ", what, "=", v));
    }
  };
  if (job_token.empty() && !absl::StartsWith(SchedulerEndpoint(), "inproc://")) {
    return absl::InvalidArgumentError(
        "no job token (HYBRIDPS_JOB_TOKEN, Options::job_token): a job that listens on the "
        "network needs a secret that every one of its processes holds");
  }
  if (num_workers < 1) return bad("num_workers", num_workers);
  if (num_servers < 0) return bad("num_servers", num_servers);
  if (backend != "dist_hybrid" && backend != "dist_allreduce") return bad("backend", backend);
  if (backend == "dist_hybrid" && num_servers < 1) {
    return absl::InvalidArgumentError("dist_hybrid needs at least one server (num_servers=0)");
  }
  if (rank >= (role == Role::kServer ? num_servers : num_workers)) return bad("rank", rank);
  if (local_size < 1) return bad("local_size", local_size);
  if (local_rank < 0 || local_rank >= local_size) return bad("local_rank", local_rank);
  if (local_size > 64) return bad("local_size (at most 64)", local_size);
  if (local_slots < 1 || local_slots > (1 << 22)) return bad("local_slots", local_slots);
  if (scheduler_port < 0 || scheduler_port > 65535) return bad("scheduler_port", scheduler_port);
  if (partition_bytes < 8) return bad("partition_bytes", partition_bytes);
  if (wire_chunk_bytes != 0 && wire_chunk_bytes < 8) {
    return bad("wire_chunk_bytes (0 or at least 8)", wire_chunk_bytes);
  }
  if (role != Role::kScheduler && max_message_bytes < LargestDataFrame() + kMessageHeadroom) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid option max_message_bytes=", max_message_bytes, ": data messages carry up to ",
        LargestDataFrame(), " bytes (wire_chunk_bytes=", wire_chunk_bytes,
        ", partition_bytes=", partition_bytes, ") plus headers; it must be at least ",
        LargestDataFrame() + kMessageHeadroom));
  }
  if (server_threads < 0 || server_threads > 256) return bad("server_threads", server_threads);
  if (credit_bytes < 1) return bad("credit_bytes", credit_bytes);
  if (max_server_lanes < 1 || max_server_lanes > 16) {
    return bad("max_server_lanes (1..16)", max_server_lanes);
  }
  // Per connection; a worker multiplies it by its lanes, and the window doubles it.
  if (server_window_bytes > (size_t{1} << 40)) {
    return bad("server_window_bytes (at most 1 TiB)", server_window_bytes);
  }
  if (server_window_patience <= absl::ZeroDuration()) {
    return bad("server_window_patience", server_window_patience);
  }
  if (transport != "tcp" && transport != "ipc" && transport != "inproc") {
    return bad("transport", transport);
  }
  if (heartbeat_interval <= absl::ZeroDuration()) {
    return bad("heartbeat_interval_ms", heartbeat_interval);
  }
  if (heartbeat_timeout <= heartbeat_interval) {
    return absl::InvalidArgumentError(
        "heartbeat_timeout_ms must be larger than heartbeat_interval_ms");
  }
  if (op_timeout <= absl::ZeroDuration()) return bad("timeout_ms", op_timeout);
  if (wait_grace < absl::ZeroDuration()) return bad("wait_grace", wait_grace);
  if (start_timeout <= absl::ZeroDuration()) return bad("start_timeout_ms", start_timeout);
  if (cycle_time < absl::ZeroDuration() || cycle_time > absl::Seconds(10)) {
    return bad("cycle_time_ms", cycle_time);
  }
  if (stall_warning <= absl::ZeroDuration()) return bad("stall_warning_ms", stall_warning);
  if (caller_rounds != 0 && caller_rounds != 1) return bad("caller_rounds", caller_rounds);
  if (bind_to != "none" && bind_to != "core") return bad("bind_to", bind_to);
  if (eager_bytes > (2 << 20)) return bad("eager_bytes", eager_bytes);
  if (eager_probe != 0 && eager_probe != 1) return bad("eager_probe", eager_probe);
  if (encrypt != 0 && encrypt != 1) return bad("encrypt", encrypt);
  if (local_allreduce != 0 && local_allreduce != 1) {
    return bad("local_allreduce", local_allreduce);
  }
  if (hierarchical_allreduce != 0 && hierarchical_allreduce != 1) {
    return bad("hierarchical_allreduce", hierarchical_allreduce);
  }
  if (two_shot_bytes > (8 << 20)) return bad("two_shot_bytes", two_shot_bytes);
  if (direct_two_shot != 0 && direct_two_shot != 1) {
    return bad("direct_two_shot", direct_two_shot);
  }
  if (spin < absl::ZeroDuration() || spin > absl::Milliseconds(10)) return bad("spin_us", spin);
  if (gpu_local_reduce != "auto" && gpu_local_reduce != "host" && gpu_local_reduce != "nccl") {
    return bad("gpu_local_reduce", gpu_local_reduce);
  }
  if (mxnet_merge != "device" && mxnet_merge != "host") return bad("mxnet_merge", mxnet_merge);
  if (deployment != "colocated" && deployment != "dedicated" && deployment != "mixed") {
    return bad("deployment", deployment);
  }
  if (deployment == "mixed" && backend == "dist_hybrid" &&
      (extra_servers < 1 || extra_servers >= num_servers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "deployment=mixed needs 1 <= extra_servers < num_servers (a server on every worker "
        "host plus the extra ones); got extra_servers=", extra_servers,
        ", num_servers=", num_servers));
  }
  if (deployment != "mixed" && extra_servers != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extra_servers=", extra_servers, " needs deployment=mixed, not ", deployment));
  }
  return absl::OkStatus();
}

size_t Options::LargestDataFrame() const {
  // Partitions are nearly equal pieces of at most partition_bytes, give or take an element.
  const size_t partition = partition_bytes + 8;
  return wire_chunk_bytes == 0 ? partition : std::min(partition, wire_chunk_bytes);
}

std::string Options::SchedulerEndpoint() const {
  if (!scheduler_endpoint.empty()) return scheduler_endpoint;
  return absl::StrCat("tcp://", scheduler_addr, ":", scheduler_port);
}

namespace {

std::optional<std::string> Get(const char* name) {
  const char* v = std::getenv(name);  // The one place hybridps reads the environment.
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

template <typename T>
absl::Status GetNumber(const char* name, T* out) {
  auto v = Get(name);
  if (!v) return absl::OkStatus();
  int64_t x;
  if (!absl::SimpleAtoi(*v, &x) || x < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", *v, "' is not a non-negative integer"));
  }
  *out = static_cast<T>(x);
  return absl::OkStatus();
}

// The first of `names` that is set, parsed like GetNumber; `source` gets its name.
template <typename T>
absl::Status GetFirstNumber(std::initializer_list<const char*> names, T* out,
                            std::string* source = nullptr) {
  for (const char* name : names) {
    if (!Get(name)) continue;
    RETURN_IF_ERROR(GetNumber(name, out));
    if (source != nullptr) *source = name;
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": two tasks on each of 3 nodes, then one) at
// node `node`; 0 when malformed or out of range.
int SlurmTasksOnNode(absl::string_view spec, int node) {
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int tasks = 0, repeat = 1;
    const size_t paren = part.find("(x");
    if (!absl::SimpleAtoi(part.substr(0, paren), &tasks)) return 0;
    if (paren != absl::string_view::npos) {
      absl::string_view count = part.substr(paren + 2);
      if (!absl::ConsumeSuffix(&count, ")") || !absl::SimpleAtoi(count, &repeat)) return 0;
    }
    if (node < repeat) return tasks;
    node -= repeat;
  }
  return 0;
}

absl::Status GetMillis(const char* name, absl::Duration* out) {
  int64_t ms = -1;
  RETURN_IF_ERROR(GetNumber(name, &ms));
  if (ms >= 0) *out = absl::Milliseconds(ms);
  return absl::OkStatus();
}

absl::Status GetMicros(const char* name, absl::Duration* out) {
  int64_t us = -1;
  RETURN_IF_ERROR(GetNumber(name, &us));
  if (us >= 0) *out = absl::Microseconds(us);
  return absl::OkStatus();
}

// HYBRIDPS_JOB_TOKEN, or the first line of the file HYBRIDPS_JOB_TOKEN_FILE names, which
// only its owner may read (as ssh asks of a private key); one of them is required.
absl::Status ReadJobToken(std::string* token) {
  const auto direct = Get("HYBRIDPS_JOB_TOKEN");
  const auto file = Get("HYBRIDPS_JOB_TOKEN_FILE");
  if (direct && file) {
    return absl::InvalidArgumentError(
        "both HYBRIDPS_JOB_TOKEN and HYBRIDPS_JOB_TOKEN_FILE are set: set one of them");
  }
  if (direct) {
    *token = *direct;
    return absl::OkStatus();
  }
  if (!file && !Get("HYBRIDPS_SCHEDULER_PORT") && !Get("HYBRIDPS_SCHEDULER_ENDPOINT")) {
    return absl::InvalidArgumentError(
        "no hybridps job in this process's environment (HYBRIDPS_SCHEDULER_PORT and "
        "HYBRIDPS_JOB_TOKEN are not set): start it through the launcher, scripts/hybridrun "
        "-np N [--servers M] -- your program, or set the job's variables by hand "
        "(docs/deployment.md)");
  }
  if (!file) {
    return absl::InvalidArgumentError(
        "no job token: set HYBRIDPS_JOB_TOKEN (e.g. export HYBRIDPS_JOB_TOKEN=$(openssl rand "
        "-hex 16)) or HYBRIDPS_JOB_TOKEN_FILE (a file only you can read) to the same secret "
        "in every process of the job; hybridrun makes one for its jobs. Only processes that "
        "hold it can join the job");
  }
  struct stat st;
  if (stat(file->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HYBRIDPS_JOB_TOKEN_FILE=", *file, ": no such file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "HYBRIDPS_JOB_TOKEN_FILE=%s: others can read it (mode %04o): chmod 600 it", *file,
        st.st_mode & 07777));
  }
  std::ifstream in(*file);
  std::string line;
  std::getline(in, line);
  line = std::string(absl::StripAsciiWhitespace(line));
  if (line.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("HYBRIDPS_JOB_TOKEN_FILE=", *file, ": the file holds no token"));
  }
  *token = line;
  return absl::OkStatus();
}

// Open MPI's MPMD launch of a whole job, one app context per role, in this order:
//   mpirun -np 1 hybridps-scheduler : -np S hybridps-server : -np W PROGRAM   (dist_hybrid)
//   mpirun -np 1 hybridps-scheduler : -np W PROGRAM                           (dist_allreduce)
// Open MPI numbers the processes app context by app context, so a process's rank in its
// role is its world rank less the sizes of the contexts before its own.
struct MpmdPlace {
  std::vector<int> apps;  // processes per app context (OMPI_APP_CTX_NUM_PROCS)
  int app = 0;            // this process's (OMPI_MCA_orte_app_num)
  int first = 0;          // the world rank of its context's first process
  int world_rank = 0;     // OMPI_COMM_WORLD_RANK
};

// Set when mpirun started this process as one of several app contexts, unless
// HYBRIDPS_ROLE is set (workers-only launches of several contexts, e.g. one per GPU).
absl::StatusOr<std::optional<MpmdPlace>> MpmdPlaceFromEnvironment() {
  auto apps = Get("OMPI_APP_CTX_NUM_PROCS");
  if (!apps || Get("HYBRIDPS_ROLE") || !Get("OMPI_COMM_WORLD_RANK")) return std::nullopt;
  MpmdPlace place;
  for (absl::string_view n : absl::StrSplit(*apps, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    int count = 0;
    if (!absl::SimpleAtoi(n, &count) || count < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable OMPI_APP_CTX_NUM_PROCS='", *apps, "' is not a list of counts"));
    }
    place.apps.push_back(count);
  }
  if (place.apps.size() < 2) return std::nullopt;  // one context: mpirun starts workers only
  RETURN_IF_ERROR(GetNumber("OMPI_COMM_WORLD_RANK", &place.world_rank));
  // The context holding the world rank (Open MPI 4 also says it: OMPI_MCA_orte_app_num).
  place.app = -1;
  for (size_t i = 0; i < place.apps.size(); ++i) {
    if (place.world_rank < place.first + place.apps[i]) {
      place.app = static_cast<int>(i);
      break;
    }
    place.first += place.apps[i];
  }
  int said = place.app;
  RETURN_IF_ERROR(GetNumber("OMPI_MCA_orte_app_num", &said));
  if (place.app < 0 || said != place.app) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OMPI_COMM_WORLD_RANK=", place.world_rank, " is not in app context ", said,
        " of OMPI_APP_CTX_NUM_PROCS='", *apps, "' (numbered context by context)"));
  }
  return place;
}

// The role, rank and counts of an MPMD job from `place`; a HYBRIDPS_* variable that is
// set must agree with what mpirun says.
absl::Status ApplyMpmd(const MpmdPlace& place, Options* o) {
  const int n = static_cast<int>(place.apps.size());
  const std::string layout = absl::StrJoin(place.apps, " : ");
  const std::string order =
      "hybridps takes mpirun's app contexts as `-np 1 hybridps-scheduler : -np S "
      "hybridps-server : -np W PROGRAM` (dist_hybrid) or `-np 1 hybridps-scheduler : -np W "
      "PROGRAM` (dist_allreduce)";
  if (n > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpirun started ", n, " app contexts (", layout, " processes); ", order));
  }
  if (place.apps[0] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpirun's first app context has ", place.apps[0], " processes (", layout,
        "); it is the scheduler's and takes one (-np 1): ", order));
  }
  const int worker_app = n - 1;
  const Role role = place.app == 0 ? Role::kScheduler
                    : place.app == worker_app ? Role::kWorker
                                              : Role::kServer;
  if (role != o->role) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this ", RoleName(o->role), " is in mpirun's app context ", place.app, " of ", n,
        " (", layout, " processes), the ", RoleName(role), "s' place: ", order,
        " (for workers alone in several contexts, set HYBRIDPS_ROLE=worker)"));
  }
  const int num_servers = n == 3 ? place.apps[1] : 0;
  const int num_workers = place.apps[worker_app];
  auto agree = [&](const char* name, int* field, int value) -> absl::Status {
    if (Get(name) && *field != value) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "=", *field, " but mpirun's app contexts (", layout, " processes) make it ",
          value, ": leave it unset, or make the -np of the contexts match it"));
    }
    *field = value;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(agree("HYBRIDPS_NUM_WORKERS", &o->num_workers, num_workers));
  RETURN_IF_ERROR(agree("HYBRIDPS_NUM_SERVERS", &o->num_servers, num_servers));
  if (role != Role::kScheduler) {
    RETURN_IF_ERROR(agree("HYBRIDPS_RANK", &o->rank, place.world_rank - place.first));
  }
  o->mpi_world_rank = place.world_rank;
  if (!Get("HYBRIDPS_BACKEND")) {
    o->backend = num_servers > 0 ? "dist_hybrid" : "dist_allreduce";
  } else if ((o->backend == "dist_hybrid") != (num_servers > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HYBRIDPS_BACKEND=", o->backend, " but mpirun's app contexts (", layout,
        " processes) start ", num_servers, " servers: ", order));
  }
  if (o->scheduler_port == 0) {
    return absl::InvalidArgumentError(
        "started by mpirun as part of a whole job, but HYBRIDPS_SCHEDULER_PORT is not set: "
        "every process needs the scheduler's port (mpirun -x HYBRIDPS_SCHEDULER_PORT=9000 "
        "-x HYBRIDPS_SCHEDULER_ADDR=<the first host> -x HYBRIDPS_JOB_TOKEN ...)");
  }
  return absl::OkStatus();
}

// A worker whose rank comes from its launcher (mpirun, srun) must be one of as many
// workers as the job has: HYBRIDPS_NUM_WORKERS, which the scheduler reads too, and the
// launcher's count must agree.
absl::Status CheckLauncherCount(const Options& o, absl::string_view rank_source,
                                absl::string_view count_source) {
  static constexpr std::pair<const char*, const char*> kPairs[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMI_RANK", "PMI_SIZE"},
      {"SLURM_PROCID", "SLURM_NTASKS"}};
  if (count_source != "HYBRIDPS_NUM_WORKERS") return absl::OkStatus();
  for (const auto& [rank_var, size_var] : kPairs) {
    if (rank_source != rank_var) continue;
    int launched = 0;
    RETURN_IF_ERROR(GetNumber(size_var, &launched));
    if (Get(size_var) && launched != o.num_workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HYBRIDPS_NUM_WORKERS=", o.num_workers, " (the job's worker count, which the "
          "scheduler and the servers read too) but ", size_var, "=", launched,
          " (the workers the launcher started; this one is ", rank_var, "=", o.rank,
          "): set HYBRIDPS_NUM_WORKERS=", launched, " for the scheduler, the servers and the "
          "workers, or let mpirun start the whole job (docs/deployment.md, mpirun)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string LauncherNote(const Options& options) {
  return options.mpi_world_rank < 0 ? std::string()
                                    : absl::StrCat(" (mpirun rank ", options.mpi_world_rank, ")");
}

absl::StatusOr<Options> OptionsFromEnvironment(std::optional<Role> role) {
  Options o;
  if (role) {
    o.role = *role;
  } else if (auto v = Get("HYBRIDPS_ROLE")) {
    if (*v == "scheduler") {
      o.role = Role::kScheduler;
    } else if (*v == "server") {
      o.role = Role::kServer;
    } else if (*v == "worker") {
      o.role = Role::kWorker;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "HYBRIDPS_ROLE='", *v, "' is not one of scheduler, server, worker"));
    }
  }
  if (auto v = Get("HYBRIDPS_SCHEDULER_ADDR")) o.scheduler_addr = *v;
  if (auto v = Get("HYBRIDPS_SCHEDULER_ENDPOINT")) o.scheduler_endpoint = *v;
  if (auto v = Get("HYBRIDPS_PORT_FILE")) o.port_file = *v;
  if (auto v = Get("HYBRIDPS_BACKEND")) o.backend = *v;
  if (auto v = Get("HYBRIDPS_INTERFACE")) o.interface = *v;
  if (auto v = Get("HYBRIDPS_TRANSPORT")) o.transport = *v;
  RETURN_IF_ERROR(ReadJobToken(&o.job_token));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_ENCRYPT", &o.encrypt));
  if (auto v = Get("HYBRIDPS_TIMELINE")) o.timeline = *v;
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_SCHEDULER_PORT", &o.scheduler_port));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_NUM_WORKERS", &o.num_workers));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_NUM_SERVERS", &o.num_servers));
  ASSIGN_OR_RETURN(std::optional<MpmdPlace> mpmd, MpmdPlaceFromEnvironment());
  if (mpmd) {  // mpirun started the whole job: its app contexts say who is who
    RETURN_IF_ERROR(GetNumber("HYBRIDPS_RANK", &o.rank));
    RETURN_IF_ERROR(ApplyMpmd(*mpmd, &o));
    // A worker is a node of its own unless told otherwise: mpirun's local ranks count
    // every role's processes on a host.
    RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOCAL_RANK", &o.local_rank));
    RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOCAL_SIZE", &o.local_size));
  } else if (o.role == Role::kWorker) {  // started by mpirun/srun: their variables stand in
    std::string rank_source, count_source;
    RETURN_IF_ERROR(GetFirstNumber(
        {"HYBRIDPS_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, &o.rank,
        &rank_source));
    RETURN_IF_ERROR(GetFirstNumber({"HYBRIDPS_NUM_WORKERS", "OMPI_COMM_WORLD_SIZE",
                                    "PMI_SIZE", "SLURM_NTASKS"},
                                   &o.num_workers, &count_source));
    RETURN_IF_ERROR(CheckLauncherCount(o, rank_source, count_source));
    RETURN_IF_ERROR(GetFirstNumber({"HYBRIDPS_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                    "MPI_LOCALRANKID", "SLURM_LOCALID"},
                                   &o.local_rank));
    std::string size_source;
    RETURN_IF_ERROR(GetFirstNumber({"HYBRIDPS_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                    "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"},
                                   &o.local_size, &size_source));
    auto per_node = Get("SLURM_TASKS_PER_NODE");
    if (size_source.empty() && per_node) {
      int node = 0;
      RETURN_IF_ERROR(GetNumber("SLURM_NODEID", &node));
      const int tasks = SlurmTasksOnNode(*per_node, node);
      if (tasks < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "environment variable SLURM_TASKS_PER_NODE='", *per_node,
            "' has no entry for SLURM_NODEID=", node));
      }
      o.local_size = tasks;
    }
  } else {
    RETURN_IF_ERROR(GetNumber("HYBRIDPS_RANK", &o.rank));
    RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOCAL_RANK", &o.local_rank));
    RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOCAL_SIZE", &o.local_size));
  }
  if (auto v = Get("HYBRIDPS_DEPLOYMENT")) o.deployment = *v;
  if (auto v = Get("HYBRIDPS_GPU_LOCAL_REDUCE")) o.gpu_local_reduce = *v;
  if (auto v = Get("HYBRIDPS_MXNET_MERGE")) o.mxnet_merge = *v;
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_EXTRA_SERVERS", &o.extra_servers));
  if (auto v = Get("HYBRIDPS_NODE_ID")) o.node_id = *v;
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOCAL_SLOTS", &o.local_slots));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_PARTITION_BYTES", &o.partition_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_WIRE_CHUNK_BYTES", &o.wire_chunk_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOCAL_INLINE_BYTES", &o.local_inline_bytes));
  if (!Get("HYBRIDPS_LOCAL_INLINE_BYTES") && o.local_size > 1 &&
      static_cast<unsigned>(o.local_size) >= std::thread::hardware_concurrency()) {
    o.local_inline_bytes = Options::kInlineEverything;
  }
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_SERVER_THREADS", &o.server_threads));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_CREDIT_BYTES", &o.credit_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_SERVER_WINDOW_BYTES", &o.server_window_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_MAX_SERVER_LANES", &o.max_server_lanes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_MAX_MESSAGE_BYTES", &o.max_message_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOG_LEVEL", &o.log_level));
  RETURN_IF_ERROR(GetMillis("HYBRIDPS_HEARTBEAT_INTERVAL_MS", &o.heartbeat_interval));
  RETURN_IF_ERROR(GetMillis("HYBRIDPS_HEARTBEAT_TIMEOUT_MS", &o.heartbeat_timeout));
  RETURN_IF_ERROR(GetMillis("HYBRIDPS_TIMEOUT_MS", &o.op_timeout));
  RETURN_IF_ERROR(GetMillis("HYBRIDPS_START_TIMEOUT_MS", &o.start_timeout));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_FUSION_BYTES", &o.fusion_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_FUSION_MAX_TENSOR_BYTES", &o.fusion_max_tensor_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_LOCAL_ALLREDUCE", &o.local_allreduce));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_HIERARCHICAL_ALLREDUCE", &o.hierarchical_allreduce));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_EAGER_BYTES", &o.eager_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_EAGER_PROBE", &o.eager_probe));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_TWO_SHOT_BYTES", &o.two_shot_bytes));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_DIRECT_TWO_SHOT", &o.direct_two_shot));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_DIRECT_ALLREDUCE_BYTES", &o.direct_allreduce_bytes));
  RETURN_IF_ERROR(GetMillis("HYBRIDPS_CYCLE_TIME_MS", &o.cycle_time));
  RETURN_IF_ERROR(GetMicros("HYBRIDPS_BURST_GATHER_US", &o.burst_gather));
  RETURN_IF_ERROR(GetMicros("HYBRIDPS_SPIN_US", &o.spin));
  RETURN_IF_ERROR(GetMillis("HYBRIDPS_STALL_WARNING_MS", &o.stall_warning));
  RETURN_IF_ERROR(GetMillis("HYBRIDPS_SUMMARY_EVERY_MS", &o.summary_every));
  RETURN_IF_ERROR(GetNumber("HYBRIDPS_CALLER_ROUNDS", &o.caller_rounds));
  if (auto v = Get("HYBRIDPS_BIND_TO")) o.bind_to = *v;
  if (o.backend == "dist_allreduce" && !Get("HYBRIDPS_NUM_SERVERS")) o.num_servers = 0;
  RETURN_IF_ERROR(o.Validate());
  return o;
}

}  // namespace hybridps
