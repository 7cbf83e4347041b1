// Minimal leveled logging to stderr (abseil 20220623 has no logging library).
//   HPS_LOG(INFO) << "server " << rank << " ready";
// Lines carry a timestamp, the level and the process's tag (SetLogTag: "server 1").
#ifndef HYBRIDPS_COMMON_LOG_H_
#define HYBRIDPS_COMMON_LOG_H_

#include <sstream>
#include <string>
#include <string_view>

namespace hybridps {

enum class LogLevel { ERROR = 0, WARNING = 1, INFO = 2, DEBUG = 3 };

void SetLogLevel(int level);
bool LogEnabled(LogLevel level);
void SetLogTag(std::string tag);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // Writes the whole line at once.
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
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

#endif  // HYBRIDPS_COMMON_LOG_H_
