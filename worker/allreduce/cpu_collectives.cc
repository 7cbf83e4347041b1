#include "worker/allreduce/cpu_collectives.h"

#include <algorithm>
#include <utility>

#include "common/status.h"

namespace hybridps {
namespace {

// The most ranks a direct allreduce runs on: each receives from every other at once, so
// with many the bursts into one host's link grow (measured with 3 and 4 ranks only).
constexpr int kMaxDirectRanks = 8;

// An allreduce over `comm`, directly between every pair of ranks when `direct`.
absl::Status AllreduceOver(GlooComm* comm, bool direct, DType dtype, const void* in, void* out,
                           size_t count, absl::Duration timeout) {
  return direct ? comm->AllreduceDirect(dtype, in, out, count, timeout)
                : comm->Allreduce(dtype, in, out, count, timeout);
}

class GlooCollectives : public CpuCollectives {
 public:
  explicit GlooCollectives(GlooComm* world, Kind kind = Kind::kGloo,
                           bool in_shared_memory = false)
      : CpuCollectives(kind, in_shared_memory), world_(world) {}
  absl::Status Allreduce(DType dtype, const void* in, void* out, size_t count,
                         absl::Duration timeout) override {
    return AllreduceOver(world_, GoesDirect(count * DTypeSize(dtype)), dtype, in, out, count,
                         timeout);
  }
  void SetDirectBytes(size_t bytes) override { direct_bytes_ = bytes; }
  bool GoesDirect(size_t bytes) const override {
    return world_->size() >= 3 && world_->size() <= kMaxDirectRanks && bytes <= direct_bytes_;
  }
  absl::Status Broadcast(DType dtype, void* data, size_t count, int root,
                         absl::Duration timeout) override {
    return world_->Broadcast(dtype, data, count, root, timeout);
  }
  absl::Status Exchange(std::string* framed, size_t slot_bytes, absl::Duration timeout,
                        std::vector<absl::string_view>* out) override {
    ASSIGN_OR_RETURN(*out, world_->AllgatherFramed(framed, slot_bytes, timeout));
    return absl::OkStatus();
  }
  bool ExchangesPerPeer(size_t slot_bytes) const override {
    return world_->ExchangesPerPeer(slot_bytes);
  }
  char* PerPeerRoom(size_t slot_bytes) override { return world_->PerPeerRoom(slot_bytes); }
  absl::Status ExchangePerPeer(const std::vector<size_t>& lengths, size_t slot_bytes,
                               absl::Duration timeout,
                               std::vector<absl::string_view>* out) override {
    ASSIGN_OR_RETURN(*out, world_->AllgatherPerPeer(lengths, slot_bytes, timeout));
    return absl::OkStatus();
  }
  void PostNextExchange(size_t slot_bytes) override { world_->PostNextExchange(slot_bytes); }
  void Abort(const absl::Status&) override {}  // the store aborts `world` itself
  void Close() override {}

 protected:
  GlooComm* world_;  // the store's: it outlives this
  size_t direct_bytes_ = 0;
};

class SharedMemoryCollectives : public GlooCollectives {
 public:
  SharedMemoryCollectives(GlooComm* world, std::unique_ptr<ShmAllreduce> node,
                          std::vector<int> members)
      : GlooCollectives(world, Kind::kSharedMemory, /*in_shared_memory=*/true),
        node_(std::move(node)),
        members_(std::move(members)) {}
  absl::Status Allreduce(DType dtype, const void* in, void* out, size_t count,
                         absl::Duration timeout) override {
    return node_->Allreduce(dtype, in, out, count, timeout);
  }
  bool GoesDirect(size_t) const override { return false; }
  absl::Status Broadcast(DType dtype, void* data, size_t count, int root,
                         absl::Duration timeout) override {
    const int local_root =
        static_cast<int>(std::find(members_.begin(), members_.end(), root) - members_.begin());
    return node_->Broadcast(dtype, data, count, local_root, timeout);
  }
  // Through the segment (a store and a barrier, no socket), indexed by worker rank; a
  // message too big for it (every rank sees the same) goes through Gloo.
  absl::Status Exchange(std::string* framed, size_t slot_bytes, absl::Duration timeout,
                        std::vector<absl::string_view>* out) override {
    const absl::Status s =
        node_->Allgather(absl::string_view(*framed).substr(sizeof(uint64_t)), timeout, &local_);
    if (s.code() != absl::StatusCode::kResourceExhausted) return ByWorker(s, out);
    return GlooCollectives::Exchange(framed, slot_bytes, timeout, out);
  }
  absl::Span<char> ExchangeRoom() override {
    return absl::Span<char>(node_->NextMessage(), ShmAllreduce::kMessageBytes);
  }
  absl::Status ExchangeWritten(size_t bytes, size_t slot_bytes, absl::Duration timeout,
                               std::vector<absl::string_view>* out) override {
    const char* mine = node_->NextMessage();
    const absl::Status s = node_->AllgatherWritten(bytes, timeout, &local_);
    if (s.code() != absl::StatusCode::kResourceExhausted) return ByWorker(s, out);
    // Another rank's message did not fit: this one, still in its area (nobody writes
    // there before this rank's next exchange), goes through Gloo with theirs.
    framed_.assign(sizeof(uint64_t), '\0');
    framed_.append(mine, bytes);
    return GlooCollectives::Exchange(&framed_, slot_bytes, timeout, out);
  }
  // Every peer reads one message.
  bool ExchangesPerPeer(size_t) const override { return false; }
  char* PerPeerRoom(size_t) override { return nullptr; }
  void PostNextExchange(size_t) override {}  // the next exchange is the segment's
  void Abort(const absl::Status& why) override { node_->Abort(why); }

 private:
  // The segment's exchange `s`, on success from local_ into `out` by worker rank.
  absl::Status ByWorker(const absl::Status& s, std::vector<absl::string_view>* out) {
    if (!s.ok()) return s;
    out->resize(members_.size());
    for (size_t lr = 0; lr < local_.size(); ++lr) (*out)[members_[lr]] = local_[lr];
    return s;
  }

  std::unique_ptr<ShmAllreduce> node_;
  std::vector<int> members_;  // the worker rank of each local rank
  std::vector<absl::string_view> local_;  // Exchange's, by local rank
  std::string framed_;  // ExchangeWritten's message when it goes through Gloo
};

class HierarchicalCollectives : public GlooCollectives {
 public:
  HierarchicalCollectives(GlooComm* world, std::unique_ptr<ShmAllreduce> node,
                          std::unique_ptr<GlooComm> leaders, size_t chunk_bytes)
      : GlooCollectives(world, Kind::kHierarchical, /*in_shared_memory=*/node != nullptr),
        node_(std::move(node)),
        leaders_(std::move(leaders)),
        chunk_bytes_(chunk_bytes) {}
  // The node's sum in shared memory, then the leaders' allreduce of it.
  absl::Status Allreduce(DType dtype, const void* in, void* out, size_t count,
                         absl::Duration timeout) override {
    // Every leader cuts the tensor at the same places, the shared-memory node's chunks,
    // so that each allreduce across the nodes has the same count on all of them.
    const size_t es = DTypeSize(dtype);
    const size_t per_chunk = std::max<size_t>(1, chunk_bytes_ / es);
    const bool direct = GoesDirect(count * es);
    if (!node_) {  // its own leader
      const char* src = static_cast<const char*>(in);
      char* dst = static_cast<char*>(out);
      for (size_t done = 0; done < count; done += per_chunk) {
        const size_t n = std::min(per_chunk, count - done);
        RETURN_IF_ERROR(AllreduceOver(leaders_.get(), direct, dtype, src + done * es,
                                      dst + done * es, n, timeout));
      }
      return absl::OkStatus();
    }
    auto across = [&](void* data, size_t n) {
      return AllreduceOver(leaders_.get(), direct, dtype, data, data, n, timeout);
    };
    return node_->HierarchicalAllreduce(dtype, in, out, count, timeout, across);
  }
  // Every worker reads one message: its sums go through the nodes.
  bool ExchangesPerPeer(size_t) const override { return false; }
  char* PerPeerRoom(size_t) override { return nullptr; }
  // Across the nodes' leaders: only they run that part.
  bool GoesDirect(size_t bytes) const override {
    return leaders_ && leaders_->size() >= 3 && leaders_->size() <= kMaxDirectRanks &&
           bytes <= direct_bytes_;
  }
  void Abort(const absl::Status& why) override {
    if (leaders_) leaders_->Abort();
    if (node_) node_->Abort(why);
  }
  void Close() override {
    if (leaders_) leaders_->Close();
  }

 private:
  std::unique_ptr<ShmAllreduce> node_;
  std::unique_ptr<GlooComm> leaders_;
  size_t chunk_bytes_;
};

}  // namespace

std::unique_ptr<CpuCollectives> NewGlooCollectives(GlooComm* world) {
  return std::make_unique<GlooCollectives>(world);
}

std::unique_ptr<CpuCollectives> NewSharedMemoryCollectives(GlooComm* world,
                                                           std::unique_ptr<ShmAllreduce> node,
                                                           std::vector<int> members) {
  return std::make_unique<SharedMemoryCollectives>(world, std::move(node), std::move(members));
}

std::unique_ptr<CpuCollectives> NewHierarchicalCollectives(GlooComm* world,
                                                           std::unique_ptr<ShmAllreduce> node,
                                                           std::unique_ptr<GlooComm> leaders,
                                                           size_t chunk_bytes) {
  return std::make_unique<HierarchicalCollectives>(world, std::move(node), std::move(leaders),
                                                   chunk_bytes);
}

}  // namespace hybridps
