// Test helpers for a peer that speaks the wire protocol by hand (a stranger, a malformed
// client, a registration that must be refused): a DEALER with a ZeroMQ monitor.
#ifndef HYBRIDPS_TESTS_CLUSTER_RAW_PEER_H_
#define HYBRIDPS_TESTS_CLUSTER_RAW_PEER_H_

#include <gtest/gtest.h>
#include <zmq.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/hybridps.pb.h"
#include "common/auth.h"
#include "common/transport.h"
#include "common/wire.h"
#include "tests/cluster/local_cluster.h"
#include "tests/status_matchers.h"

namespace hybridps::testing {

// A hand-driven DEALER connected to a node's tcp endpoint, with a ZeroMQ monitor that
// reports when the connection is dropped.
class RawPeer {
 public:
  // `curve`: connect with its HYBRIDPS_ENCRYPT setting and job token (EncryptAsClient).
  RawPeer(const Context& ctx, const std::string& endpoint, const Options* curve = nullptr) {
    static std::atomic<int> counter{0};
    auto sock = Socket::Create(ctx, SocketType::kDealer, size_t{1} << 30, absl::ZeroDuration());
    EXPECT_OK(sock);
    sock_ = std::move(*sock);
    const std::string monitor_endpoint = absl::StrCat("inproc://raw-peer-monitor-", counter++);
    EXPECT_EQ(zmq_socket_monitor(sock_->raw(), monitor_endpoint.c_str(),
                                 ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED),
              0);
    monitor_ = zmq_socket(ctx.raw(), ZMQ_PAIR);
    int zero = 0;
    zmq_setsockopt(monitor_, ZMQ_LINGER, &zero, sizeof zero);
    EXPECT_EQ(zmq_connect(monitor_, monitor_endpoint.c_str()), 0);
    if (curve != nullptr) {
      EXPECT_OK(EncryptAsClient(*sock_, *curve, endpoint));
    }
    EXPECT_OK(sock_->Connect(endpoint));
  }
  ~RawPeer() {
    zmq_socket_monitor(sock_->raw(), nullptr, 0);
    zmq_close(monitor_);
    sock_.reset();
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  void SendFrames(const std::vector<std::string>& frames) {
    Message msg;
    for (const std::string& f : frames) msg.emplace_back(f);
    ASSERT_OK(sock_->Send(msg));
  }
  void SendEnvelope(const wire::Envelope& env, std::optional<std::string> payload = {}) {
    std::vector<std::string> frames = {env.SerializeAsString()};
    if (payload) frames.push_back(*payload);
    SendFrames(frames);
  }
  // The next message as an envelope, or nullopt if none came within `timeout`.
  std::optional<wire::Envelope> Receive(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      Poller poller;
      poller.Add(sock_.get());
      auto n = poller.Poll(deadline - absl::Now());
      if (!n.ok() || *n == 0) continue;
      auto msg = sock_->TryRecv();
      if (!msg.ok() || !*msg) continue;
      auto d = Decode(std::move(**msg), /*from_router=*/false);
      EXPECT_OK(d);
      if (d.ok()) return d->env;
    }
    return std::nullopt;
  }
  // The job-token handshake (common/auth.h) as `role` `rank` holding `token`: succeeds
  // once the server proved the same token and the Auth is sent, else says what came.
  ::testing::AssertionResult Authenticate(wire::NodeRole role, int rank,
                                          const std::string& token = kTestJobToken,
                                          absl::Duration wait = absl::Seconds(5)) {
    const ClientHandshake hs(JobKey(token), role, rank);
    SendEnvelope(hs.Hello());
    auto ack = Receive(wait);
    if (!ack) return ::testing::AssertionFailure() << "no answer to the Hello";
    if (ack->body_case() != wire::Envelope::kHelloAck) {
      return ::testing::AssertionFailure() << ack->DebugString();
    }
    auto auth = hs.Answer(ack->hello_ack(), "the peer");
    if (!auth.ok()) return ::testing::AssertionFailure() << auth.status();
    SendEnvelope(*auth);
    return ::testing::AssertionSuccess();
  }
  // Waits for the monitor to report ZeroMQ event `event` on the connection.
  bool WaitForEvent(int event, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      zmq_pollitem_t item{monitor_, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 50) <= 0) continue;
      Frame head, address;
      if (zmq_msg_recv(head.raw(), monitor_, 0) < 0) continue;
      if (zmq_msg_more(head.raw())) zmq_msg_recv(address.raw(), monitor_, 0);
      uint16_t id = 0;
      if (head.size() >= sizeof id) std::memcpy(&id, head.data(), sizeof id);
      if (id == event) return true;
    }
    return false;
  }

 private:
  std::unique_ptr<Socket> sock_;
  void* monitor_ = nullptr;
};

}  // namespace hybridps::testing

#endif  // HYBRIDPS_TESTS_CLUSTER_RAW_PEER_H_
