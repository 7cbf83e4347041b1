// Registration at the scheduler: what it refuses and why, with hand-driven peers.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/hybridps.pb.h"
#include "common/options.h"
#include "common/transport.h"
#include "common/wire.h"
#include "scheduler/scheduler.h"
#include "tests/cluster/raw_peer.h"
#include "tests/status_matchers.h"

namespace hybridps::testing {
namespace {

// Replies come long before this.
constexpr absl::Duration kQuick = absl::Seconds(5);

// A scheduler's options for a job of `workers` workers and `servers` servers, on an
// ephemeral loopback port.
Options SchedulerOptions(int workers, int servers) {
  Options o;
  o.role = Role::kScheduler;
  o.num_workers = workers;
  o.num_servers = servers;
  o.scheduler_endpoint = "tcp://127.0.0.1:0";
  o.job_token = kTestJobToken;
  o.log_level = 1;
  return o;
}

// A process whose settings differ from the job's is refused at registration, naming the
// setting, its value and the job's, and the job fails at once (it cannot start without
// that process) instead of hanging until the start timeout or failing in a round: the
// job's shape against the scheduler's own, the workers' data layout against the first
// worker's, a server's message limit against the workers' largest message.
TEST(RegistrationTest, SettingsThatMustAgreeAreComparedAtRegistration) {
  const Options o = SchedulerOptions(2, 1);
  using Change = std::function<void(wire::JobSettings*)>;
  auto reg = [&o](wire::NodeRole role, const Change& change) {
    wire::Envelope env;
    env.set_id(1);
    auto* r = env.mutable_register_();
    r->set_role(role);
    r->set_requested_rank(-1);
    r->set_data_endpoint(role == wire::ROLE_SERVER ? "tcp://127.0.0.1:1" : "");
    r->set_host("h");
    r->set_pid(7);
    *r->mutable_settings() = JobSettingsOf(o);
    if (change) change(r->mutable_settings());
    return env;
  };
  // A fresh job: registers `first` (unless none; the scheduler accepts it), then
  // `refused`, which must be refused with an error mentioning each of `mentions`; the
  // first process must hear the same from the scheduler's shutdown, and the scheduler must
  // end the job with it.
  auto expect_refused = [&](const std::optional<wire::Envelope>& first,
                            const wire::Envelope& refused,
                            const std::vector<std::string>& mentions) {
    SCOPED_TRACE(mentions[0]);
    Context ctx;
    ASSERT_OK_AND_ASSIGN(auto scheduler, Scheduler::Create(ctx, o));
    absl::Status ended;
    std::thread run([&] { ended = scheduler->Run(); });
    std::optional<RawPeer> early;
    if (first) {
      early.emplace(ctx, scheduler->endpoint());
      ASSERT_TRUE(early->Authenticate(first->register_().role(),
                                      first->register_().requested_rank()));
      early->SendEnvelope(*first);
    }
    RawPeer peer(ctx, scheduler->endpoint());
    ASSERT_TRUE(peer.Authenticate(refused.register_().role(),
                                  refused.register_().requested_rank()));
    peer.SendEnvelope(refused);
    auto reply = peer.Receive(kQuick);
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
    for (const std::string& m : mentions) EXPECT_TRUE(Mentions(reply->error().message(), m));
    if (early) {
      auto shutdown = early->Receive(kQuick);
      ASSERT_TRUE(shutdown.has_value());
      ASSERT_EQ(shutdown->body_case(), wire::Envelope::kShutdown) << shutdown->DebugString();
      EXPECT_TRUE(shutdown->shutdown().failed());
      EXPECT_TRUE(Mentions(shutdown->shutdown().reason(), mentions[0]));
    }
    run.join();  // the scheduler ends the job by itself
    EXPECT_FALSE(ended.ok());
    EXPECT_TRUE(Mentions(ended.message(), mentions[0]));
  };
  const wire::NodeRole worker = wire::ROLE_WORKER, server = wire::ROLE_SERVER;
  const wire::Envelope a_worker = reg(worker, nullptr);
  const wire::Envelope a_server = reg(server, nullptr);
  // The job's shape, against the scheduler's own.
  expect_refused(std::nullopt,
                 reg(worker, [](wire::JobSettings* s) { s->set_backend("dist_allreduce"); }),
                 {"HYBRIDPS_BACKEND=dist_allreduce", "dist_hybrid", "scheduler"});
  expect_refused(a_worker, reg(server, [](wire::JobSettings* s) { s->set_num_servers(2); }),
                 {"HYBRIDPS_NUM_SERVERS=2", "has 1"});
  expect_refused(a_server, reg(worker, [](wire::JobSettings* s) { s->set_num_workers(3); }),
                 {"HYBRIDPS_NUM_WORKERS=3", "has 2"});
  // The first worker sets the workers' data layout.
  expect_refused(a_worker,
                 reg(worker, [](wire::JobSettings* s) { s->set_partition_bytes(1 << 20); }),
                 {"HYBRIDPS_PARTITION_BYTES=1048576", "4194304", "first worker (on h pid 7)"});
  expect_refused(a_worker,
                 reg(worker, [](wire::JobSettings* s) { s->set_wire_chunk_bytes(1 << 19); }),
                 {"HYBRIDPS_WIRE_CHUNK_BYTES=524288", "262144", "first worker"});
  expect_refused(a_worker,
                 reg(worker, [](wire::JobSettings* s) { s->set_gpu_local_reduce("host"); }),
                 {"HYBRIDPS_GPU_LOCAL_REDUCE=host", "has auto", "first worker"});
  // A server that would refuse the workers' messages, registering after or before them.
  const Change small = [](wire::JobSettings* s) { s->set_max_message_bytes(100000); };
  expect_refused(a_worker, reg(server, small),
                 {"at most 100000 bytes (HYBRIDPS_MAX_MESSAGE_BYTES)",
                  "HYBRIDPS_WIRE_CHUNK_BYTES=262144"});
  expect_refused(reg(server, small), a_worker,
                 {"at most 100000 bytes", "the worker on h pid 7 sends"});
  // A registration without settings comes from another version of hybridps.
  wire::Envelope bare = a_worker;
  bare.mutable_register_()->clear_settings();
  expect_refused(std::nullopt, bare, {"sent no job settings"});
}

// HYBRIDPS_GPU_LOCAL_REDUCE as the scheduler resolves it per node, in the Welcome: "auto"
// is NCCL only where every rank of the node sees a GPU per local rank; "nccl" and "host"
// are taken as set; a node of one rank never reduces; the ranks of a node always agree.
TEST(RegistrationTest, GpuLocalReduceIsResolvedPerNode) {
  struct Worker {
    std::string node;
    int local_rank, local_size, gpus;
  };
  // Registers one server and `workers` (all with `mode`); returns each worker's
  // gpu_reduce_nccl from its Welcome, by rank.
  auto resolve = [](const std::string& mode,
                    const std::vector<Worker>& workers) -> std::vector<bool> {
    Options o = SchedulerOptions(static_cast<int>(workers.size()), 1);
    Context ctx;
    auto scheduler = Scheduler::Create(ctx, o);
    EXPECT_OK(scheduler);
    std::thread run([&] { (void)(*scheduler)->Run(); });
    std::vector<std::unique_ptr<RawPeer>> peers;
    for (size_t i = 0; i <= workers.size(); ++i) {
      const bool server = i == workers.size();
      peers.push_back(std::make_unique<RawPeer>(ctx, (*scheduler)->endpoint()));
      EXPECT_TRUE(peers.back()->Authenticate(server ? wire::ROLE_SERVER : wire::ROLE_WORKER,
                                             server ? 0 : static_cast<int>(i)));
      wire::Envelope env;
      env.set_id(1);
      auto* r = env.mutable_register_();
      r->set_role(server ? wire::ROLE_SERVER : wire::ROLE_WORKER);
      r->set_requested_rank(server ? 0 : static_cast<int>(i));
      r->set_data_endpoint(server ? "tcp://127.0.0.1:1" : "");
      r->set_host("h");
      r->set_pid(7);
      Options mine = o;
      mine.gpu_local_reduce = mode;
      *r->mutable_settings() = JobSettingsOf(mine);
      if (!server) {
        r->set_node(workers[i].node);
        r->set_local_rank(workers[i].local_rank);
        r->set_local_size(workers[i].local_size);
        r->set_nccl_gpus(workers[i].gpus);
      }
      peers.back()->SendEnvelope(env);
    }
    std::vector<bool> nccl;
    for (size_t i = 0; i < workers.size(); ++i) {
      std::optional<wire::Envelope> reply = peers[i]->Receive(kQuick);
      EXPECT_TRUE(reply && reply->body_case() == wire::Envelope::kWelcome)
          << (reply ? reply->DebugString() : "no reply");
      nccl.push_back(reply && reply->welcome().workers(i).gpu_reduce_nccl());
    }
    (*scheduler)->Stop();
    run.join();
    return nccl;
  };
  using V = std::vector<bool>;
  // Node a: two ranks that each see 2 GPUs; node b: one of its ranks sees only 1; node c:
  // a node of one rank with GPUs.
  const std::vector<Worker> job = {{"a", 0, 2, 2}, {"a", 1, 2, 2}, {"b", 0, 2, 2},
                                   {"b", 1, 2, 1}, {"c", 0, 1, 8}};
  EXPECT_EQ(resolve("auto", job), V({true, true, false, false, false}));
  EXPECT_EQ(resolve("host", job), V({false, false, false, false, false}));
  EXPECT_EQ(resolve("nccl", job), V({true, true, true, true, false}));
  // A build without NCCL (or a host without GPUs) reports none: auto stays on the host.
  EXPECT_EQ(resolve("auto", {{"a", 0, 2, 0}, {"a", 1, 2, 0}}), V({false, false}));
}

// A bare scheduler for one worker and one server: registrations that must be refused.
TEST(RegistrationTest, SchedulerRefusesBadRegistrations) {
  Context ctx;
  const Options o = SchedulerOptions(1, 1);
  auto scheduler = Scheduler::Create(ctx, o);
  ASSERT_OK(scheduler);
  std::thread run([s = scheduler->get()] { (void)s->Run(); });
  const std::string endpoint = (*scheduler)->endpoint();

  auto registration = [&o](wire::NodeRole role, int rank, absl::string_view endpoint) {
    wire::Envelope env;
    env.set_id(1);
    auto* r = env.mutable_register_();
    r->set_role(role);
    r->set_requested_rank(rank);
    r->set_data_endpoint(std::string(endpoint));
    r->set_host("test");
    r->set_pid(1);
    *r->mutable_settings() = JobSettingsOf(o);
    return env;
  };
  // Registers through `peer`; the scheduler's Error message, or "" if no reply came
  // within `wait`.
  // The connection authenticates as what `reg` registers as, unless `as` says otherwise.
  auto try_register = [&](RawPeer& peer, const wire::Envelope& reg,
                          absl::Duration wait = kQuick,
                          std::optional<std::pair<wire::NodeRole, int>> as = {}) -> std::string {
    EXPECT_TRUE(peer.Authenticate(as ? as->first : reg.register_().role(),
                                  as ? as->second : reg.register_().requested_rank()));
    peer.SendEnvelope(reg);
    auto reply = peer.Receive(wait);
    if (!reply) return "";
    EXPECT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
    return reply->error().message();
  };

  // The job's one worker: accepted, so it waits for the Welcome (no reply yet).
  RawPeer worker(ctx, endpoint);
  EXPECT_EQ(try_register(worker, registration(wire::ROLE_WORKER, 0, ""), absl::Milliseconds(300)),
            "");
  {
    RawPeer peer(ctx, endpoint);
    EXPECT_TRUE(Mentions(try_register(peer, registration(wire::ROLE_WORKER, -1, "")),
                         "already have 1 workers"));
  }
  {
    RawPeer peer(ctx, endpoint);
    EXPECT_TRUE(Mentions(try_register(peer, registration(wire::ROLE_SERVER, 3, "tcp://x:1")),
                         "out of range"));
  }
  {
    RawPeer peer(ctx, endpoint);
    EXPECT_TRUE(
        Mentions(try_register(peer, registration(wire::ROLE_SERVER, 0, "")), "data endpoint"));
  }
  {
    RawPeer peer(ctx, endpoint);
    EXPECT_TRUE(Mentions(try_register(peer, registration(wire::ROLE_SCHEDULER, -1, "")),
                         "only workers and servers"));
  }
  {
    // A connection speaks for what its handshake claimed, not another role or rank.
    RawPeer peer(ctx, endpoint);
    EXPECT_TRUE(Mentions(try_register(peer, registration(wire::ROLE_SERVER, 0, "tcp://x:1"),
                                      kQuick, std::make_pair(wire::ROLE_WORKER, -1)),
                         "authenticated as worker -1 and cannot register as server 0"));
  }

  // The job can still start: a valid server completes it and both get their Welcome.
  RawPeer server(ctx, endpoint);
  ASSERT_TRUE(server.Authenticate(wire::ROLE_SERVER, 0));
  server.SendEnvelope(registration(wire::ROLE_SERVER, 0, "tcp://127.0.0.1:1"));
  bool server_welcomed = false;
  for (int i = 0; i < 2 && !server_welcomed; ++i) {
    auto reply = server.Receive(kQuick);
    ASSERT_TRUE(reply.has_value());
    server_welcomed = reply->body_case() == wire::Envelope::kWelcome;
  }
  EXPECT_TRUE(server_welcomed);
  auto welcome = worker.Receive(kQuick);
  ASSERT_TRUE(welcome.has_value());
  ASSERT_EQ(welcome->body_case(), wire::Envelope::kWelcome) << welcome->DebugString();
  EXPECT_EQ(welcome->welcome().rank(), 0);
  EXPECT_EQ(welcome->welcome().servers(0).endpoint(), "tcp://127.0.0.1:1");

  (*scheduler)->Stop();
  run.join();
}

}  // namespace
}  // namespace hybridps::testing
