// Tensor partitioning and key placement. Every worker computes both identically from the
// tensor's name, size and dtype alone — never from the order tensors were declared in, so
// workers that create their tensors in different orders still agree (BytePS hangs there).
#ifndef HYBRIDPS_COMMON_PARTITION_H_
#define HYBRIDPS_COMMON_PARTITION_H_

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"
#include <vector>

#include "common/dtype.h"

namespace hybridps {

// The 64-bit key of a tensor: a hash of its name (FNV-1a, then a 64-bit finaliser).
uint64_t TensorKey(absl::string_view name);

struct Partition {
  uint32_t index = 0;     // 0 .. num_partitions-1
  size_t offset = 0;      // first element
  size_t count = 0;       // elements
  int server = 0;         // rank of the server that owns it
};

// A tensor of at least num_servers * kSplitBytesPerServer bytes is split into a multiple
// of num_servers partitions, so it spreads evenly over every server.
inline constexpr size_t kSplitBytesPerServer = 256 << 10;

// Splits `count` elements of `dtype` into P = ceil(bytes / partition_bytes) partitions
// (rounded up to a multiple of num_servers for tensors large enough, see above) of nearly
// equal size (they differ by at most one element), each at most partition_bytes (at least
// one element each). An empty tensor has one empty partition, so it still takes part in a
// round and size mismatches are still caught. Partition i of tensor `key` goes to server
// (Mix(key) + i) mod num_servers: large tensors are spread evenly over all servers, small
// ones scattered by their hash.
// Requires partition_bytes >= 1 and num_servers >= 1.
std::vector<Partition> PartitionTensor(uint64_t key, size_t count, DType dtype,
                                       size_t partition_bytes, int num_servers);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_PARTITION_H_
