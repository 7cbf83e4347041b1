#include "server/engine.h"

#include <pthread.h>

#include "absl/strings/str_cat.h"
#include "common/reduce.h"

namespace hybridps {

Engine::Engine(int index, Done done) : done_(std::move(done)) {
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

void Engine::Post(KeyStore::SumTask task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Task{std::move(task), nullptr});
}

void Engine::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Task{std::nullopt, std::move(fn)});
}

void Engine::Loop() {
  std::deque<Task> batch;
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
    while (!batch.empty()) {
      Task task = std::move(batch.front());
      batch.pop_front();
      if (task.fn) {
        task.fn();
        continue;
      }
      KeyStore::SumTask t = std::move(*task.sum);
      SumInto(t.dtype, t.dst, t.src.data(), t.count);
      const uint64_t key = t.key, round = t.round;
      const uint32_t part = t.part;
      { KeyStore::SumTask release = std::move(t); }
      done_(key, part, round);
    }
  }
}

}  // namespace hybridps
