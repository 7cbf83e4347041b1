#include "common/partition.h"

#include <algorithm>

namespace hybridps {

uint64_t TensorKey(absl::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  // splitmix64 finaliser: FNV alone leaves the low bits poorly mixed for short names.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

std::vector<Partition> PartitionTensor(uint64_t key, size_t count, DType dtype,
                                       size_t partition_bytes, int num_servers) {
  const size_t max_elems = std::max<size_t>(1, partition_bytes / DTypeSize(dtype));
  const size_t servers = static_cast<size_t>(num_servers);
  size_t parts = std::max<size_t>(1, (count + max_elems - 1) / max_elems);
  if (count * DTypeSize(dtype) >= servers * kSplitBytesPerServer && count >= servers) {
    parts = (parts + servers - 1) / servers * servers;
  }
  const size_t base = count / parts;
  const size_t extra = count % parts;
  // Use the high bits: the low bits of `key` also pick engine threads on the server.
  const uint64_t start = (key >> 32) % static_cast<uint64_t>(num_servers);
  std::vector<Partition> out(parts);
  size_t offset = 0;
  for (size_t i = 0; i < parts; ++i) {
    Partition& p = out[i];
    p.index = static_cast<uint32_t>(i);
    p.offset = offset;
    p.count = base + (i < extra ? 1 : 0);
    p.server = static_cast<int>((start + i) % static_cast<uint64_t>(num_servers));
    offset += p.count;
  }
  return out;
}

}  // namespace hybridps
