// The transport ceiling hybridps-bench prints beside push_pull: a plain ZeroMQ echo over
// loopback TCP between two threads of the bench process.
#ifndef HYBRIDPS_BENCH_ZMQ_ECHO_H_
#define HYBRIDPS_BENCH_ZMQ_ECHO_H_

#include <zmq.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace hybridps::bench {

using Clock = std::chrono::steady_clock;
inline double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// A DEALER (this thread) and a ROUTER (the echo thread, which sends every message back)
// over tcp://127.0.0.1, in a context and with socket options like common/transport.cc's:
// 2 I/O threads, no high-water marks, 4 MiB kernel buffers, zero-copy sends.
class ZmqEcho {
 public:
  static absl::StatusOr<std::unique_ptr<ZmqEcho>> Start() {
    std::unique_ptr<ZmqEcho> e(new ZmqEcho());
    void* router = zmq_socket(e->ctx_, ZMQ_ROUTER);
    e->dealer_ = zmq_socket(e->ctx_, ZMQ_DEALER);
    if (router == nullptr || e->dealer_ == nullptr) return Error("zmq_socket");
    for (void* s : {router, e->dealer_}) {
      int zero = 0, buf = 4 << 20, timeout_ms = 30000;
      zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_SNDBUF, &buf, sizeof buf);
      zmq_setsockopt(s, ZMQ_RCVBUF, &buf, sizeof buf);
      zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    }
    char endpoint[256];
    size_t len = sizeof endpoint;
    if (zmq_bind(router, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0) {
      zmq_close(router);
      return Error("bind tcp://127.0.0.1:*");
    }
    if (zmq_connect(e->dealer_, endpoint) != 0) {
      zmq_close(router);
      return Error("connect");
    }
    // The ROUTER is handed to the echo thread here and used by it only.
    e->echo_ = std::thread([router] { EchoLoop(router); });
    return e;
  }

  ~ZmqEcho() {
    if (dealer_ != nullptr) zmq_close(dealer_);
    zmq_ctx_shutdown(ctx_);  // the echo thread's recv returns ETERM
    if (echo_.joinable()) echo_.join();
    zmq_ctx_term(ctx_);
  }

  // Sends `size` bytes from `data` (zero-copy) as messages of at most `chunk` bytes, all
  // at once, and waits for every echo; returns the round trip time. The echoes are
  // checked after the clock stopped.
  absl::StatusOr<double> RoundTripUs(const unsigned char* data, size_t size, size_t chunk) {
    const size_t n = std::max<size_t>(1, (size + chunk - 1) / chunk);
    // Initialised in place and never moved: a zmq_msg_t must not be copied bitwise.
    std::unique_ptr<zmq_msg_t[]> in(new zmq_msg_t[n]);
    for (size_t i = 0; i < n; ++i) zmq_msg_init(&in[i]);
    auto part = [&](size_t i) { return std::min(chunk, size - i * chunk); };
    int rc = 0;
    const Clock::time_point t0 = Clock::now();
    for (size_t i = 0; i < n && rc >= 0; ++i) {
      zmq_msg_t out;
      zmq_msg_init_data(&out, const_cast<unsigned char*>(data) + i * chunk, part(i), &NoFree,
                        nullptr);
      rc = zmq_msg_send(&out, dealer_, 0);
      zmq_msg_close(&out);  // empty once sent
    }
    for (size_t i = 0; i < n && rc >= 0; ++i) rc = zmq_msg_recv(&in[i], dealer_, 0);
    const Clock::time_point t1 = Clock::now();
    absl::Status s;
    if (rc < 0) s = Error("echo send/recv");
    for (size_t i = 0; i < n && s.ok(); ++i) {
      if (zmq_msg_size(&in[i]) != part(i) ||
          (part(i) > 0 && std::memcmp(zmq_msg_data(&in[i]), data + i * chunk, part(i)) != 0)) {
        s = absl::DataLossError(absl::StrCat("the ZeroMQ echo of message ", i, " (", part(i),
                                             " bytes) came back different"));
      }
    }
    for (size_t i = 0; i < n; ++i) zmq_msg_close(&in[i]);
    if (!s.ok()) return s;
    return Micros(t1 - t0);
  }

 private:
  ZmqEcho() : ctx_(zmq_ctx_new()) {
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 2);
    zmq_ctx_set(ctx_, ZMQ_BLOCKY, 0);
  }
  // The sender keeps the bytes alive until the echo thread is joined.
  static void NoFree(void*, void*) {}
  static absl::Status Error(absl::string_view what) {
    return absl::UnavailableError(
        absl::StrCat("ZeroMQ reference: ", what, ": ", zmq_strerror(zmq_errno())));
  }
  // Runs on the echo thread until the context is shut down. Our DEALER sends one frame,
  // so the ROUTER receives [routing id][body]; anything else is dropped.
  static void EchoLoop(void* router) {
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    while (true) {
      if (zmq_msg_recv(&id, router, 0) < 0) {
        if (zmq_errno() == EAGAIN || zmq_errno() == EINTR) continue;
        break;  // ETERM
      }
      if (!zmq_msg_more(&id)) continue;
      if (zmq_msg_recv(&body, router, 0) < 0) break;
      if (zmq_msg_more(&body)) {
        while (zmq_msg_more(&body) && zmq_msg_recv(&body, router, 0) >= 0) {
        }
        continue;
      }
      if (zmq_msg_send(&id, router, ZMQ_SNDMORE) < 0 || zmq_msg_send(&body, router, 0) < 0) {
        break;
      }
    }
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    zmq_close(router);
  }

  void* ctx_;
  void* dealer_ = nullptr;
  std::thread echo_;
};

}  // namespace hybridps::bench

#endif  // HYBRIDPS_BENCH_ZMQ_ECHO_H_
