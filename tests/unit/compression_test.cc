// MXNet's 2bit gradient compression: the codes, the error feedback, and packed data from
// the network that does not fit refused by name.
#include "common/compression.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

TEST(TwoBitTest, CodesEachElementAndKeepsWhatWasNotSent) {
  const std::vector<float> grad = {0.7f, -0.7f, 0.2f, -0.5f, 0.5f, 1.6f, 0.0f};
  std::vector<float> residual(grad.size(), 0.0f);
  std::string packed(TwoBitBytes(grad.size()), '\xff');
  ASSERT_EQ(packed.size(), 4u);  // 16 elements per float, as MXNet's
  TwoBitQuantize(grad.data(), grad.size(), 0.5f, residual.data(), packed.data());
  // 11 10 00 10 | 11 11 00 00 (the first element in the top bits), then zero padding.
  EXPECT_EQ(static_cast<uint8_t>(packed[0]), 0xE2);
  EXPECT_EQ(static_cast<uint8_t>(packed[1]), 0xF0);
  EXPECT_EQ(packed.substr(2), std::string(2, '\0'));
  std::vector<float> sent(grad.size());
  ASSERT_OK(TwoBitDequantize(packed, grad.size(), 0.5f, sent.data()));
  EXPECT_EQ(sent, (std::vector<float>{0.5f, -0.5f, 0.0f, -0.5f, 0.5f, 0.5f, 0.0f}));
  for (size_t i = 0; i < grad.size(); ++i) {
    EXPECT_FLOAT_EQ(residual[i], grad[i] - sent[i]) << i;  // what was not sent is kept
  }
  // The next push adds to the residual: 0.2 + 0.4 reaches the threshold now.
  const std::vector<float> more = {0.0f, 0.0f, 0.4f, 0.0f, 0.0f, 0.0f, 0.0f};
  TwoBitQuantize(more.data(), more.size(), 0.5f, residual.data(), packed.data());
  ASSERT_OK(TwoBitDequantize(packed, more.size(), 0.5f, sent.data()));
  EXPECT_EQ(sent[2], 0.5f);
  EXPECT_NEAR(residual[2], 0.1f, 1e-6);
  EXPECT_EQ(sent[5], 0.5f);  // 1.1 left of 1.6: one threshold per push
}

TEST(TwoBitTest, PackedDataThatDoesNotFitIsRefused) {
  std::vector<float> out(20);
  absl::Status s = TwoBitDequantize(std::string(4, '\0'), 20, 0.5f, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "takes 8 bytes, not 4")) << s;
  s = TwoBitDequantize(std::string(4, '\x40'), 3, 0.5f, out.data());  // code 01
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "01")) << s;
  for (float t : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_FALSE(CheckGradientCompression({Compression::kTwoBit, t}).ok()) << t;
  }
  EXPECT_OK(CheckGradientCompression({Compression::kNone, -1.0f}));
  EXPECT_FALSE(CheckGradientCompression({static_cast<Compression>(7), 0.5f}).ok());
}

}  // namespace
}  // namespace hybridps
