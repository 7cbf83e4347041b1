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

// The elements [begin, end) of a tensor of `count` that rank `rank` of `n` owns when the
// ranks split it evenly (the first count % n get one more): a two-shot's halves, a
// shared-memory chunk's slices, a direct allreduce's shares.
struct Chunk {
  uint64_t begin = 0;
  uint64_t end = 0;
};
Chunk ChunkOf(uint64_t count, int rank, int n);

// The 64-bit key of a tensor: a hash of its name (FNV-1a, then a 64-bit finaliser).
uint64_t TensorKey(absl::string_view name);

struct Partition {
  uint32_t index = 0;     // 0 .. num_partitions-1
  size_t offset = 0;      // first element
  size_t count = 0;       // elements
  int server = 0;         // rank of the server that owns it
};

// A tensor is split over the servers when every server's share of it (ServerShare) would
// be at least kSplitBytesPerServer bytes: with S even shares, from S * 128 KiB, into a
// multiple of S partitions (at most one per element). A smaller one is cut into nearly
// equal pieces of at least 128 KiB (one piece under 256 KiB; smaller pieces only when
// partition_bytes is) dealt to fewer servers. Why 128 KiB (larger leaves mid-size tensors
// whole on one server, smaller makes pieces too small to pay for their requests):
// docs/design/cluster.md.
inline constexpr size_t kSplitBytesPerServer = 128 << 10;

// Splits `count` elements of `dtype` into P partitions of nearly equal size (they differ
// by at most one element), each at most partition_bytes (at least one element each). P is
// ceil(bytes / partition_bytes), rounded up to a multiple of num_servers for a tensor
// large enough to split (see above); for a smaller one, at least floor(bytes / 128 KiB).
// An empty tensor has one empty partition, so it still takes part in a round and size
// mismatches are still caught. Partition i of tensor `key` goes to server
// (Mix(key) + i) mod num_servers: a large tensor is spread evenly over all servers, and
// over a model's tensors every server's bytes stay within a piece per tensor of the mean.
// Requires partition_bytes >= 1 and num_servers >= 1.
std::vector<Partition> PartitionTensor(uint64_t key, size_t count, DType dtype,
                                       size_t partition_bytes, int num_servers);

// Where the servers run. colocated (a server beside each worker) and dedicated (servers
// on their own hosts) both spread the bytes evenly: extra_servers == 0. mixed: servers
// 0..n-1 beside the n worker hosts, n..n+k-1 on k extra hosts (extra_servers = k). An
// extra server only receives (its host sends nothing of its own), a colocated one also
// sends its worker's share, so BytePS's optimum gives the extra ones more bytes:
// MixedExtraShare(n, k) = 2k(n-1) / (n(n+k) - 2k) of the total, the iteration time then
// being 2n(n-1)S / ((n^2+kn-2k)B).
struct ServerPlacement {
  int num_servers = 1;
  int extra_servers = 0;  // 0 <= extra_servers < num_servers
};

// Cuts every partition larger than chunk_bytes into nearly equal pieces of at most
// chunk_bytes (at least one element each) that keep its server, renumbered 0..N-1 in
// order. The pieces travel as separate requests, so one partition's push, sum and pull
// overlap instead of running one after the other. chunk_bytes == 0 returns `parts`
// unchanged.
std::vector<Partition> SplitIntoChunks(std::vector<Partition> parts, DType dtype,
                                       size_t chunk_bytes);

// Fraction of the bytes the k extra servers get with n colocated ones; 0 when k == 0 or
// n <= 1 (one worker host: its colocated server is reached without the network).
double MixedExtraShare(int colocated, int extra);

// Share of the bytes server `server` should own under `placement` (sums to 1).
double ServerShare(const ServerPlacement& placement, int server);

// The smallest positive ServerShare (a colocated server of 2 worker hosts + 2 extra ones
// has none): a tensor is split by the shares when that share of it is at least
// kSplitBytesPerServer bytes.
double SmallestShare(const ServerPlacement& placement);

// Connections a worker opens to `server` (Options::max_server_lanes): its ServerShare over
// the smallest positive share, rounded, in [1, max_lanes]. TCP shares a congested link
// per connection, so connections in proportion to bytes give every server the share of
// the workers' links its bytes need.
int ServerLanes(const ServerPlacement& placement, int server, int max_lanes);

// As above, with the servers weighted by ServerShare. extra_servers == 0 gives exactly
// the uniform placement above. Otherwise a tensor large enough to split (every server's
// share at least kSplitBytesPerServer) gives each server a number of elements in
// proportion to its share (exact to an element). A smaller one is cut into nearly equal
// pieces of at least kSplitBytesPerServer (one piece under twice that) dealt to the
// servers by systematic sampling from the key's hash: each server gets floor or ceil of
// its share of the pieces, so the shares hold over a model's tensors to within a piece
// per tensor.
// Either way every piece is at most partition_bytes (at least one element), laid out
// interleaved (the next belongs to the server furthest behind its elements), so a worker
// pushing the tensor in order keeps every server busy.
std::vector<Partition> PartitionTensor(uint64_t key, size_t count, DType dtype,
                                       size_t partition_bytes,
                                       const ServerPlacement& placement);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_PARTITION_H_
