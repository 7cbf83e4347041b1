// Minimal leveled logging to stderr (abseil 20220623 has no logging library).
//   HPS_LOG(INFO) << "server " << rank << " ready";
//   HPS_LOG_EVERY_SEC(WARNING, 1) << "rejected a message: " << why;  // input from peers
// Lines carry a timestamp, the level and the process's tag (SetLogTag: "server 1").
// HPS_LOG_EVERY_SEC writes at most one line per call site and interval, adding how many
// it dropped since its last line: a flood of bad messages costs a line a second.
#ifndef HYBRIDPS_COMMON_LOG_H_
#define HYBRIDPS_COMMON_LOG_H_

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "absl/time/time.h"

namespace hybridps {

enum class LogLevel { ERROR = 0, WARNING = 1, INFO = 2, DEBUG = 3 };

void SetLogLevel(int level);
bool LogEnabled(LogLevel level);
void SetLogTag(std::string tag);
// The process's tag as SetLogTag last set it.
std::string LogTag();

// While it lives, the calling thread's lines carry `tag` and its SetLogTag calls change
// nothing: a process set's store or scheduler, made inside a worker, leaves the
// process's tag ("worker 3") as it is.
class ScopedLogTag {
 public:
  explicit ScopedLogTag(std::string tag);
  ~ScopedLogTag();
  ScopedLogTag(const ScopedLogTag&) = delete;
  ScopedLogTag& operator=(const ScopedLogTag&) = delete;

 private:
  std::string tag_;
  const std::string* previous_;
};

class LogMessage {
 public:
  // `dropped`: lines of this call site that HPS_LOG_EVERY_SEC left out before this one.
  LogMessage(LogLevel level, const char* file, int line, uint64_t dropped = 0);
  ~LogMessage();  // Writes the whole line at once.
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  uint64_t dropped_;
  std::ostringstream stream_;
};

// One call site's budget of HPS_LOG_EVERY_SEC: a line, then none for `interval`. Any
// thread.
class LogRate {
 public:
  explicit LogRate(absl::Duration interval) : interval_ns_(absl::ToInt64Nanoseconds(interval)) {}
  // Whether a line may be written at `now`; if so, *dropped is how many were refused since
  // the last one.
  bool Allow(absl::Time now, uint64_t* dropped);

 private:
  const int64_t interval_ns_;
  std::atomic<int64_t> next_ns_{INT64_MIN};  // no line before this (absl::ToUnixNanos)
  std::atomic<uint64_t> dropped_{0};
};

// Lets HPS_LOG be a single expression (safe inside an unbraced if/else).
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace hybridps

#define HPS_LOG(level)                                                \
  !::hybridps::LogEnabled(::hybridps::LogLevel::level)                \
      ? (void)0                                                       \
      : ::hybridps::LogVoidify() &                                    \
            ::hybridps::LogMessage(::hybridps::LogLevel::level, __FILE__, __LINE__).stream()

// A statement, like HPS_LOG (the loop body runs at most once); each expansion has its
// own LogRate (a static in its own lambda).
#define HPS_LOG_EVERY_SEC(level, seconds)                                                  \
  for (uint64_t hps_dropped = 0, hps_once = 1;                                             \
       hps_once && ::hybridps::LogEnabled(::hybridps::LogLevel::level) &&                  \
       []() -> ::hybridps::LogRate& {                                                      \
         static ::hybridps::LogRate rate(::absl::Seconds(seconds));                        \
         return rate;                                                                      \
       }().Allow(::absl::Now(), &hps_dropped);                                             \
       hps_once = 0)                                                                       \
  ::hybridps::LogMessage(::hybridps::LogLevel::level, __FILE__, __LINE__, hps_dropped).stream()

#endif  // HYBRIDPS_COMMON_LOG_H_
