// A handle's Wait (worker/handle.h): the status once the operation completes, from any
// thread; past the store's deadline plus grace, DeadlineExceeded naming the operation
// while the operation stays pending (its tensors still the store's).
#include "worker/handle.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

TEST(HandleTest, WaitReturnsTheStatusTheStoreCompletesWith) {
  auto state = std::make_shared<HandleState>();
  state->SetDeadline(absl::Now() + absl::Hours(1), "push_pull of 'w'");
  Handle h(state);
  std::thread store([state] {
    absl::SleepFor(absl::Milliseconds(50));
    state->Complete(absl::UnavailableError("server 1 died"));
  });
  const absl::Status s = h.Wait();
  store.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(h.Done());
  EXPECT_EQ(h.Wait().code(), absl::StatusCode::kUnavailable);  // again, at once
}

TEST(HandleTest, WaitGivesUpAtTheDeadlineNamingTheOperationWhichStaysPending) {
  auto state = std::make_shared<HandleState>();
  const absl::Time give_up = absl::Now() + absl::Milliseconds(200);
  state->SetDeadline(give_up, "push_pull of 'layer1.weight' (10 float32 elements)");
  Handle h(state);
  const absl::Status s = h.Wait();
  EXPECT_GE(absl::Now(), give_up);
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "push_pull of 'layer1.weight'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "threads are stuck")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "keep their memory alive")) << s;
  // Not complete: the store may still finish it, and then Wait has its status.
  EXPECT_FALSE(h.Done());
  state->Complete(absl::OkStatus());
  EXPECT_TRUE(h.Done());
  EXPECT_OK(h.Wait());
}

// A store names its operation only when Wait gives up (no formatting per operation).
TEST(HandleTest, TheOperationIsNamedOnlyWhenWaitGivesUp) {
  int named = 0;
  auto describe = [&named] {
    ++named;
    return std::string("push_pull of 'w' (10 float32 elements)");
  };
  auto done = std::make_shared<HandleState>();
  done->SetDeadline(absl::Now() + absl::Hours(1), describe);
  done->Complete(absl::OkStatus());
  EXPECT_OK(Handle(done).Wait());
  EXPECT_EQ(named, 0);

  auto stuck = std::make_shared<HandleState>();
  stuck->SetDeadline(absl::Now() + absl::Milliseconds(50), describe);
  const absl::Status s = Handle(stuck).Wait();
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "push_pull of 'w' (10 float32 elements) is not "
                                             "complete")) << s;
  EXPECT_EQ(named, 1);
}

TEST(HandleTest, WithoutADeadlineWaitWaitsForCompletion) {
  auto state = std::make_shared<HandleState>();
  Handle h(state);
  std::thread store([state] {
    absl::SleepFor(absl::Milliseconds(300));
    state->Complete(absl::OkStatus());
  });
  EXPECT_OK(h.Wait());
  store.join();
}

}  // namespace
}  // namespace hybridps
