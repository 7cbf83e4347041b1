// The timeline file: its JSON, names escaped, the clock moved onto the scheduler's, and a
// bounded memory whose drops are counted.
#include "common/timeline.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace hybridps
