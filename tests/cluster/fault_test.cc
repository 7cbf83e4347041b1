// Failures of an in-process job: operations that disagree between workers, a server that
// dies, a rank that never submits, and malformed or hostile messages on the servers' and
// the scheduler's ports. Every failure must be reported well before op_timeout, name its
// cause, and leave the rest of the job working where it can.
#include <gtest/gtest.h>
#include <zmq.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/hybridps.pb.h"
#include "common/partition.h"
#include "common/transport.h"
#include "common/wire.h"
#include "scheduler/scheduler.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/raw_peer.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"

namespace hybridps::testing {
namespace {

// Failures must come long before this (op_timeout is 30 s unless a test lowers it).
constexpr absl::Duration kQuick = absl::Seconds(5);
// A dead peer is noticed after heartbeat_timeout (2 s) plus a heartbeat interval or two.
constexpr absl::Duration kDeathBound = absl::Seconds(6);

std::unique_ptr<LocalCluster> StartCluster(const ClusterConfig& config) {
  auto cluster = LocalCluster::Start(config);
  EXPECT_OK(cluster);
  return cluster.ok() ? std::move(*cluster) : nullptr;
}


// Prints an error a test provoked, so the log shows what users would see.
void Show(absl::string_view who, const absl::Status& status, absl::Duration after) {
  std::printf("  [observed after %s] %s: %s\n", absl::FormatDuration(after).c_str(),
              std::string(who).c_str(), status.ToString().c_str());
}

// `number` as a whole word of `text` (so "10" is not found in "1000").
::testing::AssertionResult MentionsNumber(absl::string_view text, uint64_t number) {
  const std::regex word(absl::StrCat("\\b", number, "\\b"));
  if (std::regex_search(text.begin(), text.end(), word)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << number << " not in: " << text;
}

// Every worker push_pulls `name` (count elements of dtype) twice; both sums must be exact.
void ExpectExactSums(LocalCluster& cluster, const std::string& name, DType dtype, size_t count) {
  const int n = cluster.num_workers();
  cluster.RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer b(dtype, count);
    for (int round = 0; round < 2; ++round) {
      b.Fill(rank, round, 7);
      absl::Status s = kv->PushPull(name, b.view(), b.view());
      ASSERT_OK(s) << "worker " << rank;
      for (size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += Value(i, r, round, 7);
        ASSERT_EQ(b.at(i), want) << name << " element " << i << " round " << round;
      }
    }
  });
}

// Index (for LocalCluster::server/KillServer) of the server the scheduler gave `rank`.
// Safe to read once Start returned: every worker completed a handshake with every
// server, which each server only answers after it learnt its rank.
int ServerIndex(LocalCluster& cluster, int rank, int num_servers) {
  for (int i = 0; i < num_servers; ++i) {
    if (cluster.server(i)->rank() == rank) return i;
  }
  ADD_FAILURE() << "no server has rank " << rank;
  return 0;
}

// ---- operations that disagree between workers -------------------------------------------

struct Outcome {
  absl::Status status;
  absl::Duration took;
};

// Worker 0 push_pulls `name` as (count0, dtype0), worker 1 as (count1, dtype1).
std::vector<Outcome> MismatchedPushPull(LocalCluster& cluster, const std::string& name,
                                        size_t count0, DType dtype0, size_t count1, DType dtype1) {
  std::vector<Outcome> out(2);
  cluster.RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer b(rank == 0 ? dtype0 : dtype1, rank == 0 ? count0 : count1);
    b.Fill(rank, 0, 0);
    const absl::Time start = absl::Now();
    out[rank].status = kv->PushPull(name, b.view(), b.view());
    out[rank].took = absl::Now() - start;
  });
  return out;
}

class MismatchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ClusterConfig c;
    c.transport = GetParam();
    c.workers = 2;
    c.servers = 2;
    c.partition_bytes = 64;  // 1000 float32 = 63 partitions over both servers
    cluster_ = StartCluster(c);
    ASSERT_NE(cluster_, nullptr);
  }
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_P(MismatchTest, SizeFailsBothWorkersNamingBothSizesAndServersKeepServing) {
  auto out = MismatchedPushPull(*cluster_, "bad", 10, DType::kFloat32, 1000, DType::kFloat32);
  for (int rank = 0; rank < 2; ++rank) {
    const absl::Status& s = out[rank].status;
    Show(absl::StrCat("worker ", rank), s, out[rank].took);
    ASSERT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Mentions(s.message(), "'bad'"));
    EXPECT_TRUE(MentionsNumber(s.message(), 10));
    EXPECT_TRUE(MentionsNumber(s.message(), 1000));
    EXPECT_LT(out[rank].took, kQuick) << "worker " << rank << ": " << s;
  }
  ExpectExactSums(*cluster_, "good", DType::kFloat32, 1000);
  ExpectExactSums(*cluster_, "good.small", DType::kInt32, 5);
}

TEST_P(MismatchTest, DTypeFailsBothWorkersNamingBothDTypesAndServersKeepServing) {
  auto out = MismatchedPushPull(*cluster_, "bad", 100, DType::kFloat32, 100, DType::kInt32);
  for (int rank = 0; rank < 2; ++rank) {
    const absl::Status& s = out[rank].status;
    Show(absl::StrCat("worker ", rank), s, out[rank].took);
    ASSERT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Mentions(s.message(), "'bad'"));
    EXPECT_TRUE(Mentions(s.message(), "float32"));
    EXPECT_TRUE(Mentions(s.message(), "int32"));
    EXPECT_LT(out[rank].took, kQuick) << "worker " << rank << ": " << s;
  }
  ExpectExactSums(*cluster_, "good", DType::kFloat32, 1000);
}

INSTANTIATE_TEST_SUITE_P(Transports, MismatchTest, ::testing::Values("inproc", "tcp"),
                         [](const auto& info) { return info.param; });

// A name whose operation failed on a mismatch must never return a wrong sum later: the
// partitions only one worker pushed are abandoned by the server when the retry's later
// round arrives, and the matched retry sums exactly on every worker.
TEST(MismatchRetryTest, MatchedRetryAfterAMismatchIsExactOrFails) {
  ClusterConfig c;
  c.workers = 2;
  c.servers = 2;
  c.partition_bytes = 64;
  c.op_timeout = absl::Seconds(3);
  auto cluster = StartCluster(c);
  ASSERT_NE(cluster, nullptr);
  auto out = MismatchedPushPull(*cluster, "bad", 10, DType::kFloat32, 1000, DType::kFloat32);
  ASSERT_FALSE(out[0].status.ok());
  ASSERT_FALSE(out[1].status.ok());
  std::vector<absl::Status> status(2);
  std::vector<Buffer> result;
  for (int r = 0; r < 2; ++r) result.emplace_back(DType::kFloat32, 1000);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    result[rank].Fill(rank, 1, 5);  // not the failed operation's data
    status[rank] = kv->PushPull("bad", result[rank].view(), result[rank].view());
  });
  for (int rank = 0; rank < 2; ++rank) {
    Show(absl::StrCat("worker ", rank), status[rank], absl::ZeroDuration());
  }
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_OK(status[rank]) << "worker " << rank;
    for (size_t i = 0; i < 1000; ++i) {
      ASSERT_EQ(result[rank].at(i), Value(i, 0, 1, 5) + Value(i, 1, 1, 5))
          << "worker " << rank << " got a wrong sum without an error, element " << i;
    }
  }
}

// ---- a server that dies -----------------------------------------------------------------

class DeadServerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ClusterConfig c;
    c.transport = GetParam();
    c.workers = 2;
    c.servers = 2;
    c.partition_bytes = 64;
    cluster_ = StartCluster(c);
    ASSERT_NE(cluster_, nullptr);
    // The tensor used below has partitions on both servers.
    std::set<int> servers;
    for (const Partition& p : PartitionTensor(TensorKey("x"), kCount, DType::kFloat32, 64, 2)) {
      servers.insert(p.server);
    }
    ASSERT_EQ(servers.size(), 2u);
  }

  static constexpr size_t kCount = 1000;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_P(DeadServerTest, PushPullAfterTheDeathFailsNamingTheServer) {
  const absl::Time killed = absl::Now();
  cluster_->KillServer(ServerIndex(*cluster_, 1, 2));
  std::vector<Outcome> out(2);
  cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer b(DType::kFloat32, kCount);
    b.Fill(rank, 0, 0);
    out[rank].status = kv->PushPull("x", b.view(), b.view());
    out[rank].took = absl::Now() - killed;
  });
  for (int rank = 0; rank < 2; ++rank) {
    const absl::Status& s = out[rank].status;
    Show(absl::StrCat("worker ", rank), s, out[rank].took);
    ASSERT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(Mentions(s.message(), "server 1"));
    EXPECT_TRUE(Mentions(s.message(), "'x'"));
    EXPECT_LT(out[rank].took, kDeathBound) << "worker " << rank << ": " << s;
  }
}

TEST_P(DeadServerTest, PushPullInFlightFailsWhenTheServerDies) {
  // Only worker 0 pushes, so its operation waits for worker 1 on both servers.
  Buffer b(DType::kFloat32, kCount);
  b.Fill(0, 0, 0);
  auto h = cluster_->worker(0)->PushPullAsync("x", b.view(), b.view());
  ASSERT_OK(h);
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_FALSE(h->Done()) << h->Wait();
  const absl::Time killed = absl::Now();
  cluster_->KillServer(ServerIndex(*cluster_, 1, 2));
  absl::Status s = h->Wait();
  const absl::Duration took = absl::Now() - killed;
  Show("worker 0", s, took);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(Mentions(s.message(), "server 1"));
  EXPECT_TRUE(Mentions(s.message(), "'x'"));
  EXPECT_LT(took, kDeathBound) << s;
  // Worker 1, which had nothing in flight, fails its next operation with the same cause.
  Buffer c(DType::kFloat32, kCount);
  absl::Status s1 = cluster_->worker(1)->PushPull("x", c.view(), c.view());
  ASSERT_FALSE(s1.ok());
  EXPECT_TRUE(Mentions(s1.message(), "server 1"));
  EXPECT_LT(absl::Now() - killed, kDeathBound) << s1;
}

INSTANTIATE_TEST_SUITE_P(Transports, DeadServerTest, ::testing::Values("inproc", "tcp"),
                         [](const auto& info) { return info.param; });

// ---- a rank that never submits ----------------------------------------------------------

TEST(DeadlineTest, RankThatNeverSubmitsFailsTheOthersAtTheDeadline) {
  ClusterConfig c;
  c.workers = 2;
  c.servers = 2;
  c.op_timeout = absl::Seconds(1);
  auto cluster = StartCluster(c);
  ASSERT_NE(cluster, nullptr);
  Buffer b(DType::kFloat32, 10);
  b.Fill(0, 0, 0);
  const absl::Time start = absl::Now();
  absl::Status s = cluster->worker(0)->PushPull("lonely", b.view(), b.view());
  const absl::Duration took = absl::Now() - start;
  Show("worker 0", s, took);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(Mentions(s.message(), "'lonely'"));
  EXPECT_GE(took, absl::Milliseconds(900)) << s;  // not before its deadline
  EXPECT_LT(took, absl::Seconds(3)) << s;
  // The store stays broken: later operations fail at once with the same cause.
  absl::Status later = cluster->worker(0)->PushPull("other", b.view(), b.view());
  ASSERT_FALSE(later.ok());
  EXPECT_TRUE(Mentions(later.message(), "'lonely'"));
}

// A store whose I/O thread is stuck (a bug, a blocked system call) never completes its
// operations: Wait gives up after the deadline by which the store would have failed the
// operation, plus Options::wait_grace, naming it, and leaves it pending.
TEST(DeadlineTest, WaitOnAStuckStoreGivesUpAfterItsDeadlineAndGrace) {
  ClusterConfig c;
  c.workers = 2;
  c.servers = 1;
  c.op_timeout = absl::Seconds(1);
  c.worker_options = [](int, Options* o) { o->wait_grace = absl::Seconds(1); };
  auto cluster = StartCluster(c);
  ASSERT_NE(cluster, nullptr);
  absl::Notification release;
  ASSERT_OK(PsOf(cluster->worker(0))->RunOnIo([&release] {
    release.WaitForNotificationWithTimeout(absl::Seconds(300));
  }));
  Buffer b(DType::kFloat32, 10);
  b.Fill(0, 0, 0);
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(Handle h, cluster->worker(0)->PushPullAsync("stuck", b.view(), b.view()));
  const absl::Status s = h.Wait();
  const absl::Duration took = absl::Now() - start;
  Show("worker 0", s, took);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(Mentions(s.message(), "push_pull of 'stuck'"));
  EXPECT_TRUE(Mentions(s.message(), "threads are stuck"));
  // op_timeout, the ten seconds PsStore may take to fail it cleanly, and the grace.
  EXPECT_GE(took, absl::Seconds(12)) << s;
  EXPECT_FALSE(h.Done());
  // Unstuck, the store fails the operation (its deadline is long past, and the scheduler
  // has declared this silent worker dead), and only then lets go of it.
  absl::Notification completed;
  absl::Status after;
  h.OnComplete([&](const absl::Status& st) {
    after = st;
    completed.Notify();
  });
  release.Notify();
  ASSERT_TRUE(completed.WaitForNotificationWithTimeout(absl::Seconds(120)));
  EXPECT_TRUE(h.Done());
  EXPECT_FALSE(after.ok());
  EXPECT_TRUE(Mentions(after.message(), "push_pull of 'stuck'")) << after;
  EXPECT_FALSE(Mentions(after.message(), "threads are stuck")) << after;
  EXPECT_EQ(h.Wait(), after);
}

// ---- malformed and hostile messages ------------------------------------------------------

wire::Envelope Hello(uint32_t magic, uint32_t version, Role role = Role::kWorker) {
  wire::Envelope env = MakeHello(ToWire(role), 0);
  env.mutable_hello()->set_nonce(std::string(32, 'n'));
  env.mutable_hello()->set_magic(magic);
  env.mutable_hello()->set_version(version);
  return env;
}

// A push_pull request of `count` float32 elements of a tensor no real worker uses.
wire::Envelope DataRequest(uint64_t id, uint64_t count, uint32_t dtype = 0) {
  wire::Envelope env;
  env.set_id(id);
  auto* req = env.mutable_data_request();
  req->set_name("rogue");
  req->set_key(TensorKey("rogue"));
  req->set_op(wire::OP_PUSHPULL);
  req->set_dtype(dtype);
  req->set_count(count);
  req->set_total_count(count);
  return env;
}

bool WaitForCount(const std::atomic<uint64_t>& counter, uint64_t want, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (counter.load() < want) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

class ProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterConfig c;
    c.transport = "tcp";
    c.workers = 2;
    c.servers = 2;
    c.partition_bytes = 64;
    c.max_message_bytes = kMaxMessageBytes;
    cluster_ = StartCluster(c);
    ASSERT_NE(cluster_, nullptr);
    server_ = cluster_->server(0);
    ASSERT_TRUE(absl::StartsWith(server_->endpoint(), "tcp://")) << server_->endpoint();
  }

  // Sends `frames` from `peer` and expects the server to count one more rejected message
  // and to answer with an Error (request id `id`) whose message mentions `reason`.
  void ExpectRejected(RawPeer& peer, const std::vector<std::string>& frames,
                      absl::string_view reason, uint64_t id = 0) {
    const uint64_t before = server_->stats().rejected.load();
    peer.SendFrames(frames);
    EXPECT_TRUE(WaitForCount(server_->stats().rejected, before + 1, kQuick))
        << "the server did not reject a message that should fail with '" << reason << "'";
    auto reply = peer.Receive(kQuick);
    ASSERT_TRUE(reply.has_value()) << "no reply to a message rejected for '" << reason << "'";
    ASSERT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
    EXPECT_EQ(reply->id(), id);
    EXPECT_TRUE(Mentions(reply->error().message(), reason));
  }

  static constexpr size_t kMaxMessageBytes = 1 << 20;
  Context ctx_;  // the raw peers' (declared first: destroyed after them)
  std::unique_ptr<LocalCluster> cluster_;
  Server* server_ = nullptr;
};

TEST_F(ProtocolTest, ServerRejectsMalformedMessagesAndKeepsServing) {
  {
    RawPeer peer(ctx_, server_->endpoint());
    ExpectRejected(peer, {"\x07garbage"}, "malformed");
    ExpectRejected(peer, {""}, "without a body");
    ExpectRejected(peer, {"a", "b", "c", "d"}, "frames");
    ExpectRejected(peer, {Hello(0xdeadbeef, kProtocolVersion).SerializeAsString()}, "magic");
    ExpectRejected(peer, {Hello(kMagic, 99).SerializeAsString()}, "version");
    ExpectRejected(peer, {Hello(kMagic, kProtocolVersion, Role::kServer).SerializeAsString()},
                   "only workers");
    // Nothing above counted as a handshake.
    ExpectRejected(peer, {DataRequest(5, 4).SerializeAsString(), std::string(16, '\0')},
                   "handshake", 5);
  }
  {
    RawPeer peer(ctx_, server_->endpoint());
    ASSERT_TRUE(peer.Authenticate(wire::ROLE_WORKER, 0));
    // Truncated: 4 float32 elements announced, 12 bytes sent.
    ExpectRejected(peer, {DataRequest(6, 4).SerializeAsString(), std::string(12, '\0')}, "bytes",
                   6);
    ExpectRejected(peer,
                   {DataRequest(7, 4, /*dtype=*/99).SerializeAsString(), std::string(16, '\0')},
                   "dtype", 7);
    ExpectRejected(peer, {DataRequest(8, 4).SerializeAsString()}, "payload", 8);
    wire::Envelope heartbeat;
    heartbeat.set_id(9);
    heartbeat.mutable_heartbeat();
    ExpectRejected(peer, {heartbeat.SerializeAsString()}, "unexpected", 9);
  }
  {
    // Larger than max_message_bytes: ZeroMQ refuses it and drops the connection, so the
    // server never sees it (no reply, nothing counted).
    RawPeer peer(ctx_, server_->endpoint());
    ASSERT_TRUE(peer.WaitForEvent(ZMQ_EVENT_CONNECTED, kQuick));
    ASSERT_TRUE(peer.Authenticate(wire::ROLE_WORKER, 0));
    wire::Envelope heartbeat;  // answered once the Auth before it was handled
    heartbeat.set_id(11);
    heartbeat.mutable_heartbeat();
    ExpectRejected(peer, {heartbeat.SerializeAsString()}, "unexpected", 11);
    const uint64_t requests = server_->stats().requests.load();
    const uint64_t count = 2 * kMaxMessageBytes / 4;
    peer.SendEnvelope(DataRequest(10, count), std::string(count * 4, '\1'));
    EXPECT_TRUE(peer.WaitForEvent(ZMQ_EVENT_DISCONNECTED, kQuick))
        << "ZeroMQ kept a connection that sent a message over max_message_bytes";
    EXPECT_FALSE(peer.Receive(absl::Milliseconds(300)).has_value());
    EXPECT_EQ(server_->stats().requests.load(), requests);
  }
  // Both servers still serve the real workers.
  ExpectExactSums(*cluster_, "good", DType::kFloat32, 1000);
  cluster_->RunOnWorkers(
      [](int rank, KVStore* kv) { EXPECT_OK(kv->Barrier()) << "worker " << rank; });
}

TEST_F(ProtocolTest, SchedulerRejectsMalformedMessagesAndKeepsRunning) {
  const std::string endpoint = cluster_->options().scheduler_endpoint;
  ASSERT_TRUE(absl::StartsWith(endpoint, "tcp://")) << endpoint;
  {
    RawPeer peer(ctx_, endpoint);
    // Undecodable: dropped without a reply; the scheduler goes on (it answers the Hello
    // that follows, which ZeroMQ delivers after them).
    peer.SendFrames({"\x07garbage"});
    peer.SendFrames({"a", "b", "c", "d"});
    peer.SendEnvelope(Hello(kMagic, 99));
    auto reply = peer.Receive(kQuick);
    // (Should the scheduler ever answer undecodable messages too, skip those answers.)
    for (int i = 0; i < 2 && reply && reply->body_case() == wire::Envelope::kError &&
                    !absl::StrContains(reply->error().message(), "version");
         ++i) {
      reply = peer.Receive(kQuick);
    }
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
    EXPECT_TRUE(Mentions(reply->error().message(), "version"));
    peer.SendEnvelope(Hello(0xdeadbeef, kProtocolVersion));
    reply = peer.Receive(kQuick);
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
    EXPECT_TRUE(Mentions(reply->error().message(), "magic"));
    wire::Envelope barrier;
    barrier.set_id(3);
    barrier.mutable_barrier()->set_group(wire::GROUP_WORKERS);
    peer.SendEnvelope(barrier);
    reply = peer.Receive(kQuick);
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
    EXPECT_EQ(reply->id(), 3u);
    EXPECT_TRUE(Mentions(reply->error().message(), "handshake"));
  }
  {
    // A node that turns up after the job started cannot join it.
    RawPeer peer(ctx_, endpoint);
    ASSERT_TRUE(peer.Authenticate(wire::ROLE_WORKER, -1));
    wire::Envelope reg;
    reg.set_id(4);
    reg.mutable_register_()->set_role(wire::ROLE_WORKER);
    reg.mutable_register_()->set_requested_rank(-1);
    peer.SendEnvelope(reg);
    auto reply = peer.Receive(kQuick);
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
    EXPECT_EQ(reply->id(), 4u);
    EXPECT_TRUE(Mentions(reply->error().message(), "already started"));
  }
  // The scheduler still runs the job: barriers go through it, and a scheduler that had
  // stopped would fail them within the heartbeat timeout.
  cluster_->RunOnWorkers(
      [](int rank, KVStore* kv) { EXPECT_OK(kv->Barrier()) << "worker " << rank; });
  ExpectExactSums(*cluster_, "good", DType::kFloat32, 1000);
}

}  // namespace
}  // namespace hybridps::testing
