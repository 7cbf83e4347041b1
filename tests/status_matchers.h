// Assertions on absl::Status and absl::StatusOr that print the status when they fail:
//   ASSERT_OK(kv->PushPull(...));           EXPECT_OK(status_or);
//   ASSERT_OK_AND_ASSIGN(auto store, PsStore::Create(ctx, options));
// Each evaluates its expression once; extra context streams in as with ASSERT_TRUE:
//   ASSERT_OK(h.Wait()) << "tensor " << name;
#ifndef HYBRIDPS_TESTS_STATUS_MATCHERS_H_
#define HYBRIDPS_TESTS_STATUS_MATCHERS_H_

#include <gtest/gtest.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace hybridps::testing {

inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

template <typename S>
::testing::AssertionResult IsOk(const char* text, const S& s) {
  const absl::Status& status = StatusOf(s);
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text << " is not OK: " << status;
}

// Whether `text` contains `what`, printing the text when not.
inline ::testing::AssertionResult Mentions(absl::string_view text, absl::string_view what) {
  if (absl::StrContains(text, what)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << what << "' not in: " << text;
}

}  // namespace hybridps::testing

#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::hybridps::testing::IsOk, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::hybridps::testing::IsOk, expr)

#define HPS_TEST_CONCAT_INNER(a, b) a##b
#define HPS_TEST_CONCAT(a, b) HPS_TEST_CONCAT_INNER(a, b)
// `lhs` = the value of the StatusOr `rexpr`, or the test returns with its status printed.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  HPS_ASSERT_OK_AND_ASSIGN_IMPL(HPS_TEST_CONCAT(hps_status_or_, __LINE__), lhs, rexpr)
#define HPS_ASSERT_OK_AND_ASSIGN_IMPL(var, lhs, rexpr) \
  auto var = (rexpr);                                  \
  ASSERT_OK(var);                                      \
  lhs = std::move(var).value()

#endif  // HYBRIDPS_TESTS_STATUS_MATCHERS_H_
