// The transport: ZeroMQ sockets over tcp://, ipc:// or inproc:// (so a whole cluster can
// run as threads of one process), with zero-copy sends of tensor payloads.
//
// Threading: a Socket belongs to the one thread that created it (ZeroMQ sockets are not
// thread-safe). Context is thread-safe. Waker lets other threads wake a socket's owner.
// "Would block" is not failure: Recv returns an empty optional when nothing is ready.
#ifndef HYBRIDPS_COMMON_TRANSPORT_H_
#define HYBRIDPS_COMMON_TRANSPORT_H_

#include <zmq.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hybridps {

// A ZeroMQ context. Shared by every socket of a process (or of an in-process cluster,
// which inproc:// requires).
class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void* raw() const { return ctx_; }

 private:
  void* ctx_;
};

// One frame (zmq_msg_t). Move-only.
class Frame {
 public:
  Frame();
  explicit Frame(absl::string_view bytes);  // copies
  // Zero-copy: ZeroMQ reads `data` until it calls free_fn(data, hint) (free_fn may be
  // null when the owner guarantees the memory outlives the send).
  Frame(void* data, size_t size, zmq_free_fn* free_fn, void* hint);
  // An uninitialised buffer of `size` bytes owned by the frame.
  static Frame Allocate(size_t size);
  ~Frame();
  Frame(Frame&& other) noexcept;
  Frame& operator=(Frame&& other) noexcept;
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  // Another frame sharing this one's bytes (reference-counted for large frames, copied
  // for tiny ones). Neither may be modified afterwards while both are alive.
  Frame Share();
  void* data() { return zmq_msg_data(&msg_); }
  const void* data() const { return zmq_msg_data(const_cast<zmq_msg_t*>(&msg_)); }
  size_t size() const { return zmq_msg_size(const_cast<zmq_msg_t*>(&msg_)); }
  absl::string_view view() const {
    return {static_cast<const char*>(data()), size()};
  }
  zmq_msg_t* raw() { return &msg_; }

 private:
  zmq_msg_t msg_;
};

// A multi-part message.
using Message = std::vector<Frame>;

enum class SocketType { kRouter, kDealer };

class Socket {
 public:
  // Options applied to every socket: no high-water mark (flow control is ours: credits),
  // ROUTER_MANDATORY (unroutable sends are errors, not silent drops), a send linger of
  // `linger`, and inbound messages larger than max_message_bytes refused by ZeroMQ
  // (the peer is disconnected).
  static absl::StatusOr<std::unique_ptr<Socket>> Create(const Context& ctx, SocketType type,
                                                        size_t max_message_bytes,
                                                        absl::Duration linger =
                                                            absl::Seconds(2));
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Binds; for tcp:// with port 0 or "*" an ephemeral port is chosen. Returns the
  // endpoint actually bound (e.g. "tcp://127.0.0.1:41234").
  absl::StatusOr<std::string> Bind(const std::string& endpoint);
  absl::Status Connect(const std::string& endpoint);
  // A DEALER's identity, set before Connect.
  absl::Status SetIdentity(absl::string_view id);

  // Sends every frame of `msg` (consumed). Never blocks (no high-water mark). Fails with
  // Unavailable when a ROUTER cannot route to the first frame's peer.
  absl::Status Send(Message& msg);
  // Receives one whole message if one is ready, else nullopt.
  absl::StatusOr<std::optional<Message>> TryRecv();

  void* raw() const { return sock_; }

 private:
  explicit Socket(void* sock) : sock_(sock) {}
  void* sock_;
};

// Wakes a thread blocked in Poll from any other thread (an eventfd).
class Waker {
 public:
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  void Wake();   // any thread
  void Drain();  // the polling thread, after it woke
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Blocks until one of the sockets or fds is readable or the timeout passed. No busy
// polling: an idle process sleeps in the kernel.
class Poller {
 public:
  int Add(Socket* s);  // returns an index
  int AddFd(int fd);
  // Returns the number of ready items (0 on timeout). EINTR counts as 0.
  absl::StatusOr<int> Poll(absl::Duration timeout);
  bool Readable(int index) const { return (items_[index].revents & ZMQ_POLLIN) != 0; }

 private:
  std::vector<zmq_pollitem_t> items_;
};

// "tcp://127.0.0.1:5000" -> "127.0.0.1". Empty for non-tcp endpoints.
std::string EndpointHost(absl::string_view endpoint);

// The tcp endpoint a process binds to take its peers' connections, port chosen by the
// system: `interface` (HYBRIDPS_INTERFACE: an address or an interface name) when set,
// else loopback when the job's scheduler (its endpoint) is on loopback or not on tcp (a
// local job), else every interface.
std::string PeerBindEndpoint(absl::string_view interface,
                             absl::string_view scheduler_endpoint);
// `bound` (Socket::Bind's answer) as peers on other hosts dial it: a wildcard address
// becomes this host's name.
std::string DialableEndpoint(absl::string_view bound);

// The numeric address of `host` (this host's name) that a listener of this process can
// bind: the first of its addresses that is not a loopback one, else a loopback one (only
// peers on this machine reach it; *loopback_only is then set). FailedPrecondition, naming
// the name and what it resolves to, when it resolves to no address of this host: the
// caller should say to set HYBRIDPS_INTERFACE.
absl::StatusOr<std::string> LocalAddressOf(const std::string& host, bool* loopback_only);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_TRANSPORT_H_
