// The handle of an asynchronous operation.
#ifndef HYBRIDPS_WORKER_HANDLE_H_
#define HYBRIDPS_WORKER_HANDLE_H_

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace hybridps {

// Completion state shared by a Handle and the store's I/O thread.
class HandleState {
 public:
  using Callback = std::function<void(const absl::Status&)>;

  // Exactly once; any thread. Later calls are ignored. Runs the callbacks added by
  // OnComplete on this thread, after the state is complete (outside the lock).
  void Complete(absl::Status status) {
    std::vector<Callback> callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      status_ = status;
      done_ = true;
      callbacks.swap(callbacks_);
    }
    for (auto& cb : callbacks) cb(status);
  }
  // Calls `callback` exactly once with the final status: at once on this thread when
  // already complete, else on the thread that completes the operation (keep it short and
  // non-blocking: that is the store's I/O thread).
  void OnComplete(Callback callback) {
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (!done_) {
        callbacks_.push_back(std::move(callback));
        return;
      }
      status = status_;
    }
    callback(status);
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
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mu_);
};

class Handle {
 public:
  explicit Handle(std::shared_ptr<HandleState> state) : state_(std::move(state)) {}
  // Blocks until the operation completed; its status. Bounded: every operation has a
  // deadline. Once Wait returned (or Done() is true) the store no longer touches the
  // operation's tensors.
  absl::Status Wait() const { return state_->Wait(); }
  bool Done() const { return state_->Done(); }
  // See HandleState::OnComplete: `callback` runs exactly once with the final status.
  void OnComplete(HandleState::Callback callback) const {
    state_->OnComplete(std::move(callback));
  }

 private:
  std::shared_ptr<HandleState> state_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_HANDLE_H_
