// Logging (common/log.h): HPS_LOG_EVERY_SEC writes one line per call site and interval,
// and the next line says how many it left out, so that a flood of bad input from a peer
// costs a line a second, not a line a message.
#include "common/log.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace hybridps {
namespace {

TEST(LogRateTest, OneLinePerIntervalThenHowManyWereLeftOut) {
  LogRate rate(absl::Seconds(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  uint64_t dropped = 99;
  ASSERT_TRUE(rate.Allow(t0, &dropped));
  EXPECT_EQ(dropped, 0u);
  for (int i = 1; i <= 5; ++i) {
    EXPECT_FALSE(rate.Allow(t0 + absl::Milliseconds(100 * i), &dropped)) << i;
  }
  ASSERT_TRUE(rate.Allow(t0 + absl::Milliseconds(1000), &dropped));
  EXPECT_EQ(dropped, 5u);
  EXPECT_FALSE(rate.Allow(t0 + absl::Milliseconds(1500), &dropped));
  ASSERT_TRUE(rate.Allow(t0 + absl::Seconds(10), &dropped));
  EXPECT_EQ(dropped, 1u);
}

// Each call site has its own budget; the macro is one statement.
TEST(LogRateTest, TheMacroLimitsEachCallSiteOnItsOwn) {
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 1000; ++i) {
    if (i >= 0) HPS_LOG_EVERY_SEC(WARNING, 3600) << "first site " << i;  // unbraced if
    HPS_LOG_EVERY_SEC(WARNING, 3600) << "second site " << i;
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_TRUE(absl::StrContains(lines[0], "first site 0")) << out;
  EXPECT_TRUE(absl::StrContains(lines[1], "second site 0")) << out;
}

TEST(LogRateTest, ALineSaysHowManyWereLeftOutBeforeIt) {
  ::testing::internal::CaptureStderr();
  { LogMessage(LogLevel::WARNING, "x.cc", 1, 41).stream() << "rejected a message"; }
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(out, "rejected a message (and 41 more like it since the last)"))
      << out;
}

// A process set's store and scheduler run inside a worker: their SetLogTag calls leave
// the process's tag alone, and the pinning thread's lines carry its own tag.
TEST(LogTagTest, AScopedTagPinsTheThreadAndLeavesTheProcessTag) {
  SetLogTag("worker 3");
  ::testing::internal::CaptureStderr();
  {
    ScopedLogTag pin("worker 3 process set 1");
    SetLogTag("worker 0");  // what the set's store would set: ignored on this thread
    HPS_LOG(ERROR) << "pinned line";
  }
  HPS_LOG(ERROR) << "process line";
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_TRUE(absl::StrContains(lines[0], " worker 3 process set 1 log_test.cc")) << out;
  EXPECT_TRUE(absl::StrContains(lines[1], " worker 3 log_test.cc")) << out;
  EXPECT_EQ(LogTag(), "worker 3");
  SetLogTag("");
}

}  // namespace
}  // namespace hybridps

// The library turns abseil's mutex deadlock detection off (common/log.cc); our test
// binaries turn it back on (tests/deadlock_detection.cc), so a lock-order cycle in a test
// aborts it, naming the cycle. (It needs an abseil built without NDEBUG, as Debian's:
// a release build of abseil compiles the detection out.)
TEST(DeadlockDetectionDeathTest, ALockOrderCycleAbortsATest) {
  auto cycle = [] {
    absl::Mutex a;
    absl::Mutex b;
    a.Lock();
    b.Lock();
    b.Unlock();
    a.Unlock();
    b.Lock();
    a.Lock();  // b before a, after a before b: a cycle
    a.Unlock();
    b.Unlock();
  };
  EXPECT_DEATH(cycle(), "[Dd]eadlock");
}
