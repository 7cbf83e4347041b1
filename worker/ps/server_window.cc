#include "worker/ps/server_window.h"

namespace hybridps {

bool ServerWindows::Admits(int server, const Order& order, size_t bytes) const {
  const size_t window = window_[server];
  if (window == 0 || unanswered_[server] + bytes <= window) return true;
  const size_t ahead = UnansweredBefore(server, order, window);
  return ahead == 0 || (ahead + bytes <= window && unanswered_[server] + bytes <= 2 * window);
}

void ServerWindows::Sent(int server, const Order& order, size_t bytes) {
  unanswered_[server] += bytes;
  order_[server].emplace(order, bytes);
}

void ServerWindows::Answered(int server, const Order& order, size_t bytes) {
  auto it = order_[server].find(order);  // any of equal order: same bytes
  if (it == order_[server].end()) return;
  unanswered_[server] -= bytes;
  order_[server].erase(it);
}

size_t ServerWindows::UnansweredBefore(int server, const Order& order, size_t cap) const {
  size_t sum = 0;
  for (const auto& [o, bytes] : order_[server]) {
    if (!(o < order) || sum > cap) break;
    sum += bytes;
  }
  return sum;
}

}  // namespace hybridps
