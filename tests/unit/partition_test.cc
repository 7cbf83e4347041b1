#include "common/partition.h"

#include <gtest/gtest.h>

namespace hybridps {
namespace {
TEST(Partition, Empty) {
  auto p = PartitionTensor(TensorKey("a"), 0, DType::kFloat32, 16, 3);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].count, 0u);
}
}  // namespace
}  // namespace hybridps
