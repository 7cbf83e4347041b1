// A process's timeline (HYBRIDPS_TIMELINE): spans of what its operations spent their time
// on, kept in memory (bounded: the oldest are dropped, and counted) and written at the end
// as Chrome trace-event JSON (what Perfetto and chrome://tracing open), one file per
// process, PREFIX.<label>.json; hybridrun --timeline-filename merges a job's files.
//
// Timestamps are this process's clock moved onto the scheduler's (Write's clock_offset), so
// the files of processes on different hosts line up when merged.
//
// A timeline opened Dormant records nothing until Start(path) (Horovod's start_timeline),
// and Stop() writes what it recorded since to that path.
//
// Threading: Span, Start and Stop may be called from any thread; Write once, at the end.
#ifndef HYBRIDPS_COMMON_TIMELINE_H_
#define HYBRIDPS_COMMON_TIMELINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hybridps {

class Timeline {
 public:
  // Null when `prefix` is empty (the timeline is off). `label` names the file and the
  // process's row ("worker 0"); `row` orders the rows (workers first, then servers);
  // `lanes` names the rows' threads, by lane index.
  // At most `capacity` spans are kept (older ones are dropped, and counted in the file):
  // about 60 MiB at the default, and as much again while the file is written.
  static constexpr size_t kMaxSpans = 1 << 18;
  static std::unique_ptr<Timeline> Open(const std::string& prefix, const std::string& label,
                                        int row, std::vector<std::string> lanes,
                                        size_t capacity = kMaxSpans);
  // Open, or when `prefix` is empty a timeline that records only between Start and Stop.
  static std::unique_ptr<Timeline> OpenOrDormant(const std::string& prefix,
                                                 const std::string& label, int row,
                                                 std::vector<std::string> lanes,
                                                 size_t capacity = kMaxSpans);

  // Whether spans are being kept: callers skip the work of making one when not.
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // Starts recording, for Stop to write to `path`. FailedPrecondition when it records
  // already (HYBRIDPS_TIMELINE, or a Start without its Stop).
  absl::Status Start(std::string path);
  // Stops what Start started and writes its spans (those that began after Start) to its
  // path; `path` receives it. OK and nothing written when nothing was started.
  absl::Status Stop(absl::Duration clock_offset, std::string* path = nullptr);

  // Kept when on(), and only if it began after the recording did.
  void Span(std::string name, absl::string_view category, absl::Time start, absl::Time end,
            int lane, std::string args = "");
  // A lane more (a part of the process that records its own spans, e.g. GPU staging);
  // returns its index.
  int AddLane(std::string name);
  // Writes PREFIX.<label>.json, the spans moved onto the scheduler's clock by
  // `clock_offset` (this process's clock minus the scheduler's:
  // ControlClient::clock_offset); returns the path written in `path`.
  absl::Status Write(absl::Duration clock_offset, std::string* path = nullptr);
  // Write, and logs where it wrote or why it could not.
  void WriteAndLog(absl::Duration clock_offset);

 private:
  struct Event {
    std::string name;
    std::string category;
    int64_t start_us;
    int64_t dur_us;
    int lane;
    std::string args;  // "key": value, ... (JSON members) or empty
  };
  Timeline(std::string prefix, std::string label, int row, std::vector<std::string> lanes,
           size_t capacity)
      : prefix_(std::move(prefix)), label_(std::move(label)), row_(row),
        capacity_(capacity), on_(!prefix_.empty()), lanes_(std::move(lanes)) {}
  // Writes `events` as the JSON file `file` (through a temporary and a rename).
  absl::Status WriteFile(const std::string& file, absl::Duration clock_offset,
                         const std::vector<std::string>& lanes,
                         const std::deque<Event>& events, uint64_t dropped) const;

  const std::string prefix_, label_;
  const int row_;
  const size_t capacity_;
  std::atomic<bool> on_;
  absl::Mutex mu_;
  std::string started_path_ ABSL_GUARDED_BY(mu_);  // of Start; empty: not started
  absl::Time started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<std::string> lanes_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// Whether `t` keeps spans now (null: no timeline).
inline bool Recording(const Timeline* t) { return t != nullptr && t->on(); }
inline bool Recording(const std::unique_ptr<Timeline>& t) { return Recording(t.get()); }

// `text` as a JSON string literal (quotes included).
std::string JsonString(absl::string_view text);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_TIMELINE_H_
