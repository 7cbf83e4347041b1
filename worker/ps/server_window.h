// The server window (Options::server_window_bytes): a worker keeps at most about a window of
// pushed payload bytes unanswered at one server, so that one server's queue does not grow
// while the others wait. A push counts only the unanswered pushes to its server that come
// before it in the order every worker shares (Order): pushes after it (sent early, e.g. the
// first half of a burst dispatched in two) are answered only once the other workers reach
// them, so they must not hold it up; all unanswered pushes together stay within two
// windows. The earliest push always goes, so windows cannot wait on each other when
// workers issue tensors in other orders.
//
// Threading: not thread-safe; the store's I/O thread owns it.
#ifndef HYBRIDPS_WORKER_PS_SERVER_WINDOW_H_
#define HYBRIDPS_WORKER_PS_SERVER_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace hybridps {

class ServerWindows {
 public:
  // A partition's place in an order every worker agrees on (the submission sequence
  // differs between workers): higher priority first (so the priority is negated), then
  // key, then partition.
  using Order = std::tuple<int64_t, uint64_t, uint32_t>;

  ServerWindows() = default;
  // `window_bytes` 0: no window, every push may go.
  ServerWindows(int num_servers, size_t window_bytes)
      : ServerWindows(std::vector<size_t>(num_servers, window_bytes)) {}
  // A window per server (0: none for that server).
  explicit ServerWindows(std::vector<size_t> window_bytes)
      : window_(std::move(window_bytes)),
        unanswered_(window_.size(), 0),
        order_(window_.size()) {}

  // Whether a push of `bytes` at `order` may go to `server` now.
  bool Admits(int server, const Order& order, size_t bytes) const;
  // A push of `bytes` (> 0) at `order` went to `server`; its answer has not come.
  void Sent(int server, const Order& order, size_t bytes);
  // The answer to a push Sent with these arguments came.
  void Answered(int server, const Order& order, size_t bytes);
  // Payload bytes pushed to `server` and not answered yet.
  size_t unanswered(int server) const { return unanswered_[server]; }

 private:
  // The unanswered bytes at `server` that come before `order`, counted up to just past
  // `cap`.
  size_t UnansweredBefore(int server, const Order& order, size_t cap) const;

  std::vector<size_t> window_;                       // by server
  std::vector<size_t> unanswered_;                   // by server
  std::vector<std::multimap<Order, size_t>> order_;  // by server: unanswered pushes, in order
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_PS_SERVER_WINDOW_H_
