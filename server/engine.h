// An engine thread: a queue of requests for the partitions it owns, and their KeyStore.
#ifndef HYBRIDPS_SERVER_ENGINE_H_
#define HYBRIDPS_SERVER_ENGINE_H_

#include <deque>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/hybridps.pb.h"
#include "common/transport.h"
#include "server/key_store.h"

namespace hybridps {

class Engine {
 public:
  // `emit` is called on the engine thread for every reply.
  Engine(int index, int num_workers, KeyStore::Emit emit);
  ~Engine();  // Stops and joins the thread; queued work is dropped.

  // Any thread.
  void Post(std::string peer, int rank, uint64_t id, wire::DataRequest req,
            std::optional<Frame> payload);
  void PostFailAll(absl::Status status);

 private:
  struct Work {
    std::string peer;
    int rank = -1;
    uint64_t id = 0;
    wire::DataRequest req;
    std::optional<Frame> payload;
    absl::Status fail;  // non-OK: a FailAll order
  };
  void Loop();

  KeyStore store_;  // engine thread only
  absl::Mutex mu_;
  std::deque<Work> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_SERVER_ENGINE_H_
