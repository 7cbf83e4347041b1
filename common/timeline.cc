#include "common/timeline.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"

namespace hybridps {

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::unique_ptr<Timeline> Timeline::Open(const std::string& prefix, const std::string& label,
                                         int row, std::vector<std::string> lanes,
                                         size_t capacity) {
  if (prefix.empty()) return nullptr;
  return std::unique_ptr<Timeline>(
      new Timeline(prefix, label, row, std::move(lanes), std::max<size_t>(capacity, 1)));
}

std::unique_ptr<Timeline> Timeline::OpenOrDormant(const std::string& prefix,
                                                  const std::string& label, int row,
                                                  std::vector<std::string> lanes,
                                                  size_t capacity) {
  return std::unique_ptr<Timeline>(
      new Timeline(prefix, label, row, std::move(lanes), std::max<size_t>(capacity, 1)));
}

absl::Status Timeline::Start(std::string path) {
  if (path.empty()) return absl::InvalidArgumentError("the timeline needs a file path");
  absl::MutexLock lock(&mu_);
  if (on()) {
    return absl::FailedPreconditionError(
        !started_path_.empty()
            ? absl::StrCat("a timeline is already being recorded (to ", started_path_,
                           "); stop it first")
            : absl::StrCat("this process records its timeline already (HYBRIDPS_TIMELINE=",
                           prefix_, ", written when it ends)"));
  }
  events_.clear();
  dropped_ = 0;
  started_path_ = std::move(path);
  started_ = absl::Now();
  on_.store(true, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status Timeline::Stop(absl::Duration clock_offset, std::string* path) {
  std::string file;
  std::vector<std::string> lanes;
  std::deque<Event> events;
  uint64_t dropped = 0;
  {
    // Taken out under the lock and written after it, so that Span never waits on a file.
    absl::MutexLock lock(&mu_);
    if (started_path_.empty()) return absl::OkStatus();
    on_.store(false, std::memory_order_relaxed);
    file = std::exchange(started_path_, std::string());
    started_ = absl::InfinitePast();
    lanes = lanes_;
    events.swap(events_);
    dropped = std::exchange(dropped_, 0);
  }
  absl::Status s = WriteFile(file, clock_offset, lanes, events, dropped);
  if (s.ok() && path != nullptr) *path = file;
  return s;
}

void Timeline::Span(std::string name, absl::string_view category, absl::Time start,
                    absl::Time end, int lane, std::string args) {
  if (!on()) return;
  Event e{std::move(name), std::string(category), absl::ToUnixMicros(start),
          std::max<int64_t>(0, absl::ToInt64Microseconds(end - start)), lane,
          std::move(args)};
  absl::MutexLock lock(&mu_);
  if (start < started_ || !on()) return;  // began before Start (or after Stop)
  if (events_.size() >= capacity_) {
    events_.pop_front();
    ++dropped_;
  }
  events_.push_back(std::move(e));
}

int Timeline::AddLane(std::string name) {
  absl::MutexLock lock(&mu_);
  lanes_.push_back(std::move(name));
  return static_cast<int>(lanes_.size()) - 1;
}

void Timeline::WriteAndLog(absl::Duration clock_offset) {
  if (prefix_.empty()) return;
  std::string path;
  if (absl::Status s = Write(clock_offset, &path); !s.ok()) {
    HPS_LOG(WARNING) << s.message();
  } else {
    HPS_LOG(INFO) << "wrote the timeline " << path;
  }
}

absl::Status Timeline::Write(absl::Duration clock_offset, std::string* path) {
  if (prefix_.empty()) return absl::OkStatus();  // a dormant timeline: Stop writes
  std::string name = label_;
  std::replace(name.begin(), name.end(), ' ', '-');
  const std::string file = absl::StrCat(prefix_, ".", name, ".json");
  absl::MutexLock lock(&mu_);
  absl::Status s = WriteFile(file, clock_offset, lanes_, events_, dropped_);
  if (s.ok() && path != nullptr) *path = file;
  return s;
}

absl::Status Timeline::WriteFile(const std::string& file, absl::Duration clock_offset,
                                 const std::vector<std::string>& lanes,
                                 const std::deque<Event>& events, uint64_t dropped) const {
  const int64_t offset_us = absl::ToInt64Microseconds(clock_offset);
  std::string out = "{\"traceEvents\": [\n";
  absl::StrAppend(&out, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": ", row_,
                  ", \"args\": {\"name\": ", JsonString(label_), "}},\n");
  absl::StrAppend(&out, "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": ", row_,
                  ", \"args\": {\"sort_index\": ", row_, "}}");
  for (size_t i = 0; i < lanes.size(); ++i) {
    absl::StrAppend(&out, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": ", row_,
                    ", \"tid\": ", i, ", \"args\": {\"name\": ", JsonString(lanes[i]), "}}");
  }
  for (const Event& e : events) {
    absl::StrAppend(&out, ",\n{\"name\": ", JsonString(e.name), ", \"cat\": ",
                    JsonString(e.category), ", \"ph\": \"X\", \"ts\": ",
                    e.start_us - offset_us, ", \"dur\": ", e.dur_us, ", \"pid\": ", row_,
                    ", \"tid\": ", e.lane, ", \"args\": {", e.args, "}}");
  }
  absl::StrAppend(&out, "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"process\": ",
                  JsonString(label_), ", \"dropped_spans\": ", dropped,
                  ", \"clock_offset_us\": ", offset_us, "}}\n");
  const std::string tmp = file + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << out;
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write the timeline ", tmp));
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", file));
  }
  return absl::OkStatus();
}

}  // namespace hybridps
