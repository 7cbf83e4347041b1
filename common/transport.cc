#include "common/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hybridps {
namespace {

absl::Status ZmqError(absl::string_view what) {
  int e = zmq_errno();
  return absl::UnavailableError(absl::StrCat(what, ": ", zmq_strerror(e)));
}

}  // namespace

Context::Context() : ctx_(zmq_ctx_new()) {
  // Two I/O threads: ZeroMQ binds each connection to one of them, so a worker talking to
  // several servers (or a server to several workers) moves their traffic in parallel. A
  // single connection's push and pull share one thread either way.
  zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 2);
  zmq_ctx_set(ctx_, ZMQ_BLOCKY, 0);
}
Context::~Context() { zmq_ctx_term(ctx_); }

Frame::Frame() { zmq_msg_init(&msg_); }
Frame::Frame(absl::string_view bytes) {
  zmq_msg_init_size(&msg_, bytes.size());
  if (!bytes.empty()) std::memcpy(zmq_msg_data(&msg_), bytes.data(), bytes.size());
}
Frame::Frame(void* data, size_t size, zmq_free_fn* free_fn, void* hint) {
  zmq_msg_init_data(&msg_, data, size, free_fn, hint);
}
Frame Frame::Allocate(size_t size) {
  Frame f;
  zmq_msg_close(&f.msg_);
  zmq_msg_init_size(&f.msg_, size);
  return f;
}
Frame::~Frame() { zmq_msg_close(&msg_); }
Frame::Frame(Frame&& other) noexcept {
  zmq_msg_init(&msg_);
  zmq_msg_move(&msg_, &other.msg_);
}
Frame& Frame::operator=(Frame&& other) noexcept {
  if (this != &other) zmq_msg_move(&msg_, &other.msg_);
  return *this;
}
Frame Frame::Share() {
  Frame f;
  zmq_msg_copy(&f.msg_, &msg_);
  return f;
}

absl::StatusOr<std::unique_ptr<Socket>> Socket::Create(const Context& ctx, SocketType type,
                                                       size_t max_message_bytes,
                                                       absl::Duration linger) {
  void* s = zmq_socket(ctx.raw(), type == SocketType::kRouter ? ZMQ_ROUTER : ZMQ_DEALER);
  if (s == nullptr) return ZmqError("zmq_socket");
  std::unique_ptr<Socket> sock(new Socket(s));
  int zero = 0, one = 1;
  int linger_ms = static_cast<int>(absl::ToInt64Milliseconds(linger));
  int64_t max_size = static_cast<int64_t>(max_message_bytes);
  if (zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero) != 0 ||
      zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
      zmq_setsockopt(s, ZMQ_LINGER, &linger_ms, sizeof linger_ms) != 0 ||
      zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max_size, sizeof max_size) != 0) {
    return ZmqError("zmq_setsockopt");
  }
  if (type == SocketType::kRouter &&
      zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0) {
    return ZmqError("zmq_setsockopt(ROUTER_MANDATORY)");
  }
  // Large kernel buffers keep a 4 MiB partition flowing without waiting for the reader.
  int buf = 4 << 20;
  zmq_setsockopt(s, ZMQ_SNDBUF, &buf, sizeof buf);
  zmq_setsockopt(s, ZMQ_RCVBUF, &buf, sizeof buf);
  return sock;
}

Socket::~Socket() { zmq_close(sock_); }

absl::StatusOr<std::string> Socket::Bind(const std::string& endpoint) {
  if (zmq_bind(sock_, endpoint.c_str()) != 0) {
    return ZmqError(absl::StrCat("bind ", endpoint));
  }
  char buf[512];
  size_t len = sizeof buf;
  if (zmq_getsockopt(sock_, ZMQ_LAST_ENDPOINT, buf, &len) != 0) {
    return ZmqError("getsockopt(LAST_ENDPOINT)");
  }
  return std::string(buf);
}

absl::Status Socket::Connect(const std::string& endpoint) {
  if (zmq_connect(sock_, endpoint.c_str()) != 0) {
    return ZmqError(absl::StrCat("connect ", endpoint));
  }
  return absl::OkStatus();
}

absl::Status Socket::SetIdentity(absl::string_view id) {
  if (zmq_setsockopt(sock_, ZMQ_ROUTING_ID, id.data(), id.size()) != 0) {
    return ZmqError("setsockopt(ROUTING_ID)");
  }
  return absl::OkStatus();
}

absl::Status Socket::Send(Message& msg) {
  for (size_t i = 0; i < msg.size(); ++i) {
    int flags = ZMQ_DONTWAIT | (i + 1 < msg.size() ? ZMQ_SNDMORE : 0);
    while (zmq_msg_send(msg[i].raw(), sock_, flags) < 0) {
      if (zmq_errno() == EINTR) continue;
      // A failure on the first frame sends nothing; later frames cannot fail once the
      // first was accepted (ZeroMQ queues whole messages).
      return ZmqError("send");
    }
  }
  msg.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Message>> Socket::TryRecv() {
  Message msg;
  while (true) {
    Frame f;
    int rc = zmq_msg_recv(f.raw(), sock_, ZMQ_DONTWAIT);
    if (rc < 0) {
      int e = zmq_errno();
      if (e == EINTR) continue;
      if (e == EAGAIN && msg.empty()) return std::optional<Message>();
      return ZmqError("recv");
    }
    bool more = zmq_msg_more(f.raw());
    msg.push_back(std::move(f));
    if (!more) break;
  }
  return std::optional<Message>(std::move(msg));
}

Waker::Waker() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
Waker::~Waker() { close(fd_); }
void Waker::Wake() {
  uint64_t one = 1;
  ssize_t r = write(fd_, &one, sizeof one);
  (void)r;  // EAGAIN only when the counter is saturated: already awake.
}
void Waker::Drain() {
  uint64_t v;
  ssize_t r = read(fd_, &v, sizeof v);
  (void)r;
}

int Poller::Add(Socket* s) {
  items_.push_back(zmq_pollitem_t{s->raw(), 0, ZMQ_POLLIN, 0});
  return static_cast<int>(items_.size()) - 1;
}
int Poller::AddFd(int fd) {
  items_.push_back(zmq_pollitem_t{nullptr, fd, ZMQ_POLLIN, 0});
  return static_cast<int>(items_.size()) - 1;
}
absl::StatusOr<int> Poller::Poll(absl::Duration timeout) {
  for (auto& it : items_) it.revents = 0;
  long ms = timeout <= absl::ZeroDuration() ? 0 : static_cast<long>(
      absl::ToInt64Milliseconds(timeout + absl::Microseconds(999)));
  int rc = zmq_poll(items_.data(), static_cast<int>(items_.size()), ms);
  if (rc < 0) {
    if (zmq_errno() == EINTR) return 0;
    return ZmqError("poll");
  }
  return rc;
}

std::string EndpointHost(absl::string_view endpoint) {
  constexpr absl::string_view kTcp = "tcp://";
  if (endpoint.substr(0, kTcp.size()) != kTcp) return "";
  endpoint.remove_prefix(kTcp.size());
  auto colon = endpoint.rfind(':');
  return std::string(endpoint.substr(0, colon));
}

std::string PeerBindEndpoint(absl::string_view interface,
                             absl::string_view scheduler_endpoint) {
  std::string host(interface);
  if (host.empty()) {
    const std::string sched = EndpointHost(scheduler_endpoint);
    const bool local = sched.empty() || absl::StartsWith(sched, "127.") || sched == "localhost";
    host = local ? "127.0.0.1" : "0.0.0.0";
  }
  return absl::StrCat("tcp://", host, ":*");
}

std::string DialableEndpoint(absl::string_view bound) {
  constexpr absl::string_view kAny = "tcp://0.0.0.0:";
  if (!absl::StartsWith(bound, kAny)) return std::string(bound);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return absl::StrCat("tcp://", host, ":", bound.substr(kAny.size()));
}

absl::StatusOr<std::string> LocalAddressOf(const std::string& host, bool* loopback_only) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("this host's name '", host, "' does not resolve (", gai_strerror(rc), ")"));
  }
  std::vector<std::string> all;
  std::string loopback, found;
  for (const addrinfo* p = res; p != nullptr && found.empty(); p = p->ai_next) {
    char text[INET6_ADDRSTRLEN] = {0};
    if (getnameinfo(p->ai_addr, p->ai_addrlen, text, sizeof text, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
      continue;
    }
    all.push_back(text);
    // An address of this host is one a socket can bind (as Gloo's own lookup requires).
    const int fd = socket(p->ai_family, SOCK_STREAM, 0);
    if (fd < 0) continue;
    const bool bindable = bind(fd, p->ai_addr, p->ai_addrlen) == 0;
    close(fd);
    if (!bindable) continue;
    const bool is_loopback =
        (p->ai_family == AF_INET &&
         (ntohl(reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr.s_addr) >> 24) ==
             127) ||
        (p->ai_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr));
    if (!is_loopback) {
      found = text;
    } else if (loopback.empty()) {
      loopback = text;
    }
  }
  freeaddrinfo(res);
  if (loopback_only != nullptr) *loopback_only = found.empty() && !loopback.empty();
  if (!found.empty()) return found;
  if (!loopback.empty()) return loopback;
  return absl::FailedPreconditionError(
      absl::StrCat("this host's name '", host, "' resolves to ",
                   all.empty() ? std::string("no address") : absl::StrJoin(all, ", "),
                   ", none of them an address of this host"));
}

}  // namespace hybridps
