// dist_hybrid's worker I/O in turns (see the threading notes in ps_store.h): the I/O
// thread's loop, a waiting thread's turns (HelpWith), and the commands a turn takes (one
// turn, IoTurn, is in ps_store.cc).
#include <algorithm>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "common/spin.h"
#include "common/wire.h"
#include "worker/ps/ps_store.h"

namespace hybridps {

void PsStore::IoLoop() {
  PollSpin spin(options_.spin);
  while (AcquireIoTurns()) {
    while (true) {
      IoTurn(&spin, /*caller=*/false);
      if (!io_exit_.load() && !io_wanted_.load(std::memory_order_acquire)) continue;
      // Decided under mu_: a waiting thread that asked may have taken its request back,
      // and a command only this thread runs (io_call_) goes first: one more turn takes
      // it (its waker is set, so the turn's poll returns at once).
      absl::MutexLock lock(&mu_);
      if (!io_exit_.load() && (!io_wanted_.load(std::memory_order_relaxed) || io_call_)) {
        continue;
      }
      io_wanted_.store(false, std::memory_order_relaxed);
      io_owner_ = IoOwner::kNone;
      caller_left_ = absl::Now();  // the grace starts for the thread that asked
      break;
    }
  }
  FailServerCalls(absl::CancelledError("the store was shut down"), absl::InfiniteFuture());
  control_->FailAll(absl::CancelledError("the store was shut down"));
}

bool PsStore::AcquireIoTurns() {
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = absl::Now();
    if (io_owner_ == IoOwner::kNone) {
      // Watched work (Watched): nobody waits on it, so no grace.
      bool take = io_call_ || !callers_active_ || watched_ || io_exit_.load();
      if (!take && now >= caller_left_ + kCallerGrace) {
        // Nobody holds the turns, so their state may be read here.
        if (!commands_.empty() || !active_.empty() || !server_calls_.empty() ||
            control_->HasPending()) {
          // Work nobody claimed within the grace: its submitters do not wait on it.
          callers_active_ = false;
          take = true;
        } else {
          // Nothing to do for a while: listen to the sockets again (a waiting thread
          // asks for the turns back).
          take = now >= caller_left_ + idle_hand_back_;
        }
      }
      if (take) {  // (io_call_ stays set until its turn has taken the commands)
        io_owner_ = IoOwner::kThread;
        watched_ = false;
        return !io_exit_.load();
      }
    }
    // While a waiting thread runs the turns, look again every idle_hand_back_ (or when it
    // lets them go with watched work left); between its turns, once its grace has passed,
    // and then every kCallerGrace for unclaimed work.
    absl::Time deadline = now + idle_hand_back_;
    if (io_owner_ == IoOwner::kNone) {
      deadline = std::max(caller_left_ + kCallerGrace, now + kCallerGrace);
    }
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](PsStore* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                return s->io_owner_ == IoOwner::kNone &&
                                       (s->io_call_ || !s->callers_active_ || s->watched_);
                              },
                              this),
                          deadline);
  }
}

void PsStore::HelpWith(HandleState* state) {
  if (!caller_turns_ || std::this_thread::get_id() == io_thread_id_) return;
  const absl::Time give_up = state->wait_deadline();
  PollSpin spin(options_.spin);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // A completion callback run in this thread's own turns that waits: it cannot help.
      if (io_owner_ == IoOwner::kCaller && io_caller_ == std::this_thread::get_id()) return;
      callers_active_ = true;
      std::pair<PsStore*, HandleState*> me{this, state};
      // The turns are free and not reserved for the I/O thread (io_call_: a command
      // only it runs).
      while (io_owner_ != IoOwner::kNone || io_call_) {
        // Done: the request for the turns stands, for this thread's next operation (the
        // I/O thread takes them back after the grace if none comes).
        if (io_exit_.load() || state->DoneFast()) return;
        // Past the handle's deadline Wait() says that the store's threads are stuck; the
        // I/O thread keeps the turns, if no other waiting thread asks for them.
        if (absl::Now() >= give_up) {
          if (helpers_waiting_.load(std::memory_order_relaxed) == 0) {
            io_wanted_.store(false, std::memory_order_relaxed);
          }
          return;
        }
        if (io_owner_ == IoOwner::kThread && !io_wanted_.load(std::memory_order_relaxed)) {
          // It hands them over after its turn, once no command only it runs is queued.
          io_wanted_.store(true, std::memory_order_release);
          credits_->waker.Wake();  // ends its poll
        }
        // A turn that completed an operation while helpers wait takes mu_ at its end, so
        // that a completion of `state` is seen here at once (IoTurn).
        helpers_waiting_.fetch_add(1, std::memory_order_seq_cst);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        mu_.AwaitWithDeadline(absl::Condition(
                                  +[](std::pair<PsStore*, HandleState*>* p)
                                      ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                        const PsStore& s = *p->first;
                                        return (s.io_owner_ == IoOwner::kNone &&
                                                !s.io_call_) ||
                                               // the I/O thread took them: ask again
                                               (s.io_owner_ == IoOwner::kThread &&
                                                !s.io_wanted_.load(
                                                    std::memory_order_relaxed)) ||
                                               p->second->DoneFast();
                                      },
                                  &me),
                              std::min(absl::Now() + idle_hand_back_, give_up));
        helpers_waiting_.fetch_sub(1, std::memory_order_relaxed);
      }
      if (io_exit_.load() || state->DoneFast()) return;
      io_owner_ = IoOwner::kCaller;
      io_caller_ = std::this_thread::get_id();
    }
    bool left_for_io = false;
    {
      // The turns are let go however this ends.
      auto release = absl::MakeCleanup([this] {
        // Watched work these turns did not finish (its hint came while a thread had the
        // turns): the I/O thread takes it at once. Read under mu_, after which Watched()
        // sees the turns free; active_ is turns-only state, still this thread's.
        absl::MutexLock lock(&mu_);
        watched_ = WatchedWorkLeft();
        io_owner_ = IoOwner::kNone;
        caller_left_ = absl::Now();
      });
      while (!left_for_io && !state->DoneFast() && !io_exit_.load() &&
             absl::Now() < give_up) {
        left_for_io = IoTurn(&spin, /*caller=*/true);
        caller_turn_count_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    // A command only the I/O thread runs came: it has the turns now (io_call_); this
    // thread asks for them back.
    if (!left_for_io) return;
  }
}

void PsStore::Watched() {
  // (A callback added by the I/O thread's own turn needs nothing: its turns go on.)
  if (std::this_thread::get_id() == io_thread_id_) return;
  absl::MutexLock lock(&mu_);
  // While a thread has the turns it runs the work; when a waiting thread lets them go,
  // it looks for watched work left (HelpWith).
  if (io_owner_ == IoOwner::kNone) watched_ = true;
}

bool PsStore::TakeCommands(bool caller) {
  std::vector<Command> cmds;
  bool left_for_io = false;
  {
    absl::MutexLock lock(&mu_);
    if (!caller) {
      cmds.swap(commands_);
      io_call_ = false;  // what it was reserved for is taken
    } else {
      // Operations only, up to the first other command: that one and the rest stay, in
      // their order, for the I/O thread, which takes the turns next.
      size_t ops = 0;
      while (ops < commands_.size() && commands_[ops].op) ++ops;
      cmds.assign(std::make_move_iterator(commands_.begin()),
                  std::make_move_iterator(commands_.begin() + ops));
      commands_.erase(commands_.begin(), commands_.begin() + ops);
      left_for_io = !commands_.empty();
      if (left_for_io) io_call_ = true;
    }
  }
  // Its first turn's poll returns at once (this turn drained the waker).
  if (left_for_io) credits_->waker.Wake();
  for (Command& c : cmds) {
    if (c.op) {
      StartOp(std::move(c.op));
    } else if (c.barrier) {
      if (!broken_.ok()) {
        c.barrier->Complete(broken_);
        continue;
      }
      wire::Envelope env;
      env.mutable_barrier()->set_group(wire::GROUP_WORKERS);
      auto b = c.barrier;
      control_->Request(std::move(env), absl::Now() + options_.op_timeout,
                        [b](absl::StatusOr<wire::Envelope> r) { b->Complete(r.status()); });
    } else if (c.finalize) {
      finalize_ = c.finalize;
    } else if (c.run) {
      c.run();
    }
  }
  return left_for_io;
}

}  // namespace hybridps
