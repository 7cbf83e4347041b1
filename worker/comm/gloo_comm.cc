#include "worker/comm/gloo_comm.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/partition.h"
#include "common/reduce.h"
#include "common/status.h"
#include "common/transport.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace hybridps {
namespace {

// Largest message AllgatherBytes accepts from a peer (a larger length is corruption).
constexpr uint64_t kMaxGatherBytes = uint64_t{1} << 30;
// The Gloo slot of the direct exchanges (a prefix no Gloo collective uses); exchanges are
// matched in order, one at a time.
constexpr uint64_t kExchangeSlot = (uint64_t{0xE1} << 56) | 1;
// The Gloo slots of AllreduceDirect's two steps, the second also ShareChunks' (matched in
// order, one call at a time).
constexpr uint64_t kScatterSlot = (uint64_t{0xE3} << 56) | 1;
constexpr uint64_t kGatherSlot = (uint64_t{0xE3} << 56) | 2;

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Runs a Gloo call; an exception becomes Unavailable naming `what`.
template <typename F>
absl::Status Guard(absl::string_view what, F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, " failed (gloo: ", e.what(), ")"));
  }
}

// Calls f(T*) with the unsigned type of `dtype`'s element size: Gloo only needs the size.
template <typename F>
void WithElementType(DType dtype, F&& f) {
  switch (DTypeSize(dtype)) {
    case 1:
      return f(static_cast<uint8_t*>(nullptr));
    case 2:
      return f(static_cast<uint16_t*>(nullptr));
    case 4:
      return f(static_cast<uint32_t*>(nullptr));
    default:
      return f(static_cast<uint64_t*>(nullptr));
  }
}

bool SameAddress(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

// This process's connected TCP sockets whose local address is one of `locals`:
// (descriptor, inode).
std::vector<std::pair<int, ino_t>> SocketsBoundTo(const std::vector<sockaddr_storage>& locals) {
  std::vector<std::pair<int, ino_t>> found;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return found;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long n = std::strtol(e->d_name, &end, 10);
    const int fd = static_cast<int>(n);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage self{}, peer{};
    socklen_t len = sizeof self;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0) continue;
    len = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    for (const auto& local : locals) {
      if (SameAddress(self, local)) found.emplace_back(fd, st.st_ino);
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

// ---- SchedulerStore ---------------------------------------------------------------------

void SchedulerStore::Fail(absl::Status s) {
  if (status_.ok()) status_ = s;
  throw gloo::IoException(std::string(s.message()));
}

absl::StatusOr<wire::Envelope> SchedulerStore::Call(wire::Envelope env, absl::Time deadline) {
  std::optional<absl::StatusOr<wire::Envelope>> result;
  control_->Request(std::move(env), deadline,
                    [&result](absl::StatusOr<wire::Envelope> r) { result = std::move(r); });
  Poller poller;
  poller.Add(control_->socket());
  while (!result) {
    const absl::Time now = absl::Now();
    // The client fails the request itself at its deadline (Tick); the extra second only
    // bounds this loop should it not.
    if (now > deadline + absl::Seconds(1)) {
      return absl::DeadlineExceededError("no reply from the scheduler's rendezvous store");
    }
    auto polled = poller.Poll(std::min(control_->NextTick(), deadline) - now);
    if (!polled.ok()) return polled.status();
    control_->OnReadable();
    control_->Tick(absl::Now());
  }
  return *std::move(result);
}

void SchedulerStore::set(const std::string& key, const std::vector<char>& data) {
  wire::Envelope env;
  env.mutable_kv_set()->set_key(prefix_ + key);
  env.mutable_kv_set()->set_value(std::string(data.begin(), data.end()));
  auto r = Call(std::move(env), deadline_);
  if (!r.ok()) {
    Fail(absl::Status(r.status().code(), absl::StrCat("rendezvous: setting '", key,
                                                      "' failed: ", r.status().message())));
  }
}

absl::StatusOr<std::vector<std::string>> SchedulerStore::Wait(
    const std::vector<std::string>& keys, absl::Time deadline) {
  wire::Envelope env;
  auto* w = env.mutable_kv_wait();
  for (const std::string& k : keys) w->add_keys(prefix_ + k);
  w->set_timeout_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
  // The scheduler answers at the wait's own deadline; give its reply time to arrive.
  auto r = Call(std::move(env), deadline + absl::Seconds(2));
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("rendezvous: waiting for ", absl::StrJoin(keys, ", "),
                                     " failed: ", r.status().message(),
                                     " (have all workers started?)"));
  }
  if (!r->has_kv_reply() || r->kv_reply().values_size() != static_cast<int>(keys.size())) {
    return absl::DataLossError("rendezvous: malformed reply from the scheduler");
  }
  return std::vector<std::string>(r->kv_reply().values().begin(),
                                  r->kv_reply().values().end());
}

std::vector<char> SchedulerStore::get(const std::string& key) {
  auto r = Wait({key}, deadline_);
  if (!r.ok()) Fail(r.status());
  return std::vector<char>((*r)[0].begin(), (*r)[0].end());
}

void SchedulerStore::wait(const std::vector<std::string>& keys) {
  auto r = Wait(keys, deadline_);
  if (!r.ok()) Fail(r.status());
}

void SchedulerStore::wait(const std::vector<std::string>& keys,
                          const std::chrono::milliseconds& timeout) {
  auto r = Wait(keys, std::min(deadline_, absl::Now() + absl::FromChrono(timeout)));
  if (!r.ok()) Fail(r.status());
}

// ---- GlooComm ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<GlooComm>> GlooComm::Connect(int rank, int size,
                                                            const std::string& host,
                                                            const std::string& iface,
                                                            gloo::rendezvous::Store& store,
                                                            absl::Duration timeout) {
  std::unique_ptr<GlooComm> comm(new GlooComm(rank, size));
  if (size == 1) return comm;
  gloo::transport::tcp::attr attr;
  if (!iface.empty()) {
    attr.iface = iface;
  } else {
    attr.hostname = host;
  }
  absl::Status s = Guard(absl::StrCat("connecting the gloo mesh of ", size, " ranks on ",
                                      iface.empty() ? host : iface),
                         [&] {
                           auto device = gloo::transport::tcp::CreateDevice(attr);
                           auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
                           ctx->setTimeout(Millis(timeout));
                           ctx->connectFullMesh(store, device);
                           comm->context_ = std::move(ctx);
                         });
  if (!s.ok()) return s;
  // Gloo has no abort, and Debian's package cannot include the header of its socket
  // pairs (gloo/common/memory.h is missing). Each connected pair reports the local
  // address of its socket, unique on this host, so Abort finds the mesh's sockets by it
  // (several stores in one process, as in the in-process tests, keep apart).
  std::vector<sockaddr_storage> locals;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto* a = dynamic_cast<const gloo::transport::tcp::Address*>(
        &comm->context_->getPair(r)->address());
    if (a != nullptr) locals.push_back(a->getSockaddr());
  }
  comm->mesh_sockets_ = SocketsBoundTo(locals);
  if (comm->mesh_sockets_.size() != static_cast<size_t>(size - 1)) {
    HPS_LOG(WARNING) << "found " << comm->mesh_sockets_.size() << " sockets for a gloo "
                     << "mesh of " << size << " ranks; a hung peer will be noticed only at "
                     << "the operation timeout";
    comm->mesh_sockets_.clear();
  }
  return comm;
}

GlooComm::~GlooComm() = default;

void GlooComm::Close() {
  if (!context_) return;
  if (!mesh_sockets_.empty()) {
    // Not Gloo's closeConnections: it resets the connections (SO_LINGER 0), which throws
    // away what our last collective still has in the socket buffers. On a slow link the
    // peers then lose the end of the round they are finishing with us, and get a reset
    // (or, should the reset be dropped, wait until their timeout).
    Abort();
    return;
  }
  try {
    context_->closeConnections();
  } catch (const std::exception& e) {
    HPS_LOG(DEBUG) << "closing gloo connections: " << e.what();
  }
}

void GlooComm::Abort() {
  if (!context_) return;
  for (const auto& [fd, inode] : mesh_sockets_) {
    // Only while the descriptor still is the socket Gloo connected (a closed one may have
    // been reused by anything).
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == inode) {
      shutdown(fd, SHUT_RDWR);
    }
  }
}

bool GlooComm::AllreduceIsLocal(DType dtype, const void* in, void* out, size_t count) {
  if (count == 0) return true;
  if (context_) return false;
  if (in != out) std::memcpy(out, in, count * DTypeSize(dtype));
  return true;
}

absl::Status GlooComm::Allreduce(DType dtype, const void* in, void* out, size_t count,
                                 absl::Duration timeout) {
  if (AllreduceIsLocal(dtype, in, out, count)) return absl::OkStatus();
  return Guard("allreduce", [&] {
    gloo::AllreduceOptions opts(context_);
    WithElementType(dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      if (in != out) opts.setInput(static_cast<T*>(const_cast<void*>(in)), count);
      opts.setOutput(static_cast<T*>(out), count);
    });
    opts.setReduceFunction([dtype](void* c, const void* a, const void* b, size_t n) {
      Sum2(dtype, c, a, b, n);
    });
    opts.setTimeout(Millis(timeout));
    gloo::allreduce(opts);
  });
}

absl::Status GlooComm::AllreduceDirect(DType dtype, const void* in, void* out, size_t count,
                                       absl::Duration timeout) {
  if (AllreduceIsLocal(dtype, in, out, count)) return absl::OkStatus();
  const size_t es = DTypeSize(dtype);
  const Chunk own = ChunkOf(count, rank_, size_);  // this rank's share: it sums it
  const size_t own_bytes = (own.end - own.begin) * es;
  // The peers' copies of this rank's chunk, in rank order without this rank.
  if (direct_parts_.size() < own_bytes * (size_ - 1)) {
    direct_parts_.resize(own_bytes * (size_ - 1));
  }
  char* const parts = direct_parts_.data();
  char* const result = static_cast<char*>(out);
  return Guard("allreduce (direct)", [&] {
    // Every receive is posted first, so that each peer's data leaves as soon as it is sent:
    // the summed chunks of the others go straight into the output. In place, a peer's
    // summed chunk r overwrites the input's chunk r only after this rank's copy of that
    // chunk reached the peer (the peer sums it first), so the send below has read it.
    auto gathered = context_->createUnboundBuffer(result, count * es);
    auto scattered = context_->createUnboundBuffer(parts, own_bytes * (size_ - 1));
    auto input = context_->createUnboundBuffer(const_cast<void*>(in), count * es);
    int gathers = 0, scatters = 0, sends = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const Chunk c = ChunkOf(count, r, size_);
      if (c.end > c.begin) {
        gathered->recv(r, kGatherSlot, c.begin * es, (c.end - c.begin) * es);
        ++gathers;
      }
      if (own_bytes > 0) {
        scattered->recv(r, kScatterSlot, (r < rank_ ? r : r - 1) * own_bytes, own_bytes);
        ++scatters;
      }
    }
    for (int i = 1; i < size_; ++i) {  // starting with the next rank: no hot spot at rank 0
      const int r = (rank_ + i) % size_;
      const Chunk c = ChunkOf(count, r, size_);
      if (c.end > c.begin) {
        input->send(r, kScatterSlot, c.begin * es, (c.end - c.begin) * es);
        ++sends;
      }
    }
    for (int i = 0; i < scatters; ++i) scattered->waitRecv(Millis(timeout));
    if (own_bytes > 0) {
      // This rank's own copy first, then the others' in rank order: the same bits every
      // run, and each chunk is summed by one rank only, so every rank gets the same bits.
      // (In place, the input's chunk is read before the output's is written over.)
      const size_t n = own.end - own.begin;
      char* const sum = result + own.begin * es;
      Sum2(dtype, sum, static_cast<const char*>(in) + own.begin * es, parts, n);
      for (int i = 1; i < size_ - 1; ++i) SumInto(dtype, sum, parts + i * own_bytes, n);
      for (int i = 1; i < size_; ++i) {
        gathered->send((rank_ + i) % size_, kGatherSlot, own.begin * es, own_bytes);
      }
    }
    // The receives first: Abort ends a pending receive at once, a pending send only at
    // its timeout.
    for (int i = 0; i < gathers; ++i) gathered->waitRecv(Millis(timeout));
    for (int i = 0; i < sends; ++i) input->waitSend(Millis(timeout));
    if (own_bytes > 0) {
      for (int i = 1; i < size_; ++i) gathered->waitSend(Millis(timeout));
    }
  });
}

absl::Status GlooComm::Broadcast(DType dtype, void* data, size_t count, int root,
                                 absl::Duration timeout) {
  if (count == 0 || !context_) return absl::OkStatus();
  return Guard("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    WithElementType(dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      opts.setOutput(static_cast<T*>(data), count);
    });
    opts.setRoot(root);
    opts.setTimeout(Millis(timeout));
    gloo::broadcast(opts);
  });
}

absl::Status GlooComm::ShareChunks(DType dtype, void* out, size_t count,
                                   absl::FunctionRef<void()> fill, absl::Duration timeout) {
  if (!context_) {
    fill();
    return absl::OkStatus();
  }
  const size_t es = DTypeSize(dtype);
  const Chunk own = ChunkOf(count, rank_, size_);
  const size_t own_bytes = (own.end - own.begin) * es;
  char* const result = static_cast<char*>(out);
  return Guard("allreduce (sharing summed chunks)", [&] {
    auto buf = context_->createUnboundBuffer(result, count * es);
    int recvs = 0;
    for (int r = 0; r < size_; ++r) {
      const Chunk c = ChunkOf(count, r, size_);
      if (r == rank_ || c.end == c.begin) continue;
      buf->recv(r, kGatherSlot, c.begin * es, (c.end - c.begin) * es);
      ++recvs;
    }
    fill();
    if (own_bytes > 0) {
      for (int i = 1; i < size_; ++i) {  // starting with the next rank, as AllreduceDirect
        buf->send((rank_ + i) % size_, kGatherSlot, own.begin * es, own_bytes);
      }
    }
    // The receives first: Abort ends a pending receive at once, a pending send only at
    // its timeout.
    for (int i = 0; i < recvs; ++i) buf->waitRecv(Millis(timeout));
    if (own_bytes > 0) {
      for (int i = 1; i < size_; ++i) buf->waitSend(Millis(timeout));
    }
  });
}

bool GlooComm::Direct(size_t slot) const { return slot <= kDirectSlotBytes || size_ == 2; }

void GlooComm::PostExchange(int i, size_t slot) {
  Exchange& x = exchange_[i];
  if (!x.buf || x.bytes.size() < slot * size_) {
    x.bytes.resize(std::max(x.bytes.size(), slot * size_));
    x.buf = context_->createUnboundBuffer(x.bytes.data(), x.bytes.size());
  }
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) x.buf->recv(r, kExchangeSlot, r * slot, slot);
  }
  x.slot = slot;
  x.posted = true;
}

void GlooComm::PostNextExchange(size_t slot) {
  if (!context_ || !Direct(slot) || exchange_[next_exchange_].posted ||
      !post_failed_.ok()) {
    return;
  }
  // Some receives may have been posted before the failure: the communicator cannot be
  // used for exchanges any more.
  post_failed_ =
      Guard("negotiation (posting receives)", [&] { PostExchange(next_exchange_, slot); });
}

absl::StatusOr<std::vector<absl::string_view>> GlooComm::AllgatherBytes(
    absl::string_view mine, size_t slot, absl::Duration timeout) {
  own_.assign(sizeof(uint64_t), '\0');
  own_.append(mine.data(), mine.size());
  return AllgatherFramed(&own_, slot, timeout);
}

absl::StatusOr<std::vector<absl::string_view>> GlooComm::AllgatherFramed(
    std::string* framed, size_t slot, absl::Duration timeout) {
  if (framed->size() < sizeof(uint64_t)) {
    return absl::InternalError("negotiation: a framed message without room for its length");
  }
  const size_t len = framed->size() - sizeof(uint64_t);
  const absl::string_view mine(framed->data() + sizeof(uint64_t), len);
  if (!context_) return std::vector<absl::string_view>{mine};
  RETURN_IF_ERROR(post_failed_);
  // A slot: [u64 length][the first slot - 8 bytes]; the tails follow in an allgatherv.
  if (!Direct(slot) && slot_all_.size() < slot * size_) {
    slot_all_.resize(slot * size_);
  }
  const uint64_t len64 = len;
  std::memcpy(framed->data(), &len64, sizeof len64);
  // The ring sends whole slots; the direct exchange only the message.
  if (!Direct(slot) && framed->size() < slot) framed->resize(slot);
  char* const own_slot = framed->data();
  std::vector<const char*> slots(size_);  // where rank r's slot is once exchanged
  if (Direct(slot)) {
    // Small slots (any with 2 ranks: then the ring is the same single step): every rank
    // sends its message to every other rank at once: one step, where the ring allgather
    // takes 2(n-1) dependent ones, each a thread handoff that can cost
    // a scheduler tick on a loaded machine. The receives are usually posted already
    // (PostNextExchange).
    // Only the message (a shorter send fills the start of a posted receive): a slot sized
    // for a larger message of an earlier round is not sent whole.
    const size_t sent = std::min(sizeof(uint64_t) + len, slot);
    RETURN_IF_ERROR(Guard("negotiation (exchange)", [&] {
      if (!send_buf_ || send_buf_->ptr != own_slot || send_buf_->size < sent) {
        send_buf_ = context_->createUnboundBuffer(own_slot, framed->size());
      }
    }));
    RETURN_IF_ERROR(ExchangeDirect(
        send_buf_.get(), [](int) { return size_t{0}; }, [sent](int) { return sent; },
        own_slot, slot, timeout, &slots));
  } else {
    RETURN_IF_ERROR(Guard("negotiation (allgather)", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(reinterpret_cast<uint8_t*>(own_slot), slot);
      opts.setOutput(reinterpret_cast<uint8_t*>(slot_all_.data()), slot * size_);
      opts.setTimeout(Millis(timeout));
      gloo::allgather(opts);
    }));
    for (int r = 0; r < size_; ++r) slots[r] = slot_all_.data() + r * slot;
  }
  return JoinSlots(slots, own_slot, slot, timeout);
}

bool GlooComm::ExchangesPerPeer(size_t slot) const {
  return context_ && Direct(slot) && slot > sizeof(uint64_t);
}

char* GlooComm::PerPeerRoom(size_t slot) {
  if (!ExchangesPerPeer(slot)) return nullptr;
  if (per_peer_.size() < slot * size_) {
    per_peer_.resize(slot * size_);
    per_peer_buf_.reset();  // over the old memory
  }
  return per_peer_.data();
}

absl::StatusOr<std::vector<absl::string_view>> GlooComm::AllgatherPerPeer(
    const std::vector<size_t>& lengths, size_t slot, absl::Duration timeout) {
  if (!context_ || !Direct(slot) || per_peer_.size() < slot * size_ ||
      lengths.size() != static_cast<size_t>(size_)) {
    return absl::InternalError(
        absl::StrCat("negotiation: no exchange of a message per peer in slots of ", slot,
                     " bytes with ", size_, " ranks"));
  }
  RETURN_IF_ERROR(post_failed_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (lengths[r] > slot - sizeof(uint64_t)) {
      return absl::InternalError(absl::StrCat("negotiation: a message of ", lengths[r],
                                              " bytes for rank ", r, " in a slot of ", slot));
    }
    const uint64_t len64 = lengths[r];
    std::memcpy(per_peer_.data() + r * slot, &len64, sizeof len64);
  }
  RETURN_IF_ERROR(Guard("negotiation (exchange)", [&] {
    if (!per_peer_buf_) {
      per_peer_buf_ = context_->createUnboundBuffer(per_peer_.data(), per_peer_.size());
    }
  }));
  std::vector<const char*> slots(size_);
  const char* own = per_peer_.data() + (rank_ + 1) % size_ * slot;
  RETURN_IF_ERROR(ExchangeDirect(
      per_peer_buf_.get(), [slot](int r) { return r * slot; },
      [&lengths](int r) { return sizeof(uint64_t) + lengths[r]; }, own, slot, timeout,
      &slots));
  return JoinSlots(slots, own, slot, timeout);
}

absl::Status GlooComm::ExchangeDirect(gloo::transport::UnboundBuffer* send,
                                      absl::FunctionRef<size_t(int)> send_offset,
                                      absl::FunctionRef<size_t(int)> send_bytes,
                                      const char* own, size_t slot, absl::Duration timeout,
                                      std::vector<const char*>* slots) {
  Exchange& x = exchange_[next_exchange_];
  if (x.posted && x.slot != slot) {
    return absl::InternalError(absl::StrCat("negotiation: receives posted for a slot of ",
                                            x.slot, " bytes, exchanging ", slot));
  }
  RETURN_IF_ERROR(Guard("negotiation (exchange)", [&] {
    if (!x.posted) PostExchange(next_exchange_, slot);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) send->send(r, kExchangeSlot, send_offset(r), send_bytes(r));
    }
    for (int i = 1; i < size_; ++i) x.buf->waitRecv(Millis(timeout));
    for (int i = 1; i < size_; ++i) send->waitSend(Millis(timeout));
  }));
  x.posted = false;
  next_exchange_ ^= 1;
  for (int r = 0; r < size_; ++r) {
    (*slots)[r] = r == rank_ ? own : x.bytes.data() + r * slot;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::string_view>> GlooComm::JoinSlots(
    const std::vector<const char*>& slots, const char* own, size_t slot,
    absl::Duration timeout) {
  const size_t inline_bytes = slot - sizeof(uint64_t);
  std::vector<absl::string_view> out(size_);
  std::vector<size_t> tails(size_);
  bool any_tail = false;
  for (int r = 0; r < size_; ++r) {
    uint64_t n = 0;
    std::memcpy(&n, slots[r], sizeof n);
    if (n > kMaxGatherBytes) {
      return absl::DataLossError(absl::StrCat("rank ", r, " sent a negotiation message of ",
                                              n, " bytes"));
    }
    out[r] = absl::string_view(slots[r] + sizeof n, std::min<size_t>(n, inline_bytes));
    tails[r] = n > inline_bytes ? n - inline_bytes : 0;
    any_tail = any_tail || tails[r] > 0;
  }
  if (!any_tail) return out;
  // Every rank sends at least one byte: no zero-length blocks for Gloo to special-case.
  std::vector<size_t> counts(size_);
  size_t total = 0;
  for (int r = 0; r < size_; ++r) total += counts[r] = std::max<size_t>(1, tails[r]);
  tail_in_.assign(counts[rank_], '\0');
  if (tails[rank_] > 0) tail_in_.assign(own + slot, tails[rank_]);  // after the slot
  if (tail_all_.size() < total) tail_all_.resize(total);
  RETURN_IF_ERROR(Guard("negotiation (allgatherv)", [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(reinterpret_cast<uint8_t*>(tail_in_.data()), tail_in_.size());
    opts.setOutput(reinterpret_cast<uint8_t*>(tail_all_.data()), counts);
    opts.setTimeout(Millis(timeout));
    gloo::allgatherv(opts);
  }));
  joined_.resize(size_);
  size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    joined_[r].assign(out[r].data(), out[r].size());
    joined_[r].append(tail_all_, offset, tails[r]);
    out[r] = joined_[r];
    offset += counts[r];
  }
  return out;
}

}  // namespace hybridps
