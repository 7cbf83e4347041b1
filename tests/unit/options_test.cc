#include "common/options.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include <algorithm>
#include <string>
#include <thread>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("HYBRIDPS_JOB_TOKEN", "test-token", 1); }
  void TearDown() override {
    for (const char* v : {"HYBRIDPS_ROLE", "HYBRIDPS_JOB_TOKEN", "HYBRIDPS_JOB_TOKEN_FILE", "HYBRIDPS_NUM_WORKERS", "HYBRIDPS_NUM_SERVERS",
                          "HYBRIDPS_PARTITION_BYTES", "HYBRIDPS_WIRE_CHUNK_BYTES",
                          "HYBRIDPS_LOCAL_INLINE_BYTES", "HYBRIDPS_BURST_GATHER_US",
                          "HYBRIDPS_SPIN_US", "HYBRIDPS_SERVER_WINDOW_BYTES",
                          "HYBRIDPS_MAX_SERVER_LANES",
                          "HYBRIDPS_TIMEOUT_MS", "HYBRIDPS_RANK",
                          "HYBRIDPS_BACKEND", "HYBRIDPS_SCHEDULER_PORT",
                          "HYBRIDPS_HEARTBEAT_TIMEOUT_MS", "HYBRIDPS_FUSION_BYTES",
                          "HYBRIDPS_CYCLE_TIME_MS", "HYBRIDPS_STALL_WARNING_MS",
                          "HYBRIDPS_CALLER_ROUNDS", "HYBRIDPS_FUSION_MAX_TENSOR_BYTES",
                          "HYBRIDPS_BIND_TO",
                          "HYBRIDPS_EAGER_BYTES", "HYBRIDPS_EAGER_PROBE",
                          "HYBRIDPS_TWO_SHOT_BYTES", "HYBRIDPS_DIRECT_TWO_SHOT",
                          "HYBRIDPS_DIRECT_ALLREDUCE_BYTES",
                          "HYBRIDPS_LOCAL_ALLREDUCE", "HYBRIDPS_HIERARCHICAL_ALLREDUCE",
                          "HYBRIDPS_GPU_LOCAL_REDUCE", "HYBRIDPS_MXNET_MERGE",
                          "HYBRIDPS_LOCAL_RANK", "HYBRIDPS_LOCAL_SIZE", "HYBRIDPS_DEPLOYMENT",
                          "HYBRIDPS_EXTRA_SERVERS", "HYBRIDPS_MAX_MESSAGE_BYTES",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE",
                          "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
                          "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                          "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "OMPI_APP_CTX_NUM_PROCS",
                          "OMPI_MCA_orte_app_num"}) {
      unsetenv(v);
    }
  }
};

TEST_F(OptionsTest, DefaultsWhenNothingIsSet) {
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->partition_bytes, 4u << 20);
  EXPECT_EQ(o->wire_chunk_bytes, 256u << 10);
  EXPECT_EQ(o->server_window_bytes, 1u << 20);
  EXPECT_EQ(o->max_server_lanes, 4);
  EXPECT_EQ(o->local_inline_bytes, 1u << 20);
  EXPECT_EQ(o->credit_bytes, 16u << 20);
  EXPECT_EQ(o->burst_gather, absl::Milliseconds(1));
  EXPECT_EQ(o->spin, absl::ZeroDuration());
  EXPECT_EQ(o->backend, "dist_hybrid");
  EXPECT_EQ(o->rank, -1);
}

// With at most one CPU per local rank the node reduces every tensor on the I/O threads,
// unless the variable says otherwise.
TEST_F(OptionsTest, LocalInlineBytesFollowTheCpusPerLocalRank) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  setenv("HYBRIDPS_LOCAL_RANK", "0", 1);
  setenv("HYBRIDPS_LOCAL_SIZE", absl::StrCat(std::max(2, cpus)).c_str(), 1);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->local_inline_bytes, Options::kInlineEverything);
  setenv("HYBRIDPS_LOCAL_INLINE_BYTES", "4096", 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->local_inline_bytes, 4096u);
  unsetenv("HYBRIDPS_LOCAL_INLINE_BYTES");
  if (cpus > 2) {  // fewer local ranks than CPUs: the default
    setenv("HYBRIDPS_LOCAL_SIZE", "2", 1);
    o = OptionsFromEnvironment();
    ASSERT_OK(o);
    EXPECT_EQ(o->local_inline_bytes, 1u << 20);
  }
}

TEST_F(OptionsTest, ReadsVariables) {
  setenv("HYBRIDPS_ROLE", "server", 1);
  setenv("HYBRIDPS_NUM_WORKERS", "4", 1);
  setenv("HYBRIDPS_NUM_SERVERS", "3", 1);
  setenv("HYBRIDPS_PARTITION_BYTES", "1024", 1);
  setenv("HYBRIDPS_WIRE_CHUNK_BYTES", "0", 1);
  setenv("HYBRIDPS_LOCAL_INLINE_BYTES", "0", 1);
  setenv("HYBRIDPS_BURST_GATHER_US", "0", 1);
  setenv("HYBRIDPS_SPIN_US", "150", 1);
  setenv("HYBRIDPS_SERVER_WINDOW_BYTES", "0", 1);
  setenv("HYBRIDPS_MAX_SERVER_LANES", "1", 1);
  setenv("HYBRIDPS_TIMEOUT_MS", "2500", 1);
  setenv("HYBRIDPS_RANK", "2", 1);
  setenv("HYBRIDPS_SCHEDULER_PORT", "9000", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->role, Role::kServer);
  EXPECT_EQ(o->num_workers, 4);
  EXPECT_EQ(o->num_servers, 3);
  EXPECT_EQ(o->partition_bytes, 1024u);
  EXPECT_EQ(o->wire_chunk_bytes, 0u);
  EXPECT_EQ(o->local_inline_bytes, 0u);
  EXPECT_EQ(o->burst_gather, absl::ZeroDuration());
  EXPECT_EQ(o->spin, absl::Microseconds(150));
  EXPECT_EQ(o->server_window_bytes, 0u);
  EXPECT_EQ(o->max_server_lanes, 1);
  EXPECT_EQ(o->op_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->SchedulerEndpoint(), "tcp://127.0.0.1:9000");
}

TEST_F(OptionsTest, BadValuesNameTheVariable) {
  setenv("HYBRIDPS_NUM_WORKERS", "two", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("HYBRIDPS_NUM_WORKERS"), absl::string_view::npos);
  unsetenv("HYBRIDPS_NUM_WORKERS");
  setenv("HYBRIDPS_ROLE", "boss", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("boss"), absl::string_view::npos);
  unsetenv("HYBRIDPS_ROLE");
  setenv("HYBRIDPS_BACKEND", "dist_magic", 1);
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  unsetenv("HYBRIDPS_BACKEND");
  setenv("HYBRIDPS_WIRE_CHUNK_BYTES", "4", 1);  // neither 0 nor >= 8
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("wire_chunk_bytes"), absl::string_view::npos);
  unsetenv("HYBRIDPS_WIRE_CHUNK_BYTES");
  setenv("HYBRIDPS_MAX_SERVER_LANES", "0", 1);  // at least one connection
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("max_server_lanes"), absl::string_view::npos);
  unsetenv("HYBRIDPS_MAX_SERVER_LANES");
  setenv("HYBRIDPS_SERVER_WINDOW_BYTES", "4611686018427387905", 1);  // 2^62 + 1: overflows
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("server_window_bytes"), absl::string_view::npos);
  unsetenv("HYBRIDPS_SERVER_WINDOW_BYTES");
  setenv("HYBRIDPS_SPIN_US", "20000", 1);  // above 10 ms
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("spin_us"), absl::string_view::npos);
  unsetenv("HYBRIDPS_SPIN_US");
  setenv("HYBRIDPS_HEARTBEAT_TIMEOUT_MS", "10", 1);  // below the interval
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  unsetenv("HYBRIDPS_HEARTBEAT_TIMEOUT_MS");
  setenv("HYBRIDPS_NUM_WORKERS", "2", 1);
  setenv("HYBRIDPS_RANK", "2", 1);  // out of range
  EXPECT_FALSE(OptionsFromEnvironment().ok());
}

// A message limit below what the job's data messages carry would make ZeroMQ drop every
// connection that sends one (the job hung until its deadline): refused at start instead.
TEST_F(OptionsTest, MaxMessageBytesMustHoldTheLargestDataMessage) {
  setenv("HYBRIDPS_MAX_MESSAGE_BYTES", "100", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("max_message_bytes=100"), absl::string_view::npos)
      << o.status();
  EXPECT_NE(o.status().message().find("wire_chunk_bytes=262144"), absl::string_view::npos)
      << o.status();
  // Chunks off: a whole partition is one message.
  setenv("HYBRIDPS_MAX_MESSAGE_BYTES", "1000000", 1);
  setenv("HYBRIDPS_WIRE_CHUNK_BYTES", "0", 1);
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  setenv("HYBRIDPS_PARTITION_BYTES", "262144", 1);
  ASSERT_OK_AND_ASSIGN(Options fits, OptionsFromEnvironment());
  EXPECT_EQ(fits.LargestDataFrame(), 262144u + 8);
  // The scheduler carries no data.
  setenv("HYBRIDPS_ROLE", "scheduler", 1);
  setenv("HYBRIDPS_MAX_MESSAGE_BYTES", "100", 1);
  EXPECT_OK(OptionsFromEnvironment());
}

TEST_F(OptionsTest, AllreduceBackendNeedsNoServers) {
  setenv("HYBRIDPS_BACKEND", "dist_allreduce", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->num_servers, 0);
}

TEST_F(OptionsTest, AllreduceFusionCycleAndStallSettings) {
  auto d = OptionsFromEnvironment();
  ASSERT_OK(d);
  EXPECT_EQ(d->fusion_bytes, size_t{64} << 20);
  EXPECT_EQ(d->fusion_max_tensor_bytes, size_t{2} << 20);
  EXPECT_EQ(d->cycle_time, absl::Milliseconds(1));
  EXPECT_EQ(d->stall_warning, absl::Seconds(60));
  EXPECT_EQ(d->caller_rounds, 1);
  setenv("HYBRIDPS_CALLER_ROUNDS", "0", 1);
  auto off = OptionsFromEnvironment();
  ASSERT_OK(off);
  EXPECT_EQ(off->caller_rounds, 0);
  setenv("HYBRIDPS_CALLER_ROUNDS", "2", 1);
  auto two = OptionsFromEnvironment();
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("caller_rounds"), absl::string_view::npos) << two.status();
  unsetenv("HYBRIDPS_CALLER_ROUNDS");
  EXPECT_EQ(d->bind_to, "none");
  setenv("HYBRIDPS_BIND_TO", "core", 1);
  auto core = OptionsFromEnvironment();
  ASSERT_OK(core);
  EXPECT_EQ(core->bind_to, "core");
  setenv("HYBRIDPS_BIND_TO", "socket", 1);
  auto socket = OptionsFromEnvironment();
  ASSERT_FALSE(socket.ok());
  EXPECT_NE(socket.status().message().find("bind_to"), absl::string_view::npos)
      << socket.status();
  unsetenv("HYBRIDPS_BIND_TO");
  EXPECT_EQ(d->eager_bytes, size_t{1} << 20);
  EXPECT_EQ(d->eager_probe, 1);
  EXPECT_EQ(d->two_shot_bytes, 0u);
  EXPECT_EQ(d->direct_allreduce_bytes, size_t{1} << 20);
  EXPECT_EQ(d->direct_two_shot, 1);
  EXPECT_EQ(d->local_allreduce, 1);
  EXPECT_EQ(d->hierarchical_allreduce, 0);
  for (auto [var, value, ok] :
       {std::tuple{"HYBRIDPS_EAGER_BYTES", "0", true},
        std::tuple{"HYBRIDPS_EAGER_BYTES", "2097152", true},
        std::tuple{"HYBRIDPS_EAGER_BYTES", "2097153", false},
        std::tuple{"HYBRIDPS_EAGER_PROBE", "0", true},
        std::tuple{"HYBRIDPS_EAGER_PROBE", "2", false},
        std::tuple{"HYBRIDPS_TWO_SHOT_BYTES", "8388608", true},
        std::tuple{"HYBRIDPS_TWO_SHOT_BYTES", "8388609", false},
        std::tuple{"HYBRIDPS_DIRECT_TWO_SHOT", "0", true},
        std::tuple{"HYBRIDPS_DIRECT_TWO_SHOT", "2", false},
        std::tuple{"HYBRIDPS_LOCAL_ALLREDUCE", "0", true},
        std::tuple{"HYBRIDPS_LOCAL_ALLREDUCE", "2", false},
        std::tuple{"HYBRIDPS_HIERARCHICAL_ALLREDUCE", "1", true},
        std::tuple{"HYBRIDPS_HIERARCHICAL_ALLREDUCE", "2", false}}) {
    setenv(var, value, 1);
    auto v = OptionsFromEnvironment();
    EXPECT_EQ(v.ok(), ok) << var << "=" << value << ": " << v.status();
    if (!v.ok()) {
      const std::string field = absl::AsciiStrToLower(absl::string_view(var).substr(9));
      EXPECT_NE(v.status().message().find(field), absl::string_view::npos) << v.status();
    }
    unsetenv(var);
  }
  setenv("HYBRIDPS_FUSION_BYTES", "0", 1);
  setenv("HYBRIDPS_FUSION_MAX_TENSOR_BYTES", "4096", 1);
  setenv("HYBRIDPS_CYCLE_TIME_MS", "5", 1);
  setenv("HYBRIDPS_STALL_WARNING_MS", "2000", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->fusion_bytes, 0u);
  EXPECT_EQ(o->fusion_max_tensor_bytes, 4096u);
  EXPECT_EQ(o->cycle_time, absl::Milliseconds(5));
  EXPECT_EQ(o->stall_warning, absl::Seconds(2));
  setenv("HYBRIDPS_STALL_WARNING_MS", "0", 1);
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  setenv("HYBRIDPS_STALL_WARNING_MS", "x", 1);
  auto bad = OptionsFromEnvironment();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("HYBRIDPS_STALL_WARNING_MS"), absl::string_view::npos);
}

// mpirun starting the whole job: `-np 1 hybridps-scheduler : -np 2 hybridps-server : -np 3
// PROGRAM`. Each process's role is checked against its app context, its rank is its
// world rank less the contexts before it, the counts are the contexts' sizes.
TEST_F(OptionsTest, MpirunStartingTheWholeJobSaysWhoIsWho) {
  setenv("OMPI_APP_CTX_NUM_PROCS", "1 2 3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
  setenv("HYBRIDPS_SCHEDULER_PORT", "9000", 1);
  setenv("OMPI_MCA_orte_app_num", "2", 1);
  setenv("OMPI_COMM_WORLD_RANK", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "4", 1);  // counts the scheduler and servers too
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "6", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->role, Role::kWorker);
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->num_workers, 3);
  EXPECT_EQ(o->num_servers, 2);
  EXPECT_EQ(o->backend, "dist_hybrid");
  EXPECT_EQ(o->local_rank, 0);  // a node of its own
  EXPECT_EQ(o->local_size, 1);
  setenv("OMPI_MCA_orte_app_num", "1", 1);
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  o = OptionsFromEnvironment(Role::kServer);
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->num_workers, 3);
  // A server in the workers' context, a worker in the scheduler's: named.
  setenv("OMPI_MCA_orte_app_num", "2", 1);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  o = OptionsFromEnvironment(Role::kServer);
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StartsWith(o.status().message(),
                               "this server is in mpirun's app context 2 of 3 (1 : 2 : 3 "
                               "processes), the workers' place: hybridps takes"))
      << o.status();
  // HYBRIDPS_* that disagree with mpirun are named with both values.
  setenv("HYBRIDPS_NUM_WORKERS", "2", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("HYBRIDPS_NUM_WORKERS=2 but mpirun's app contexts "
                                      "(1 : 2 : 3 processes) make it 3"),
            absl::string_view::npos)
      << o.status();
  unsetenv("HYBRIDPS_NUM_WORKERS");
  // Two contexts: scheduler and workers, dist_allreduce.
  setenv("OMPI_APP_CTX_NUM_PROCS", "1 2", 1);
  setenv("OMPI_MCA_orte_app_num", "1", 1);
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->num_servers, 0);
  EXPECT_EQ(o->backend, "dist_allreduce");
  setenv("HYBRIDPS_BACKEND", "dist_hybrid", 1);
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  unsetenv("HYBRIDPS_BACKEND");
  // The scheduler's context takes one process; the port must be given.
  setenv("OMPI_APP_CTX_NUM_PROCS", "2 2", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("mpirun's first app context has 2 processes"),
            absl::string_view::npos);
  setenv("OMPI_APP_CTX_NUM_PROCS", "1 2", 1);
  unsetenv("HYBRIDPS_SCHEDULER_PORT");
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("HYBRIDPS_SCHEDULER_PORT is not set"),
            absl::string_view::npos);
}

// Workers started by mpirun or srun whose HYBRIDPS_NUM_WORKERS differs from the number
// the launcher started: the error says both numbers and where each came from.
TEST_F(OptionsTest, ALauncherThatStartedAnotherCountIsNamed) {
  setenv("HYBRIDPS_NUM_WORKERS", "1", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StartsWith(
      o.status().message(),
      "HYBRIDPS_NUM_WORKERS=1 (the job's worker count, which the scheduler and the servers "
      "read too) but OMPI_COMM_WORLD_SIZE=2 (the workers the launcher started; this one is "
      "OMPI_COMM_WORLD_RANK=1): set HYBRIDPS_NUM_WORKERS=2"))
      << o.status();
  setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  unsetenv("OMPI_COMM_WORLD_RANK");
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  o = OptionsFromEnvironment();  // OMPI's size is not this launcher's: Slurm's is compared
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("but SLURM_NTASKS=4"), absl::string_view::npos);
  setenv("SLURM_NTASKS", "1", 1);
  EXPECT_OK(OptionsFromEnvironment());
}

// Workers started by mpirun (Open MPI, MPICH/Intel PMI) or srun take rank, size and local
// rank from their launcher; HYBRIDPS_* still win; servers ignore them.
TEST_F(OptionsTest, MpiAndSlurmVariablesForWorkers) {
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  setenv("SLURM_PROCID", "7", 1);  // Open MPI's come first
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 5);
  EXPECT_EQ(o->num_workers, 8);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->local_size, 4);
  setenv("HYBRIDPS_RANK", "2", 1);
  setenv("HYBRIDPS_NUM_WORKERS", "3", 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->num_workers, 3);
  unsetenv("HYBRIDPS_RANK");
  unsetenv("HYBRIDPS_NUM_WORKERS");
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    unsetenv(v);
  }
  setenv("PMI_RANK", "3", 1);
  setenv("PMI_SIZE", "6", 1);
  setenv("MPI_LOCALRANKID", "0", 1);
  setenv("MPI_LOCALNRANKS", "2", 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->num_workers, 6);
  EXPECT_EQ(o->local_size, 2);
  for (const char* v : {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}) {
    unsetenv(v);
  }
  // srun: 2 tasks on each of 3 nodes, then 1; this task is on node 3.
  setenv("SLURM_NTASKS", "7", 1);
  setenv("SLURM_LOCALID", "0", 1);
  setenv("SLURM_TASKS_PER_NODE", "2(x3),1", 1);
  setenv("SLURM_NODEID", "3", 1);
  setenv("SLURM_PROCID", "6", 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 6);
  EXPECT_EQ(o->num_workers, 7);
  EXPECT_EQ(o->local_rank, 0);
  EXPECT_EQ(o->local_size, 1);
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_LOCALID", "1", 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->local_size, 2);
  setenv("SLURM_NODEID", "9", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("SLURM_TASKS_PER_NODE"), absl::string_view::npos);
  // A server started by srun keeps its own numbering.
  setenv("SLURM_NODEID", "1", 1);
  setenv("HYBRIDPS_ROLE", "server", 1);
  setenv("HYBRIDPS_NUM_SERVERS", "2", 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, -1);
  EXPECT_EQ(o->num_workers, 1);
}

TEST_F(OptionsTest, DeploymentAndExtraServers) {
  setenv("HYBRIDPS_NUM_SERVERS", "6", 1);
  setenv("HYBRIDPS_DEPLOYMENT", "mixed", 1);
  setenv("HYBRIDPS_EXTRA_SERVERS", "2", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->deployment, "mixed");
  EXPECT_EQ(o->extra_servers, 2);
  setenv("HYBRIDPS_EXTRA_SERVERS", "6", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("extra_servers=6"), absl::string_view::npos);
  setenv("HYBRIDPS_DEPLOYMENT", "colocated", 1);
  setenv("HYBRIDPS_EXTRA_SERVERS", "1", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("needs deployment=mixed"), absl::string_view::npos);
  setenv("HYBRIDPS_DEPLOYMENT", "everywhere", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("everywhere"), absl::string_view::npos);
}

// A string option of a few choices: `def` unless set, `other` when set to it, and a value
// that is neither refused with "<field>=<value>".
void CheckChoice(const char* env, std::string Options::*field, const char* def,
                 const char* other, const char* bad, const char* name) {
  SCOPED_TRACE(env);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ((*o).*field, def);
  setenv(env, other, 1);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ((*o).*field, other);
  setenv(env, bad, 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find(absl::StrCat(name, "=", bad)), absl::string_view::npos)
      << o.status();
}

// The job token: required, from HYBRIDPS_JOB_TOKEN or a file only its owner can read.
TEST_F(OptionsTest, JobTokenIsRequiredFromTheVariableOrAPrivateFile) {
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->job_token, "test-token");
  unsetenv("HYBRIDPS_JOB_TOKEN");
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StrContains(o.status().message(), "no hybridps job")) << o.status();
  setenv("HYBRIDPS_SCHEDULER_PORT", "9000", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StrContains(o.status().message(), "no job token")) << o.status();
  const std::string file = ::testing::TempDir() + "/hps-token";
  {
    std::ofstream f(file);
    f << "  secret-from-file \nsecond line\n";
  }
  setenv("HYBRIDPS_JOB_TOKEN_FILE", file.c_str(), 1);
  chmod(file.c_str(), 0644);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StrContains(o.status().message(), "mode 0644")) << o.status();
  chmod(file.c_str(), 0600);
  o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->job_token, "secret-from-file");
  setenv("HYBRIDPS_JOB_TOKEN", "x", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StrContains(o.status().message(), "set one of them")) << o.status();
  unsetenv("HYBRIDPS_JOB_TOKEN");
  std::remove(file.c_str());
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StrContains(o.status().message(), "no such file")) << o.status();
}

// Options built in code: a job on the network needs a token; one inside a process not.
TEST_F(OptionsTest, ValidateWantsATokenUnlessInProcess) {
  Options o;
  absl::Status s = o.Validate();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "no job token")) << s;
  o.scheduler_endpoint = "inproc://x";
  EXPECT_OK(o.Validate());
  o.scheduler_endpoint = "";
  o.job_token = "t";
  EXPECT_OK(o.Validate());
}

TEST_F(OptionsTest, GpuLocalReduce) {
  CheckChoice("HYBRIDPS_GPU_LOCAL_REDUCE", &Options::gpu_local_reduce, "auto", "nccl", "NVLink",
              "gpu_local_reduce");
  setenv("HYBRIDPS_GPU_LOCAL_REDUCE", "host", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_OK(o);
  EXPECT_EQ(o->gpu_local_reduce, "host");
}

TEST_F(OptionsTest, MxnetMerge) {
  CheckChoice("HYBRIDPS_MXNET_MERGE", &Options::mxnet_merge, "device", "host", "gpu",
              "mxnet_merge");
}

}  // namespace
}  // namespace hybridps
