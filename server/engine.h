// An engine thread: runs the large summations the I/O thread hands it (KeyStore offload)
// and the optimizer's updates, in the order given. A partition always maps to the same engine, so its sums keep their
// order while different partitions are summed in parallel.
#ifndef HYBRIDPS_SERVER_ENGINE_H_
#define HYBRIDPS_SERVER_ENGINE_H_

#include <deque>
#include <functional>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "server/key_store.h"

namespace hybridps {

class Engine {
 public:
  // `done` is called on the engine thread after each task (with the task's identity; the
  // frames are released first).
  using Done = std::function<void(uint64_t key, uint32_t part, uint64_t round)>;
  Engine(int index, Done done);
  ~Engine();  // Stops and joins the thread; queued tasks are dropped.

  void Post(KeyStore::SumTask task);  // any thread
  void Post(std::function<void()> fn);  // any thread: runs fn (which reports by itself)

 private:
  struct Task {
    std::optional<KeyStore::SumTask> sum;
    std::function<void()> fn;
  };
  void Loop();

  Done done_;
  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_SERVER_ENGINE_H_
