// Strangers on a running job's ports: processes that speak the protocol but do not hold
// the job's token (none, a wrong one, or a recording of a real handshake). Every attempt
// is refused at the handshake, before anything is read, kept or answered beyond an error,
// and the job goes on with exact sums.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/auth.h"
#include "common/hybridps.pb.h"
#include "common/wire.h"
#include "common/partition.h"
#include "server/server.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/raw_peer.h"
#include "tests/status_matchers.h"
#include "tests/cluster/tensor_fill.h"

namespace hybridps::testing {
namespace {

constexpr absl::Duration kQuick = absl::Seconds(5);
constexpr char kToken[] = "the job's own token";

class StrangerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(0); }
  // A job of 2 workers and 2 servers on loopback TCP, its links encrypted or not.
  void Start(int encrypt) {
    cluster_.reset();
    ClusterConfig c;
    c.encrypt = encrypt;
    c.transport = "tcp";
    c.workers = 2;
    c.servers = 2;
    c.partition_bytes = 64;
    c.job_token = kToken;
    auto cluster = LocalCluster::Start(c);
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
  }

  // Every worker push_pulls `name` twice; both sums must be exact.
  void ExpectExactSums(const std::string& name) {
    const int n = cluster_->num_workers();
    cluster_->RunOnWorkers([&](int rank, KVStore* kv) {
      Buffer b(DType::kFloat32, 1000);
      for (int round = 0; round < 2; ++round) {
        b.Fill(rank, round, 3);
        ASSERT_OK(kv->PushPull(name, b.view(), b.view())) << "worker " << rank;
        for (size_t i = 0; i < 1000; ++i) {
          double want = 0;
          for (int r = 0; r < n; ++r) want += Value(i, r, round, 3);
          ASSERT_EQ(b.at(i), want) << name << " element " << i << " round " << round;
        }
      }
    });
  }

  std::string Scheduler() const { return cluster_->options().scheduler_endpoint; }
  std::string Server(int s) const { return cluster_->server(s)->endpoint(); }

  Context ctx_;  // the strangers' (declared first: destroyed after them)
  std::unique_ptr<LocalCluster> cluster_;
};

// What a stranger could ask for, had it got in: every request of the scheduler's and the
// servers' protocols that reads, writes or changes anything.
std::vector<wire::Envelope> SchedulerRequests() {
  std::vector<wire::Envelope> v(6);
  v[0].mutable_kv_set()->set_key("stolen");
  v[0].mutable_kv_set()->set_value("x");
  v[1].mutable_kv_get()->set_key("stolen");
  v[2].mutable_kv_wait()->add_keys("stolen");
  v[3].mutable_barrier()->set_group(wire::GROUP_WORKERS);
  v[4].mutable_finalize();
  v[5].mutable_register_()->set_role(wire::ROLE_WORKER);
  for (size_t i = 0; i < v.size(); ++i) v[i].set_id(100 + i);
  return v;
}

std::vector<std::pair<wire::Envelope, std::string>> ServerRequests() {
  std::vector<std::pair<wire::Envelope, std::string>> v;
  wire::Envelope push;
  auto* req = push.mutable_data_request();
  req->set_name("w");
  req->set_key(TensorKey("w"));
  req->set_op(wire::OP_PUSHPULL);
  req->set_count(4);
  req->set_total_count(4);
  req->set_round(uint64_t{1} << 62);  // a round jump, had it been read
  v.emplace_back(push, std::string(16, '\x7f'));
  wire::Envelope dump;
  dump.mutable_optimizer_request()->set_dump_from(0);
  v.emplace_back(dump, "");
  wire::Envelope configure;
  configure.mutable_optimizer_request()->mutable_configure();
  v.emplace_back(configure, "");
  wire::Envelope load;
  load.mutable_optimizer_request()->mutable_load();
  v.emplace_back(load, "");
  for (size_t i = 0; i < v.size(); ++i) v[i].first.set_id(200 + i);
  return v;
}

// Without the token, or with another one: the handshake fails on the stranger's side
// (the server proves a token it does not hold), a forged Auth is refused, and every
// request after it is refused as unauthenticated, at the scheduler and at each server.
TEST_F(StrangerTest, WithoutTheTokenNothingIsAccepted) {
  for (const std::string token : {"", "a guess"}) {
    SCOPED_TRACE(token);
    for (const std::string& endpoint : {Scheduler(), Server(0), Server(1)}) {
      SCOPED_TRACE(endpoint);
      const bool scheduler = endpoint == Scheduler();
      RawPeer stranger(ctx_, endpoint);
      auto handshake = stranger.Authenticate(wire::ROLE_WORKER, 0, token);
      ASSERT_FALSE(handshake);
      EXPECT_TRUE(Mentions(handshake.message(), "does not hold this job's token"));
      // It sends an Auth anyway, with a made-up proof.
      ClientHandshake guess(JobKey(token), wire::ROLE_WORKER, 0);
      wire::Envelope hello = guess.Hello();
      stranger.SendEnvelope(hello);
      auto ack = stranger.Receive(kQuick);
      ASSERT_TRUE(ack && ack->body_case() == wire::Envelope::kHelloAck);
      wire::Envelope forged;
      forged.set_id(7);
      auto* a = forged.mutable_auth();
      a->set_client_nonce(hello.hello().nonce());
      a->set_server_nonce(ack->hello_ack().nonce());
      a->set_role(wire::ROLE_WORKER);
      a->set_proof(std::string(32, 'p'));
      stranger.SendEnvelope(forged);
      auto reply = stranger.Receive(kQuick);
      ASSERT_TRUE(reply && reply->body_case() == wire::Envelope::kError);
      EXPECT_TRUE(Mentions(reply->error().message(), "without the job's token"));
      std::vector<std::pair<wire::Envelope, std::string>> requests;
      if (scheduler) {
        for (wire::Envelope& e : SchedulerRequests()) requests.emplace_back(e, "");
      } else {
        requests = ServerRequests();
      }
      for (auto& [env, payload] : requests) {
        if (payload.empty()) {
          stranger.SendEnvelope(env);
        } else {
          stranger.SendEnvelope(env, payload);
        }
        reply = stranger.Receive(kQuick);
        ASSERT_TRUE(reply.has_value()) << env.DebugString();
        ASSERT_EQ(reply->body_case(), wire::Envelope::kError) << reply->DebugString();
        EXPECT_EQ(reply->id(), env.id());
        EXPECT_TRUE(Mentions(reply->error().message(), "handshake")) << env.DebugString();
      }
    }
  }
  ExpectExactSums("after.strangers");
}

// A recording of a real handshake (a Hello and its Auth, by a process that held the
// token) replayed on a new connection is refused: the server's nonce was bound to the
// connection the recording came from.
TEST_F(StrangerTest, AReplayedHandshakeIsRefused) {
  for (const std::string& endpoint : {Scheduler(), Server(0)}) {
    SCOPED_TRACE(endpoint);
    const ClientHandshake real(JobKey(kToken), wire::ROLE_WORKER, 0);
    wire::Envelope recorded_auth;
    {
      RawPeer member(ctx_, endpoint);
      member.SendEnvelope(real.Hello());
      auto ack = member.Receive(kQuick);
      ASSERT_TRUE(ack && ack->body_case() == wire::Envelope::kHelloAck);
      auto auth = real.Answer(ack->hello_ack(), "it");
      ASSERT_OK(auth);
      recorded_auth = *auth;
      member.SendEnvelope(recorded_auth);  // accepted: no reply
      EXPECT_FALSE(member.Receive(absl::Milliseconds(200)).has_value());
    }
    for (bool hello_first : {false, true}) {
      RawPeer replayer(ctx_, endpoint);
      if (hello_first) {
        replayer.SendEnvelope(real.Hello());
        ASSERT_TRUE(replayer.Receive(kQuick).has_value());
      }
      recorded_auth.set_id(9);
      replayer.SendEnvelope(recorded_auth);
      auto reply = replayer.Receive(kQuick);
      ASSERT_TRUE(reply && reply->body_case() == wire::Envelope::kError);
      EXPECT_TRUE(Mentions(reply->error().message(), "replayed"));
      wire::Envelope kv;
      kv.set_id(10);
      kv.mutable_kv_get()->set_key("x");
      replayer.SendEnvelope(kv);
      reply = replayer.Receive(kQuick);
      ASSERT_TRUE(reply && reply->body_case() == wire::Envelope::kError);
      EXPECT_TRUE(Mentions(reply->error().message(), "handshake"));
    }
  }
  ExpectExactSums("after.replay");
}

// With encryption on, a process without the token, or with it but without encryption,
// does not even complete the transport's handshake: its Hello is never read. One with
// both joins.
TEST_F(StrangerTest, EncryptedLinksAnswerOnlyTheJobsOwn) {
  Start(1);
  ASSERT_NE(cluster_, nullptr);
  Options wrong = cluster_->options();
  wrong.job_token = "a guess";
  Options clear = cluster_->options();
  clear.encrypt = 0;
  for (const std::string& endpoint : {Scheduler(), Server(0)}) {
    SCOPED_TRACE(endpoint);
    RawPeer stranger(ctx_, endpoint, &wrong);
    // (A wait that passes even if an answer were merely slow: it cannot fail falsely.)
    auto handshake = stranger.Authenticate(wire::ROLE_WORKER, 0, "a guess", absl::Seconds(1));
    ASSERT_FALSE(handshake);
    EXPECT_TRUE(Mentions(handshake.message(), "no answer"));
    RawPeer plain(ctx_, endpoint, &clear);
    handshake = plain.Authenticate(wire::ROLE_WORKER, 0, kToken, absl::Seconds(1));
    ASSERT_FALSE(handshake);
    EXPECT_TRUE(Mentions(handshake.message(), "no answer"));
    RawPeer member(ctx_, endpoint, &cluster_->options());
    EXPECT_TRUE(member.Authenticate(wire::ROLE_WORKER, 0, kToken));
  }
  ExpectExactSums("encrypted");
}

}  // namespace
}  // namespace hybridps::testing
