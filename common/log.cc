#include "common/log.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hybridps {
namespace {
std::atomic<int> g_level{2};
std::mutex g_tag_mu;
std::string g_tag;  // Guarded by g_tag_mu.
thread_local const std::string* t_pinned = nullptr;  // ScopedLogTag's tag on this thread

// abseil's mutex deadlock detection, a debugging aid, is on in a build of abseil without
// NDEBUG (Debian's): every lock then updates a process-wide lock-order graph and records
// stack traces, 0.3 of the 2.3 us of a small one-host allreduce. Off, as in abseil's
// release builds, for the whole process from the start; our GoogleTest binaries turn it
// back on (tests/deadlock_detection.cc). This file is linked wherever hybridps logs, so
// in every process that runs hybridps code.
[[maybe_unused]] const bool kDeadlockDetectionOff = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();
}  // namespace

void SetLogLevel(int level) { g_level.store(level, std::memory_order_relaxed); }
bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}
void SetLogTag(std::string tag) {
  if (t_pinned != nullptr) return;
  std::lock_guard<std::mutex> lock(g_tag_mu);
  g_tag = std::move(tag);
}

std::string LogTag() {
  std::lock_guard<std::mutex> lock(g_tag_mu);
  return g_tag;
}

ScopedLogTag::ScopedLogTag(std::string tag) : tag_(std::move(tag)), previous_(t_pinned) {
  t_pinned = &tag_;
}

ScopedLogTag::~ScopedLogTag() { t_pinned = previous_; }

LogMessage::LogMessage(LogLevel level, const char* file, int line, uint64_t dropped)
    : level_(level), dropped_(dropped) {
  static const char* kNames[] = {"E", "W", "I", "D"};
  absl::string_view f(file);
  if (auto p = f.rfind('/'); p != absl::string_view::npos) f.remove_prefix(p + 1);
  std::string tag;
  if (t_pinned != nullptr) {
    tag = *t_pinned;
  } else {
    std::lock_guard<std::mutex> lock(g_tag_mu);
    tag = g_tag;
  }
  stream_ << kNames[static_cast<int>(level_)]
          << absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()) << " "
          << (tag.empty() ? "" : tag + " ") << f << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  if (dropped_ > 0) stream_ << " (and " << dropped_ << " more like it since the last)";
  stream_ << '\n';
  std::string s = stream_.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

bool LogRate::Allow(absl::Time now, uint64_t* dropped) {
  const int64_t t = absl::ToUnixNanos(now);
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  while (t >= next) {
    if (next_ns_.compare_exchange_weak(next, t + interval_ns_, std::memory_order_relaxed)) {
      *dropped = dropped_.exchange(0, std::memory_order_relaxed);
      return true;
    }
  }
  dropped_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace hybridps
