#include "worker/ps/server_window.h"

#include <gtest/gtest.h>

namespace hybridps {
namespace {

using Order = ServerWindows::Order;

// Orders every worker shares: priority (negated), key, partition.
Order At(uint64_t key, uint32_t part = 0, int64_t priority = 0) {
  return Order{-priority, key, part};
}

TEST(ServerWindowsTest, NoWindowAdmitsEverything) {
  ServerWindows w(1, 0);
  w.Sent(0, At(1), 1 << 30);
  EXPECT_TRUE(w.Admits(0, At(2), 1 << 30));
}

TEST(ServerWindowsTest, PushesWithinTheWindowGo) {
  ServerWindows w(2, 100);
  EXPECT_TRUE(w.Admits(0, At(1), 100));
  w.Sent(0, At(1), 60);
  EXPECT_TRUE(w.Admits(0, At(2), 40));   // 100 in all
  EXPECT_FALSE(w.Admits(0, At(2), 41));  // 60 ahead of it, and 41 more is past the window
  EXPECT_TRUE(w.Admits(1, At(2), 100));  // each server has its own window
  EXPECT_EQ(w.unanswered(0), 60u);
  EXPECT_EQ(w.unanswered(1), 0u);
}

TEST(ServerWindowsTest, TheEarliestPushAlwaysGoes) {
  // Pushes later in the shared order do not hold up an earlier one: the other workers
  // answer those only once they reach them, after this one.
  ServerWindows w(1, 100);
  w.Sent(0, At(5), 90);
  w.Sent(0, At(6), 90);
  EXPECT_TRUE(w.Admits(0, At(1), 100));
  EXPECT_TRUE(w.Admits(0, At(5, 0, /*priority=*/1), 100));  // a higher priority comes first
}

TEST(ServerWindowsTest, AllUnansweredPushesStayWithinTwoWindows) {
  ServerWindows w(1, 100);
  w.Sent(0, At(1), 10);   // ahead of what follows
  w.Sent(0, At(9), 150);  // behind it
  EXPECT_TRUE(w.Admits(0, At(2), 40));   // 10 ahead + 40 <= 100, 200 in all <= 200
  EXPECT_FALSE(w.Admits(0, At(2), 41));  // 201 in all
}

TEST(ServerWindowsTest, AnswersReopenTheWindow) {
  ServerWindows w(1, 100);
  w.Sent(0, At(1), 70);
  w.Sent(0, At(1), 30);  // the same place in the order twice (two rounds of one tensor)
  EXPECT_FALSE(w.Admits(0, At(2), 50));
  w.Answered(0, At(1), 70);
  EXPECT_EQ(w.unanswered(0), 30u);
  EXPECT_TRUE(w.Admits(0, At(2), 50));
  w.Answered(0, At(1), 30);
  w.Answered(0, At(1), 30);  // an answer for nothing counted changes nothing
  EXPECT_EQ(w.unanswered(0), 0u);
}

TEST(ServerWindowsTest, EachServerHasItsOwnWindow) {
  // Servers with more connections (a larger byte share) get wider windows.
  ServerWindows w(std::vector<size_t>{100, 300, 0});
  w.Sent(0, At(1), 100);
  w.Sent(1, At(1), 100);
  w.Sent(2, At(1), 1000);
  EXPECT_FALSE(w.Admits(0, At(2), 1));
  EXPECT_TRUE(w.Admits(1, At(2), 200));
  EXPECT_FALSE(w.Admits(1, At(2), 201));
  EXPECT_TRUE(w.Admits(2, At(2), 1 << 30));  // no window at server 2
}

}  // namespace
}  // namespace hybridps
