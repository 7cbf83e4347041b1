// Linked into every GoogleTest binary of ours: abseil's mutex deadlock detection on, so
// that a lock-order cycle aborts the test (the library turns it off, common/log.cc).
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"

namespace {

class DeadlockDetection : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  }
};

[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new DeadlockDetection);

}  // namespace
