// MXNet's float kwargs: Python's repr, then dmlc-core's strtof. The expected floats
// were produced by MXNet 1.9.1 itself (adam_update with lr = value, beta1 = beta2 = 0,
// epsilon = 0 returns -lr); most "differs" cases are one ulp from (float)value.
#include "optimizers/mxnet_float.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace hybridps {
namespace optimizers {
namespace internal {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(MxnetFloatTest, PythonRepr) {
  EXPECT_EQ(PythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(1e-05), "1e-05");
  EXPECT_EQ(PythonFloatRepr(100.0), "100.0");
  EXPECT_EQ(PythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(-0.5), "-0.5");
  EXPECT_EQ(PythonFloatRepr(0.0), "0.0");
  EXPECT_EQ(PythonFloatRepr(1.5e300), "1.5e+300");
  EXPECT_EQ(PythonFloatRepr(7.734037008573379e-05), "7.734037008573379e-05");
}

TEST(MxnetFloatTest, MatchesWhatMxnetReceived) {
  struct Case {
    double value;
    uint32_t mxnet_bits;
    const char* repr;
  };
  const Case cases[] = {
      {7.734037008573379e-05, 0x38a231cbu, "7.734037008573379e-05"},    // differs
      {0.1, 0x3dcccccdu, "0.1"},                                        // same
      {0.9, 0x3f666666u, "0.9"},                                        // same
      {0.999, 0x3f7fbe77u, "0.999"},                                    // same
      {1e-08, 0x322bcc77u, "1e-08"},                                    // same
      {0.01, 0x3c23d70au, "0.01"},                                      // same
      {123.456, 0x42f6e979u, "123.456"},                                // same
      {1e+16, 0x5a0e1bcau, "1e+16"},                                    // same
      {2.5e-30, 0x0e4ad2f8u, "2.5e-30"},                                // same
      {0.0005, 0x3a03126fu, "0.0005"},                                  // same
      {9.141958827209882e-08, 0x33c45274u, "9.141958827209882e-08"},    // differs
      {8.743226447892378e-09, 0x3216351du, "8.743226447892378e-09"},    // differs
      {7.981904730763791e-07, 0x3556433cu, "7.981904730763791e-07"},    // differs
      {7.504401881169257e-08, 0x33a127e2u, "7.504401881169257e-08"},    // differs
      {6.936941873338535e-05, 0x38917a6du, "6.936941873338535e-05"},    // differs
      {4.758425417339884e-07, 0x34ff774cu, "4.758425417339884e-07"},    // differs
      {3.426534566693421e-08, 0x33132b26u, "3.426534566693421e-08"},    // differs
      {6.147556923087145e-09, 0x31d33a7bu, "6.147556923087145e-09"},    // differs
      {1.1157243608128572e-08, 0x323fae13u, "1.1157243608128572e-08"},  // differs
      {1.9535767157648583e-07, 0x3451c383u, "1.9535767157648583e-07"},  // differs
      {1.079864061522123e-06, 0x3590efd8u, "1.079864061522123e-06"},    // differs
      {1.288075859705538e-07, 0x340a4e5du, "1.288075859705538e-07"},    // differs
      {8.534072132057087e-08, 0x33b7448eu, "8.534072132057087e-08"},    // differs
      {8.86366575039666e-07, 0x356deea5u, "8.86366575039666e-07"},      // differs
  };
  for (const Case& c : cases) {
    EXPECT_EQ(PythonFloatRepr(c.value), c.repr);
    EXPECT_EQ(Bits(MxnetKwargFloat(c.value)), c.mxnet_bits) << c.repr;
    EXPECT_EQ(Bits(MxnetKwargFloat(-c.value)), c.mxnet_bits | 0x80000000u) << c.repr;
  }
  EXPECT_EQ(MxnetKwargFloat(0.0), 0.f);
  EXPECT_TRUE(std::isinf(MxnetKwargFloat(1e300)));  // out of float range: plain conversion
}

}  // namespace
}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps
