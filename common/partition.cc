#include "common/partition.h"

#include <algorithm>
#include <cmath>

#include "common/hash.h"

namespace hybridps {

Chunk ChunkOf(uint64_t count, int rank, int n) {
  const uint64_t each = count / n, extra = count % n;
  const uint64_t r = static_cast<uint64_t>(rank);
  const uint64_t begin = each * r + std::min(r, extra);
  return Chunk{begin, begin + each + (r < extra ? 1 : 0)};
}

uint64_t TensorKey(absl::string_view name) {
  uint64_t h = Fnv1a64(name);
  // splitmix64 finaliser: FNV alone leaves the low bits poorly mixed for short names.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

namespace {

// The number of partitions of a tensor too small to split over every server: nearly
// equal pieces of at least kSplitBytesPerServer (one piece under twice that), each at
// most max_elems elements (which wins when partition_bytes is smaller). Dealt to the
// servers piece by piece, a model's tensors then load every server to within a piece per
// tensor of its share; whole tensors drawn by hash leave some server several per cent
// over, more the more servers (docs/design/cluster.md).
size_t SmallTensorPieces(size_t count, size_t elem, size_t max_elems) {
  return std::max<size_t>({1, count * elem / kSplitBytesPerServer,
                           (count + max_elems - 1) / max_elems});
}

}  // namespace

std::vector<Partition> PartitionTensor(uint64_t key, size_t count, DType dtype,
                                       size_t partition_bytes, int num_servers) {
  const size_t elem = DTypeSize(dtype);
  const size_t max_elems = std::max<size_t>(1, partition_bytes / elem);
  const size_t servers = static_cast<size_t>(num_servers);
  size_t parts = 0;
  if (count * elem / servers >= kSplitBytesPerServer && count >= servers) {
    parts = std::max<size_t>(1, (count + max_elems - 1) / max_elems);
    // A multiple of the servers, but never more partitions than elements.
    parts = std::min(count, (parts + servers - 1) / servers * servers);
  } else {
    parts = SmallTensorPieces(count, elem, max_elems);
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

std::vector<Partition> SplitIntoChunks(std::vector<Partition> parts, DType dtype,
                                       size_t chunk_bytes) {
  if (chunk_bytes == 0) return parts;
  const size_t max_elems = std::max<size_t>(1, chunk_bytes / DTypeSize(dtype));
  std::vector<Partition> out;
  out.reserve(parts.size());
  for (const Partition& p : parts) {
    const size_t pieces = std::max<size_t>(1, (p.count + max_elems - 1) / max_elems);
    const size_t base = p.count / pieces, extra = p.count % pieces;
    size_t offset = p.offset;
    for (size_t i = 0; i < pieces; ++i) {
      Partition c = p;
      c.index = static_cast<uint32_t>(out.size());
      c.offset = offset;
      c.count = base + (i < extra ? 1 : 0);
      offset += c.count;
      out.push_back(c);
    }
  }
  return out;
}

double MixedExtraShare(int colocated, int extra) {
  if (extra <= 0 || colocated <= 1) return 0;
  const double n = colocated, k = extra;
  // n >= 2, k >= 1: n(n+k) - 2k = n^2 + k(n-2) > 0, and the share is below 1.
  return 2 * k * (n - 1) / (n * (n + k) - 2 * k);
}

double ServerShare(const ServerPlacement& placement, int server) {
  const int k = placement.extra_servers, n = placement.num_servers - k;
  if (k == 0) return 1.0 / placement.num_servers;
  const double f = MixedExtraShare(n, k);
  return server >= n ? f / k : (1 - f) / n;
}

double SmallestShare(const ServerPlacement& placement) {
  double smallest = 1;
  for (int s = 0; s < placement.num_servers; ++s) {
    const double share = ServerShare(placement, s);
    if (share > 0) smallest = std::min(smallest, share);
  }
  return smallest;
}

int ServerLanes(const ServerPlacement& placement, int server, int max_lanes) {
  const double lanes = std::round(ServerShare(placement, server) / SmallestShare(placement));
  return static_cast<int>(std::clamp(lanes, 1.0, static_cast<double>(std::max(1, max_lanes))));
}

namespace {

// Cuts `count` elements starting at `offset` into ceil(bytes / partition_bytes) pieces
// of nearly equal size for `server`.
void AppendRun(size_t offset, size_t count, size_t max_elems, int server,
               std::vector<Partition>* out) {
  const size_t parts = std::max<size_t>(1, (count + max_elems - 1) / max_elems);
  const size_t base = count / parts, extra = count % parts;
  for (size_t i = 0; i < parts; ++i) {
    Partition p;
    p.index = static_cast<uint32_t>(out->size());
    p.offset = offset;
    p.count = base + (i < extra ? 1 : 0);
    p.server = server;
    offset += p.count;
    out->push_back(p);
  }
}

// Server whose cumulative share interval holds u in [0, 1). A u the rounding left at or
// past the shares' sum goes to the last server with a share, never to one without.
int PickByShare(const ServerPlacement& placement, double u) {
  double cumulative = 0;
  int last = 0;
  for (int s = 0; s < placement.num_servers; ++s) {
    const double share = ServerShare(placement, s);
    if (share <= 0) continue;
    cumulative += share;
    last = s;
    if (u < cumulative) return s;
  }
  return last;
}

uint64_t Mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

// Lays out `total[s]` elements for each server s as pieces of at most max_elems (nearly
// equal within a server), interleaved: the next piece comes from the server furthest
// behind its total, ties going to the rotation's order from `start`. In one run per
// server, every worker would push a tensor to one server at a time, all of them to the
// same one, while the others' links idled.
std::vector<Partition> Interleave(const std::vector<size_t>& total, int start,
                                  size_t max_elems) {
  const int servers = static_cast<int>(total.size());
  std::vector<Partition> runs;
  std::vector<size_t> first(servers, 0), pieces(servers, 0);
  for (int s = 0; s < servers; ++s) {
    first[s] = runs.size();
    if (total[s] > 0) AppendRun(0, total[s], max_elems, s, &runs);
    pieces[s] = runs.size() - first[s];
  }
  std::vector<Partition> out;
  out.reserve(runs.size());
  std::vector<size_t> taken(servers, 0), placed(servers, 0);
  size_t offset = 0;
  while (out.size() < runs.size()) {
    int pick = -1;
    double behind = 2;
    for (int i = 0; i < servers; ++i) {
      const int s = (start + i) % servers;
      if (taken[s] == pieces[s]) continue;
      const double done = static_cast<double>(placed[s]) / static_cast<double>(total[s]);
      if (done < behind) {
        behind = done;
        pick = s;
      }
    }
    Partition p = runs[first[pick] + taken[pick]++];
    placed[pick] += p.count;
    p.index = static_cast<uint32_t>(out.size());
    p.offset = offset;
    offset += p.count;
    out.push_back(p);
  }
  return out;
}

}  // namespace

std::vector<Partition> PartitionTensor(uint64_t key, size_t count, DType dtype,
                                       size_t partition_bytes,
                                       const ServerPlacement& placement) {
  if (placement.extra_servers == 0) {
    return PartitionTensor(key, count, dtype, partition_bytes, placement.num_servers);
  }
  const size_t elem = DTypeSize(dtype);
  const size_t max_elems = std::max<size_t>(1, partition_bytes / elem);
  const int servers = placement.num_servers;
  const int start = static_cast<int>((key >> 32) % static_cast<uint64_t>(servers));
  std::vector<size_t> total(servers, 0);
  if (static_cast<double>(count * elem) * SmallestShare(placement) >=
      static_cast<double>(kSplitBytesPerServer)) {
    // Each server's element count by its share, exact to an element (the key-dependent
    // rotation spreads the rounding).
    size_t offset = 0;
    double cumulative = 0;
    for (int i = 0; i < servers; ++i) {
      const int s = (start + i) % servers;
      cumulative += ServerShare(placement, s);
      const size_t end = i + 1 == servers
                             ? count
                             : std::min(count, static_cast<size_t>(std::llround(
                                                   cumulative * static_cast<double>(count))));
      total[s] = end > offset ? end - offset : 0;
      offset = std::max(offset, end);
    }
    return Interleave(total, start, max_elems);
  }
  // Too small for every server to get a kSplitBytesPerServer piece: SmallTensorPieces
  // dealt by systematic sampling of the shares. Of P pieces, piece j goes to the server
  // whose cumulative share interval holds (u + j) / P, u drawn from the key's hash, so
  // each server gets floor or ceil of P times its share.
  const double u = static_cast<double>(Mix64(key ^ 0x9e3779b97f4a7c15ull) >> 11) * 0x1.0p-53;
  if (count == 0) {  // one empty partition, so the tensor still takes part in a round
    Partition p;
    p.server = PickByShare(placement, u);
    return {p};
  }
  const size_t pieces = SmallTensorPieces(count, elem, max_elems);
  const size_t base = count / pieces, extra = count % pieces;
  for (size_t j = 0; j < pieces; ++j) {
    const int s = PickByShare(placement, (u + static_cast<double>(j)) /
                                             static_cast<double>(pieces));
    total[s] += base + (j < extra ? 1 : 0);
  }
  return Interleave(total, start, base + (extra > 0 ? 1 : 0));
}

}  // namespace hybridps
