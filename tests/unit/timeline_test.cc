// The timeline file: its JSON, names escaped, the clock moved onto the scheduler's, a
// bounded memory whose drops are counted, and a recording started and stopped at run time.
#include "common/timeline.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(TimelineTest, OffWithoutAPrefix) {
  EXPECT_EQ(Timeline::Open("", "worker 0", 100, {"operations"}), nullptr);
}

TEST(TimelineTest, WritesTraceEventsEscapedShiftedAndBounded) {
  const std::string prefix = ::testing::TempDir() + "/tl";
  auto t = Timeline::Open(prefix, "worker 3", 103, {"operations", "to server 0"},
                          /*capacity=*/3);
  ASSERT_NE(t, nullptr);
  const absl::Time t0 = absl::FromUnixMicros(1'000'000);
  t->Span("dropped", "c", t0, t0 + absl::Microseconds(1), 0);
  t->Span("push_pull of 'a\"b\\\\c'\n", "operation", t0, t0 + absl::Microseconds(250), 0,
          "\"bytes\": 64");
  t->Span("x", "c", t0 + absl::Microseconds(300), t0 + absl::Microseconds(200), 1);
  t->Span("y", "c", t0, t0, 0);
  std::string path;  // our clock runs 40 µs ahead of the scheduler's
  ASSERT_OK(t->Write(absl::Microseconds(40), &path));
  EXPECT_EQ(path, prefix + ".worker-3.json");
  const std::string json = Read(path);
  EXPECT_TRUE(absl::StrContains(json, "\"name\": \"push_pull of 'a\\\"b\\\\\\\\c'\\n\""))
      << json;
  EXPECT_TRUE(absl::StrContains(json, "\"ts\": 999960, \"dur\": 250")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"args\": {\"bytes\": 64}")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"dur\": 0, \"pid\": 103, \"tid\": 1")) << json;  // x
  EXPECT_FALSE(absl::StrContains(json, "\"dropped\"")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"dropped_spans\": 1")) << json;
  EXPECT_TRUE(absl::StrContains(json, "{\"name\": \"to server 0\"}")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"process\": \"worker 3\"")) << json;
}

TEST(TimelineTest, ADormantOneRecordsBetweenStartAndStopOnly) {
  auto t = Timeline::OpenOrDormant("", "worker 0", 100, {"operations"});
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->on());
  const absl::Time before = absl::Now();
  t->Span("not started", "c", before, before, 0);
  ASSERT_OK(t->Stop(absl::ZeroDuration()));  // nothing started: nothing written
  const std::string path = ::testing::TempDir() + "/started.json";
  std::remove(path.c_str());
  ASSERT_OK(t->Start(path));
  EXPECT_TRUE(t->on());
  absl::Status again = t->Start(path);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_TRUE(absl::StrContains(again.message(), path)) << again;
  t->Span("began before the start", "c", before, absl::Now(), 0);
  const absl::Time now = absl::Now();
  t->Span("recorded", "operation", now, now + absl::Microseconds(5), 0);
  std::string written;
  ASSERT_OK(t->Stop(absl::ZeroDuration(), &written));
  EXPECT_EQ(written, path);
  EXPECT_FALSE(t->on());
  t->Span("after the stop", "c", absl::Now(), absl::Now(), 0);
  const std::string json = Read(path);
  EXPECT_TRUE(absl::StrContains(json, "\"recorded\"")) << json;
  EXPECT_FALSE(absl::StrContains(json, "before")) << json;
  EXPECT_FALSE(absl::StrContains(json, "not started")) << json;
  EXPECT_FALSE(absl::StrContains(json, "after the stop")) << json;
  // A second recording starts empty; the end of the process writes nothing of it.
  ASSERT_OK(t->Start(path + ".2"));
  ASSERT_OK(t->Stop(absl::ZeroDuration()));
  EXPECT_FALSE(absl::StrContains(Read(path + ".2"), "recorded"));
  std::string none;
  ASSERT_OK(t->Write(absl::ZeroDuration(), &none));
  EXPECT_EQ(none, "");
}

TEST(TimelineTest, StartIsRefusedWhileTheProcessRecordsItsWholeTimeline) {
  auto t = Timeline::OpenOrDormant(::testing::TempDir() + "/env", "worker 1", 101, {"ops"});
  EXPECT_TRUE(t->on());
  absl::Status s = t->Start(::testing::TempDir() + "/other.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "HYBRIDPS_TIMELINE")) << s;
  EXPECT_EQ(t->Start("").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridps
