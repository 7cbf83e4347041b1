// hybridps-test-stranger: a process that speaks hybridps's protocol without the job's
// token, for test_multiproc.py. Against ENDPOINT (a scheduler's or a server's), COUNT
// times, on 8 connections in turn: a Hello, an Auth with a made-up proof, a push of a
// 64 KiB partition at a far-off round, and a key-value set; after each message it waits
// for the reply (5 s at most), so that nothing piles up in either side's queues.
//
//   hybridps-test-stranger ENDPOINT COUNT
//
// Prints "stranger: N messages, N replies, A accepted" and exits 0 when none of its
// messages was accepted (every reply a HelloAck or an error), 1 otherwise, 2 for bad
// arguments or a reply that never came.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "common/hybridps.pb.h"
#include "common/partition.h"
#include "common/transport.h"
#include "common/wire.h"

namespace {

using hybridps::Message;
using hybridps::Socket;
namespace wire = hybridps::wire;

std::optional<wire::Envelope> Exchange(Socket& s, const wire::Envelope& env,
                                       const std::string& payload) {
  Message msg = hybridps::Encode("", env);
  if (!payload.empty()) msg.emplace_back(payload);
  if (!s.Send(msg).ok()) return std::nullopt;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  hybridps::Poller poller;
  poller.Add(&s);
  while (absl::Now() < deadline) {
    auto n = poller.Poll(deadline - absl::Now());
    if (!n.ok() || *n == 0) continue;
    auto got = s.TryRecv();
    if (!got.ok() || !*got) continue;
    auto d = hybridps::Decode(std::move(**got), /*from_router=*/false);
    if (d.ok()) return d->env;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (argc != 3 || !absl::SimpleAtoi(argv[2], &count) || count < 1) {
    std::fprintf(stderr, "usage: hybridps-test-stranger ENDPOINT COUNT\n");
    return 2;
  }
  hybridps::Context ctx;
  std::vector<std::unique_ptr<Socket>> conns;
  for (int i = 0; i < 8; ++i) {
    auto s = Socket::Create(ctx, hybridps::SocketType::kDealer, size_t{1} << 30,
                            absl::ZeroDuration());
    if (!s.ok() || !(*s)->Connect(argv[1]).ok()) return 2;
    conns.push_back(std::move(*s));
  }
  std::vector<std::pair<wire::Envelope, std::string>> script(4);
  script[0].first = hybridps::MakeHello(wire::ROLE_WORKER, 0);
  script[0].first.mutable_hello()->set_nonce(std::string(32, 'c'));
  auto* auth = script[1].first.mutable_auth();
  auth->set_client_nonce(std::string(32, 'c'));
  auth->set_server_nonce(std::string(32, 's'));
  auth->set_role(wire::ROLE_WORKER);
  auth->set_proof(std::string(32, 'p'));
  auto* push = script[2].first.mutable_data_request();
  push->set_name("w");
  push->set_key(hybridps::TensorKey("w"));
  push->set_op(wire::OP_PUSHPULL);
  push->set_count(16384);
  push->set_total_count(16384);
  push->set_round(uint64_t{1} << 62);
  script[2].second = std::string(16384 * 4, '\x7f');
  script[3].first.mutable_kv_set()->set_key("stolen");
  script[3].first.mutable_kv_set()->set_value(std::string(1024, 'v'));
  int sent = 0, replies = 0, accepted = 0;
  for (int i = 0; i < count; ++i) {
    Socket& s = *conns[i % conns.size()];
    for (auto& [env, payload] : script) {
      env.set_id(static_cast<uint64_t>(++sent));
      auto reply = Exchange(s, env, payload);
      if (!reply) {
        std::printf("stranger: no reply to message %d\n", sent);
        return 2;
      }
      ++replies;
      const auto body = reply->body_case();
      if (body != wire::Envelope::kHelloAck && body != wire::Envelope::kError) ++accepted;
    }
  }
  std::printf("stranger: %d messages, %d replies, %d accepted\n", sent, replies, accepted);
  return accepted == 0 ? 0 : 1;
}
