// The handle of an asynchronous operation.
#ifndef HYBRIDPS_WORKER_HANDLE_H_
#define HYBRIDPS_WORKER_HANDLE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/spin.h"

namespace hybridps {

class HandleState;

// What a handle's waiting thread and its first watcher call (HandleState::SetWaitHelper):
// the store's work. One object serves every handle of a store (WaitHelperGate), so that
// an operation's handle costs no allocation for it.
class WaitHelper {
 public:
  virtual ~WaitHelper() = default;
  // On a thread about to wait on `state`: may complete the operation (see SetWaitHelper).
  virtual void Help(HandleState* state) = 0;
  // Once, the first time someone follows an operation without waiting on it (see
  // SetWaitHelper).
  virtual void Watched() {}
};

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
    // After the lock is let go, and this object's last use here: a waiter that sees it
    // returns without the lock (Wait), and may free the state at once.
    done_fast_.store(true, std::memory_order_release);
    for (auto& cb : callbacks) cb(status);
  }
  // Calls `callback` exactly once with the final status: at once on this thread when
  // already complete, else on the thread that completes the operation (keep it short and
  // non-blocking, and never wait on the store's handles in it: that is the store's I/O
  // thread, or a thread that does the store's work while it waits, see SetWaitHelper).
  void OnComplete(Callback callback) { AddCallback(std::move(callback), /*watch=*/true); }
  // Holds `owner` (memory the operation uses) until the operation completed, for a caller
  // that also waits on it: unlike OnComplete, not a sign that nobody waits.
  void HoldUntilDone(std::shared_ptr<const void> owner) {
    AddCallback([owner = std::move(owner)](const absl::Status&) {}, /*watch=*/false);
  }
  // Until the operation completed: its status. Bounded by the deadline of SetDeadline:
  // past it, DeadlineExceeded while the operation is still not complete (Done() false).
  absl::Status Wait() {
    // The store's helper first (see SetWaitHelper): it may complete the operation here.
    if (helper_ && !done_fast_.load(std::memory_order_acquire)) helper_->Help(this);
    // Complete wrote the status before it set done_fast_, and nothing writes it after:
    // an operation the helper completed returns without the lock.
    if (done_fast_.load(std::memory_order_acquire)) return DoneStatus();
    // Options::spin: poll for a while before sleeping (see SetWaitSpin).
    const int64_t spin_ns = wait_spin_ns_.load(std::memory_order_relaxed);
    if (spin_ns > 0 && !done_fast_.load(std::memory_order_acquire)) {
      const absl::Time until = WallNow() + absl::Nanoseconds(spin_ns);
      while (!done_fast_.load(std::memory_order_acquire) && WallNow() < until) CpuRelax();
    }
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&done_), wait_deadline_)) {
      return absl::DeadlineExceededError(absl::StrCat(
          describe_ ? describe_() : what_,
          " is not complete although its store should have failed it by now: the "
          "store's threads are stuck. The operation still holds its tensors: keep their "
          "memory alive until the handle is done, and do not use this store again"));
    }
    return status_;
  }
  // When Wait() gives up: the latest moment at which the store completes the operation
  // even when it fails it (its op_timeout and whatever the store may still take after it
  // to fail it cleanly) plus Options::wait_grace; `what` names the operation ("push_pull
  // of 'w' (...)"). Set once by the store, before the state is shared with any other
  // thread; unset, Wait() waits for completion however long it takes.
  void SetDeadline(absl::Time give_up_at, std::string what) {
    wait_deadline_ = give_up_at;
    what_ = std::move(what);
  }
  // The same, `describe` called only when Wait() gives up (a store's operation names
  // itself then, rather than formatting its name for every operation).
  void SetDeadline(absl::Time give_up_at, std::function<std::string()> describe) {
    wait_deadline_ = give_up_at;
    describe_ = std::move(describe);
  }
  // SetDeadline's moment (InfiniteFuture when unset). A helper gives up by then too.
  absl::Time wait_deadline() const { return wait_deadline_; }
  bool Done() {
    bool done;
    {
      absl::MutexLock lock(&mu_);
      done = done_;
    }
    if (!done) NoteWatched();
    return done;
  }
  // Done(), without the lock (an acquire load).
  bool DoneFast() const { return done_fast_.load(std::memory_order_acquire); }
  // Set at most once, before the state is shared with any other thread: Wait() calls
  // helper->Help before it blocks, on the waiting thread. The dist_allreduce store runs its
  // due negotiation rounds there, and GPU staging its steps, so that an operation costs
  // no hand-off to a background thread and back. Help returns when it cannot help (any
  // more). With `watched`, helper->Watched() runs once, on the calling thread, the first
  // time someone follows the operation without waiting on it (OnComplete while it is
  // pending, or Done() false): a store whose waiting threads do its work (dist_hybrid's
  // I/O turns) then knows that nobody will wait on this one and runs it itself at once.
  // See WaitHelperGate.
  void SetWaitHelper(std::shared_ptr<WaitHelper> helper, bool watched = false) {
    helper_ = std::move(helper);
    want_watched_ = watched;
  }
  // Someone followed the operation without waiting on it (whether or not the helper's
  // Watched was wanted).
  bool watched() const { return watched_.load(std::memory_order_relaxed); }
  // How long Wait() polls before it sleeps, for every handle of this process (the
  // stores set it from Options::spin when created; zero: sleep at once).
  static void SetWaitSpin(absl::Duration spin) {
    wait_spin_ns_.store(absl::ToInt64Nanoseconds(spin), std::memory_order_relaxed);
  }

 private:
  void AddCallback(Callback callback, bool watch) {
    absl::Status status;
    bool pending = false;
    {
      absl::MutexLock lock(&mu_);
      if (!done_) {
        callbacks_.push_back(std::move(callback));
        pending = true;
      } else {
        status = status_;
      }
    }
    if (!pending) return callback(status);
    if (watch) NoteWatched();
  }
  void NoteWatched() {
    if (!watched_.exchange(true, std::memory_order_relaxed) && want_watched_) helper_->Watched();
  }

  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // The final status, read without mu_ once done_fast_ is set (Wait).
  const absl::Status& DoneStatus() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return status_; }
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> done_fast_{false};  // done_, readable without the lock
  std::shared_ptr<WaitHelper> helper_;  // see SetWaitHelper
  bool want_watched_ = false;           // helper_->Watched() is wanted (SetWaitHelper)
  std::atomic<bool> watched_{false};    // someone followed it without waiting
  absl::Time wait_deadline_ = absl::InfiniteFuture();  // see SetDeadline
  std::string what_;                                    // see SetDeadline
  std::function<std::string()> describe_;               // see SetDeadline
  static inline std::atomic<int64_t> wait_spin_ns_{0};
};

// How handles' wait helpers reach the object that does the work (a store, a stager),
// which may be destroyed while handles live on: the object opens the gate once it can
// help, installs the gate as its handles' helper, and closes it in its destructor (which
// then waits for the helpers in progress to return). `help` and `watched` are the
// object's member functions that Help and Watched call.
template <typename T>
class WaitHelperGate : public WaitHelper {
 public:
  explicit WaitHelperGate(void (T::*help)(HandleState*), void (T::*watched)() = nullptr)
      : help_(help), watched_(watched) {}
  void Open(T* target) {
    absl::WriterMutexLock lock(&mu_);
    target_ = target;
  }
  void Close() {
    absl::WriterMutexLock lock(&mu_);
    target_ = nullptr;
  }
  // Makes `gate` `state`'s helper (with Watched when the gate has `watched`).
  static void Install(const std::shared_ptr<WaitHelperGate>& gate, HandleState* state) {
    state->SetWaitHelper(gate, gate->watched_ != nullptr);
  }

  void Help(HandleState* state) override {
    absl::ReaderMutexLock lock(&mu_);
    if (target_ != nullptr) (target_->*help_)(state);
  }
  void Watched() override {
    absl::ReaderMutexLock lock(&mu_);
    if (target_ != nullptr && watched_ != nullptr) (target_->*watched_)();
  }

 private:
  void (T::*const help_)(HandleState*);
  void (T::*const watched_)();
  absl::Mutex mu_;
  T* target_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class Handle {
 public:
  explicit Handle(std::shared_ptr<HandleState> state) : state_(std::move(state)) {}
  // Blocks until the operation completed; its status. Bounded: every operation has a
  // deadline, by which the store completes it, failed if need be. Should the store's
  // threads be stuck, Wait returns DeadlineExceeded Options::wait_grace after that (the
  // operation not Done(): its tensors are still the store's, and the store is unusable).
  // Once the operation is done (Wait returned its status, or Done() is true) the store no
  // longer touches its tensors.
  absl::Status Wait() const { return state_->Wait(); }
  bool Done() const { return state_->Done(); }
  // See HandleState::OnComplete: `callback` runs exactly once with the final status.
  void OnComplete(HandleState::Callback callback) const {
    state_->OnComplete(std::move(callback));
  }
  // See HandleState::HoldUntilDone.
  void HoldUntilDone(std::shared_ptr<const void> owner) const {
    state_->HoldUntilDone(std::move(owner));
  }

 private:
  std::shared_ptr<HandleState> state_;
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_HANDLE_H_
