// The handle of an asynchronous operation.
#ifndef HYBRIDPS_WORKER_HANDLE_H_
#define HYBRIDPS_WORKER_HANDLE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace hybridps {

// Completion state shared by a Handle and the store's I/O thread.
class HandleState {
 public:
  // Exactly once; any thread. Later calls are ignored.
  void Complete(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    status_ = std::move(status);
    done_ = true;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }
  bool Done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class Handle {
 public:
  explicit Handle(std::shared_ptr<HandleState> state) : state_(std::move(state)) {}
  // Blocks until the operation completed; its status. Bounded: every operation has a
  // deadline. Once Wait returned (or Done() is true) the store no longer touches the
  // operation's tensors.
  absl::Status Wait() const { return state_->Wait(); }
  bool Done() const { return state_->Done(); }

 private:
  std::shared_ptr<HandleState> state_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_HANDLE_H_
