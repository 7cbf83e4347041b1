// zmq-pipeline-probe: the ceiling plain ZeroMQ puts under a push_pull of one 4 MiB
// partition on this machine, with no hybridps code in the path.
//
//   zmq-pipeline-probe [--bytes 4194304] [--chunks 1] [--split 0|1] [--iters 300]
//
// A forked "server" process echoes every message it receives on a ROUTER over loopback
// TCP (zero-copy: the received frame is sent back). The "worker" sends `bytes` as `chunks`
// messages (zero-copy from its input), waits for all replies and copies each into an
// output buffer, as a worker does. --split 1 sends the replies to a second DEALER of the
// worker (another connection, so another ZeroMQ I/O thread carries the pull direction).
// Prints the median time of one round trip and bytes / time. Socket options as in
// common/transport.cc (no high-water marks, 4 MiB kernel buffers, two I/O threads).
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void Die(const char* what) {
  std::fprintf(stderr, "zmq-pipeline-probe: %s: %s\n", what, zmq_strerror(zmq_errno()));
  std::exit(1);
}

void* MakeSocket(void* ctx, int type) {
  void* s = zmq_socket(ctx, type);
  if (s == nullptr) Die("zmq_socket");
  const int zero = 0, buf = 4 << 20;
  if (zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero) != 0 ||
      zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
      zmq_setsockopt(s, ZMQ_SNDBUF, &buf, sizeof buf) != 0 ||
      zmq_setsockopt(s, ZMQ_RCVBUF, &buf, sizeof buf) != 0) {
    Die("zmq_setsockopt");
  }
  return s;
}

void* MakeContext() {
  void* ctx = zmq_ctx_new();
  if (ctx == nullptr) Die("zmq_ctx_new");
  zmq_ctx_set(ctx, ZMQ_IO_THREADS, 2);
  return ctx;
}

// Echoes `messages` messages, then exits.
void Serve(const std::string& endpoint, long messages, bool split) {
  void* ctx = MakeContext();
  void* router = MakeSocket(ctx, ZMQ_ROUTER);
  if (zmq_bind(router, endpoint.c_str()) != 0) Die("bind");
  for (long n = 0; n < messages; ++n) {
    zmq_msg_t id, data;
    zmq_msg_init(&id);
    zmq_msg_init(&data);
    if (zmq_msg_recv(&id, router, 0) < 0 || zmq_msg_recv(&data, router, 0) < 0) Die("recv");
    if (split) {  // reply to the worker's second DEALER, identity "B"
      zmq_msg_close(&id);
      zmq_msg_init_size(&id, 1);
      *static_cast<char*>(zmq_msg_data(&id)) = 'B';
    }
    if (zmq_msg_send(&id, router, ZMQ_SNDMORE) < 0 || zmq_msg_send(&data, router, 0) < 0) {
      Die("send");
    }
  }
  const int linger = 2000;
  zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
  zmq_close(router);
  zmq_ctx_term(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 4 << 20;
  int chunks = 1, split = 0, iters = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (flag == "--bytes") bytes = static_cast<size_t>(v);
    else if (flag == "--chunks") chunks = static_cast<int>(v);
    else if (flag == "--split") split = static_cast<int>(v);
    else if (flag == "--iters") iters = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: zmq-pipeline-probe [--bytes N] [--chunks N] [--split 0|1] "
                           "[--iters N]\n");
      return 2;
    }
  }
  if (chunks < 1 || iters < 1 || bytes < static_cast<size_t>(chunks)) {
    std::fprintf(stderr, "zmq-pipeline-probe: need chunks >= 1, iters >= 1, bytes >= chunks\n");
    return 2;
  }
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(20000 + getpid() % 20000);
  const size_t chunk = bytes / static_cast<size_t>(chunks);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    Serve(endpoint, static_cast<long>(iters) * chunks, split != 0);
    _exit(0);
  }
  void* ctx = MakeContext();
  void* push = MakeSocket(ctx, ZMQ_DEALER);
  zmq_setsockopt(push, ZMQ_ROUTING_ID, "A", 1);
  if (zmq_connect(push, endpoint.c_str()) != 0) Die("connect");
  void* pull = push;
  if (split) {
    pull = MakeSocket(ctx, ZMQ_DEALER);
    zmq_setsockopt(pull, ZMQ_ROUTING_ID, "B", 1);
    if (zmq_connect(pull, endpoint.c_str()) != 0) Die("connect");
  }
  usleep(300 * 1000);  // both connections up before the first send (ROUTER drops otherwise)
  std::vector<char> in(bytes, 1), out(bytes, 0);
  std::vector<double> us;
  for (int it = 0; it < iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < chunks; ++c) {
      zmq_msg_t m;
      zmq_msg_init_data(&m, in.data() + c * chunk, chunk, nullptr, nullptr);
      if (zmq_msg_send(&m, push, 0) < 0) Die("send");
    }
    for (int c = 0; c < chunks; ++c) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, pull, 0) < 0) Die("recv");
      std::memcpy(out.data() + c * chunk, zmq_msg_data(&m), zmq_msg_size(&m));
      zmq_msg_close(&m);
    }
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  std::sort(us.begin(), us.end());
  const double p50 = us[us.size() / 2];
  std::printf("bytes %zu chunks %d split %d: p50 %.0f us, %.3f GB/s\n", bytes, chunks, split, p50,
              static_cast<double>(chunk * chunks) / p50 / 1e3);
  int status = 0;
  waitpid(pid, &status, 0);
  if (split) zmq_close(pull);
  zmq_close(push);
  zmq_ctx_term(ctx);
  return 0;
}
