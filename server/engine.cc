#include "server/engine.h"

#include <pthread.h>

#include "absl/strings/str_cat.h"

namespace hybridps {

Engine::Engine(int index, int num_workers, KeyStore::Emit emit)
    : store_(num_workers, std::move(emit)) {
  thread_ = std::thread([this, index] {
    std::string name = absl::StrCat("hps-engine-", index);
    pthread_setname_np(pthread_self(), name.c_str());
    Loop();
  });
}

Engine::~Engine() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Engine::Post(std::string peer, int rank, uint64_t id, wire::DataRequest req,
                  std::optional<Frame> payload) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Work{std::move(peer), rank, id, std::move(req), std::move(payload), {}});
}

void Engine::PostFailAll(absl::Status status) {
  absl::MutexLock lock(&mu_);
  Work w;
  w.fail = std::move(status);
  queue_.push_back(std::move(w));
}

void Engine::Loop() {
  std::deque<Work> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Engine* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
            return e->stop_ || !e->queue_.empty();
          },
          this));
      if (stop_) return;
      batch.swap(queue_);
    }
    for (Work& w : batch) {
      if (!w.fail.ok()) {
        store_.FailAll(w.fail);
      } else {
        store_.Handle(w.peer, w.rank, w.id, w.req, std::move(w.payload));
      }
    }
    batch.clear();
  }
}

}  // namespace hybridps
