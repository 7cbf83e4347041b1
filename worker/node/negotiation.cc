#include "worker/node/negotiation.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/byte_io.h"
#include "common/status.h"

namespace hybridps::negotiation {
namespace {

// Fields travel in host byte order (every supported host is little-endian).
constexpr uint32_t kMagic = 0x4E535048;  // "HPSN"
// 2: the device byte; 3: the payload's offset; 4: phase; 5: the shape; 6: the room
constexpr uint16_t kVersion = 6;
constexpr uint16_t kFlagLeaving = 1;
constexpr size_t kEntryBytes = 56;
constexpr size_t kReservedBytes = 6;  // after the phase and ndim, zero: keeps names 8-aligned

// Names and payloads are padded to 8 bytes, so payloads stay aligned in the message.
size_t PadOf(size_t n) { return (8 - n % 8) % 8; }

// Whether every byte of `s` is zero (a loop the compiler inlines: a few bytes per field).
bool AllZero(absl::string_view s) {
  for (char c : s) {
    if (c != '\0') return false;
  }
  return true;
}

// Skips the zero padding after a field of n bytes.
bool SkipPad(ByteReader& in, size_t n) {
  absl::string_view pad;
  return in.Take(PadOf(n), &pad) && AllZero(pad);
}

std::string RankNames(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

bool SameSignature(const Entry& a, const Entry& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.count == b.count && a.gpu == b.gpu &&
         (a.kind != OpKind::kBroadcast || a.root == b.root) && a.shape.Agrees(b.shape);
}

// Whether every rank's entry of a key agrees with the first: a rank that gave no shape
// agrees with any, so the ranks that gave one are compared with the first such rank.
bool AllAgree(const std::vector<RankList>& lists, absl::Span<const int> idx) {
  const Entry& e0 = lists[0].entries[idx[0]];
  const Entry* shaped = nullptr;
  for (size_t r = 0; r < idx.size(); ++r) {
    const Entry& e = lists[r].entries[idx[r]];
    if (!SameSignature(e0, e)) return false;
    if (e.shape.known()) {
      if (shaped != nullptr && !shaped->shape.Agrees(e.shape)) return false;
      if (shaped == nullptr) shaped = &e;
    }
  }
  return true;
}

// The error of a key whose ranks disagree: every distinct signature with its ranks, the
// group of `self` last.
absl::Status Mismatch(const std::vector<RankList>& lists, absl::Span<const int> idx,
                      int self) {
  std::vector<std::pair<const Entry*, std::vector<int>>> groups;
  bool same_kind = true;
  for (size_t r = 0; r < idx.size(); ++r) {
    const Entry& e = lists[r].entries[idx[r]];
    if (e.kind != lists[0].entries[idx[0]].kind) same_kind = false;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return SameSignature(*g.first, e); });
    if (it == groups.end()) {
      groups.push_back({&e, {static_cast<int>(r)}});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  std::stable_partition(groups.begin(), groups.end(), [&](const auto& g) {
    return std::find(g.second.begin(), g.second.end(), self) == g.second.end();
  });
  const Entry& first = lists[0].entries[idx[0]];
  std::vector<std::string> parts;
  for (const auto& [e, ranks] : groups) {
    parts.push_back(absl::StrCat(RankNames(ranks), " sent ",
                                 same_kind ? "" : absl::StrCat("a ", OpKindName(e->kind), " of "),
                                 e->Shape()));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      same_kind ? absl::StrCat("mismatched ", OpKindName(first.kind), " of '")
                : std::string("mismatched operations on '"),
      first.name, "': ", absl::StrJoin(parts, ", ")));
}

}  // namespace

absl::string_view OpKindName(OpKind kind) {
  return kind == OpKind::kBroadcast ? "broadcast" : "push_pull";
}

bool Entry::WholePayload() const {
  return has_payload && payload_offset == 0 && payload.size() == count * DTypeSize(dtype);
}

std::string Entry::Shape() const {
  std::string s = DescribeTensor(shape, count, dtype);
  if (gpu) absl::StrAppend(&s, " on GPU");
  if (kind == OpKind::kBroadcast) absl::StrAppend(&s, " from root ", root);
  return s;
}

size_t SerializedBytes(const RankList& list) {
  size_t bytes = kHeaderBytes;
  for (const Entry& e : list.entries) {
    bytes += kEntryBytes + e.name.size() + PadOf(e.name.size()) +
             sizeof(e.shape.dims[0]) * static_cast<size_t>(e.shape.ndim);
    if (e.has_payload) bytes += e.payload.size() + PadOf(e.payload.size());
  }
  return bytes;
}

void SerializeTo(const RankList& list, int rank, char* out) {
  ByteWriter w(out);
  w.Put(kMagic);
  w.Put(kVersion);
  w.Put(static_cast<uint16_t>(list.leaving ? kFlagLeaving : 0));
  w.Put(static_cast<int32_t>(rank));
  w.Put(static_cast<uint32_t>(list.entries.size()));
  w.Put(list.room);
  for (const Entry& e : list.entries) {
    w.Put(e.occurrence);
    w.Put(static_cast<uint8_t>(e.kind));
    w.Put(static_cast<uint8_t>(e.dtype));
    w.Put(static_cast<uint8_t>(e.has_payload ? 1 : 0));
    w.Put(static_cast<uint8_t>(e.gpu ? 1 : 0));
    w.Put(e.root);
    w.Put(e.priority);
    w.Put(e.age_ms);
    w.Put(static_cast<uint32_t>(e.name.size()));
    w.Put(e.count);
    w.Put(static_cast<uint64_t>(e.has_payload ? e.payload.size() : 0));
    w.Put(static_cast<uint64_t>(e.has_payload ? e.payload_offset : 0));
    w.Put(e.phase);
    w.Put(static_cast<uint8_t>(e.shape.ndim));
    w.Zeros(kReservedBytes);
    w.Append(e.name);
    w.Zeros(PadOf(e.name.size()));
    for (int d = 0; d < e.shape.ndim; ++d) w.Put(e.shape.dims[d]);
    if (e.has_payload) {
      w.Append(e.payload);
      w.Zeros(PadOf(e.payload.size()));
    }
  }
}

void Serialize(const RankList& list, int rank, std::string* out) {
  const size_t at = out->size();
  out->resize(at + SerializedBytes(list));
  SerializeTo(list, rank, out->data() + at);
}

absl::StatusOr<RankList> Parse(absl::string_view bytes, int rank) {
  RankList list;
  RETURN_IF_ERROR(ParseInto(bytes, rank, &list));
  return list;
}

absl::Status ParseInto(absl::string_view bytes, int rank, RankList* list) {
  auto bad = [rank](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("malformed negotiation message from rank ", rank, ": ", why));
  };
  ByteReader in(bytes);
  uint32_t magic = 0, num = 0;
  uint16_t version = 0, flags = 0;
  int32_t sender = -1;
  if (!in.Get(&magic) || !in.Get(&version) || !in.Get(&flags) || !in.Get(&sender) ||
      !in.Get(&num) || !in.Get(&list->room)) {
    return bad("truncated header");
  }
  if (magic != kMagic) return bad("bad magic number");
  if (version != kVersion) {
    return bad(absl::StrCat("protocol version ", version, ", not ", kVersion));
  }
  if (sender != rank) return bad(absl::StrCat("it claims to be rank ", sender));
  if (num > in.left() / kEntryBytes) return bad(absl::StrCat(num, " entries cannot fit"));
  list->leaving = (flags & kFlagLeaving) != 0;
  list->entries.resize(num);
  for (Entry& e : list->entries) {
    e.shape = TensorShape();  // a reused entry: every other field is read below
    uint8_t kind = 0, dtype = 0, has_payload = 0, gpu = 0, ndim = 0;
    uint32_t name_len = 0;
    uint64_t payload_len = 0;
    if (!in.Get(&e.occurrence) || !in.Get(&kind) || !in.Get(&dtype) || !in.Get(&has_payload) ||
        !in.Get(&gpu) || !in.Get(&e.root) || !in.Get(&e.priority) || !in.Get(&e.age_ms) ||
        !in.Get(&name_len) || !in.Get(&e.count) || !in.Get(&payload_len) ||
        !in.Get(&e.payload_offset) || !in.Get(&e.phase) || !in.Get(&ndim)) {
      return bad("truncated entry");
    }
    absl::string_view reserved;
    if (!in.Take(kReservedBytes, &reserved)) return bad("truncated entry");
    if (!AllZero(reserved)) {
      return bad("reserved bytes set");
    }
    if (kind != static_cast<uint8_t>(OpKind::kPushPull) &&
        kind != static_cast<uint8_t>(OpKind::kBroadcast)) {
      return bad(absl::StrCat("unknown operation ", kind));
    }
    if (!IsValidDType(dtype)) return bad(absl::StrCat("unknown dtype ", dtype));
    if (has_payload > 1) return bad("bad payload flag");
    if (gpu > 1) return bad("bad device flag");
    // GPU data never rides along: it is not in host memory.
    if (gpu == 1 && has_payload == 1) return bad("payload for a GPU tensor");
    e.kind = static_cast<OpKind>(kind);
    e.dtype = static_cast<DType>(dtype);
    e.has_payload = has_payload == 1;
    e.gpu = gpu == 1;
    if (name_len == 0 || name_len > kMaxNameBytes) return bad("bad name length");
    absl::string_view name;
    if (!in.Take(name_len, &name) || !SkipPad(in, name_len)) return bad("truncated name");
    e.name.assign(name.data(), name.size());
    if (ndim > kMaxShapeDims) return bad(absl::StrCat("shape of ", +ndim, " dimensions"));
    e.shape.ndim = ndim;
    for (int d = 0; d < ndim; ++d) {
      if (!in.Get(&e.shape.dims[d])) return bad("truncated shape");
      if (e.shape.dims[d] < 0) return bad(absl::StrCat("negative dimension ", e.shape.dims[d]));
    }
    if (absl::Status s = CheckTensorShape(e.shape, e.count); !s.ok()) return bad(s.message());
    const size_t es = DTypeSize(e.dtype);
    if (e.count > std::numeric_limits<uint64_t>::max() / es) return bad("count overflows");
    // A payload is whole elements within the tensor, at least one unless it has none
    // (no payload: no bytes, offset 0).
    const bool fits = e.has_payload
                          ? payload_len % es == 0 && e.payload_offset <= e.count &&
                                payload_len / es <= e.count - e.payload_offset &&
                                (payload_len > 0 || e.count == 0)
                          : payload_len == 0 && e.payload_offset == 0;
    if (!fits) {
      return bad(absl::StrCat("payload of ", payload_len, " bytes at element ",
                              e.payload_offset, " for ", e.Shape()));
    }
    if (!in.Take(payload_len, &e.payload) || (e.has_payload && !SkipPad(in, payload_len))) {
      return bad("truncated payload");
    }
  }
  if (in.left() != 0) return bad(absl::StrCat(in.left(), " trailing bytes"));
  return absl::OkStatus();
}

Plan Decide(const std::vector<RankList>& lists, int self, size_t fusion_bytes,
            size_t max_tensor_bytes) {
  const int n = static_cast<int>(lists.size());
  Plan plan;
  // Every key, in order of first appearance (rank 0's list first): the same on every rank.
  using Id = std::tuple<absl::string_view, uint32_t, uint8_t>;  // name, occurrence, phase
  struct Key {
    Id id;
    absl::InlinedVector<int, 8> idx;  // entry index per rank, -1: not listed
    int listed = 0;
  };
  absl::InlinedVector<Key, 1> keys;
  // A round of a few entries (small operations) finds its keys by a scan, without the
  // memory of a map.
  size_t total = 0;
  for (const RankList& l : lists) total += l.entries.size();
  const bool scan = total <= 16;
  absl::flat_hash_map<Id, size_t> by_id;
  auto key_of = [&](const Entry& e) -> Key& {
    const Id id(e.name, e.occurrence, e.phase);
    const size_t at =
        scan ? std::find_if(keys.begin(), keys.end(), [&](const Key& k) { return k.id == id; }) -
                   keys.begin()
             : by_id.try_emplace(id, keys.size()).first->second;
    if (at == keys.size()) keys.push_back(Key{id, absl::InlinedVector<int, 8>(n, -1), 0});
    return keys[at];
  };
  for (int r = 0; r < n; ++r) {
    if (lists[r].leaving) plan.leaving.push_back(r);
    if (!lists[r].entries.empty()) plan.any_entries = true;
    for (size_t i = 0; i < lists[r].entries.size(); ++i) {
      Key& k = key_of(lists[r].entries[i]);
      if (k.idx[r] < 0) ++k.listed;  // a duplicate in one list counts once
      k.idx[r] = static_cast<int>(i);
    }
  }
  absl::InlinedVector<const Key*, 4> ready;
  for (const Key& k : keys) {
    if (k.listed < n) {
      plan.pending = true;
      std::vector<int> have, lack;
      uint32_t age = 0;
      for (int r = 0; r < n; ++r) {
        if (k.idx[r] < 0) {
          lack.push_back(r);
        } else {
          have.push_back(r);
          age = std::max(age, lists[r].entries[k.idx[r]].age_ms);
        }
      }
      if (k.idx[self] >= 0) {
        plan.missing.push_back(Missing{static_cast<size_t>(k.idx[self]), std::move(lack)});
      } else {
        const Entry& e = lists[have[0]].entries[k.idx[have[0]]];
        plan.foreign.push_back(Foreign{e.name, e.kind, std::move(have), age});
      }
      continue;
    }
    const Entry& e0 = lists[0].entries[k.idx[0]];
    const bool same = AllAgree(lists, k.idx);
    Action a;
    a.entries = {static_cast<size_t>(k.idx[self])};
    a.dtype = e0.dtype;
    if (!same) {
      a.type = Action::Type::kFail;
      a.error = Mismatch(lists, k.idx, self);
      plan.actions.push_back(std::move(a));
    } else if (e0.kind == OpKind::kBroadcast && (e0.root < 0 || e0.root >= n)) {
      a.type = Action::Type::kFail;
      a.error = absl::InvalidArgumentError(absl::StrCat(
          "broadcast of '", e0.name, "': root rank ", e0.root, " is out of range [0, ", n, ")"));
      plan.actions.push_back(std::move(a));
    } else {
      ready.push_back(&k);
    }
  }
  // Priority (rank 0's) first, then rank 0's submission order. (Not for one: the sort
  // takes a buffer even then.)
  auto before = [&](const Key* a, const Key* b) {
    const Entry& ea = lists[0].entries[a->idx[0]];
    const Entry& eb = lists[0].entries[b->idx[0]];
    if (ea.priority != eb.priority) return ea.priority > eb.priority;
    return a->idx[0] < b->idx[0];
  };
  if (ready.size() > 1) std::stable_sort(ready.begin(), ready.end(), before);
  // Eager operations first: they need no collective.
  absl::InlinedVector<const Key*, 4> rest;
  for (const Key* k : ready) {
    const Entry& e0 = lists[0].entries[k->idx[0]];
    Action::Type type = Action::Type::kEager;
    if (e0.kind == OpKind::kBroadcast) {
      if (!lists[e0.root].entries[k->idx[e0.root]].WholePayload()) {
        rest.push_back(k);
        continue;
      }
    } else {
      // A two-shot: every peer sent this rank its chunk, exactly, and this rank's own list
      // (its message to the next rank) holds the next rank's. A rank sends its chunks to
      // every peer or to none, so every rank decides the same.
      bool whole = true, two_shot = n >= 2;
      for (int r = 0; r < n; ++r) {
        const Entry& e = lists[r].entries[k->idx[r]];
        whole = whole && e.WholePayload();
        if (two_shot) {
          const Chunk c = ChunkOf(e.count, r == self ? (self + 1) % n : self, n);
          two_shot = e.has_payload && e.payload_offset == c.begin &&
                     e.payload.size() == (c.end - c.begin) * DTypeSize(e.dtype);
        }
      }
      if (!whole && !two_shot) {
        rest.push_back(k);
        continue;
      }
      if (!whole) type = Action::Type::kTwoShot;
    }
    // Made in place in the plan (an action is large, and a round of one small operation,
    // the latency-bound case, then moves none).
    Action& a = plan.actions.emplace_back();
    a.type = type;
    a.entries.push_back(static_cast<size_t>(k->idx[self]));
    a.dtype = e0.dtype;
    a.total_count = e0.count;
    if (e0.kind == OpKind::kBroadcast) {
      a.payloads.push_back(lists[e0.root].entries[k->idx[e0.root]].payload);
    } else {
      for (int r = 0; r < n; ++r) a.payloads.push_back(lists[r].entries[k->idx[r]].payload);
    }
  }
  // Fusion: one open bucket per dtype and device; a bucket keeps its first member's place.
  absl::flat_hash_map<uint8_t, size_t> open;  // dtype + device -> index in plan.actions
  absl::flat_hash_map<uint8_t, uint64_t> open_bytes;
  for (const Key* k : rest) {
    const Entry& e0 = lists[0].entries[k->idx[0]];
    const size_t mine = static_cast<size_t>(k->idx[self]);
    const uint64_t bytes = e0.count * DTypeSize(e0.dtype);
    Action a;
    a.entries = {mine};
    a.dtype = e0.dtype;
    a.total_count = e0.count;
    if (e0.kind == OpKind::kBroadcast) {
      a.type = Action::Type::kBroadcast;
      plan.actions.push_back(std::move(a));
      continue;
    }
    a.type = Action::Type::kAllreduce;
    if (bytes >= fusion_bytes || (!e0.gpu && bytes > max_tensor_bytes)) {
      plan.actions.push_back(std::move(a));
      continue;
    }
    const uint8_t dt = static_cast<uint8_t>(static_cast<uint8_t>(e0.dtype) | (e0.gpu ? 0x80 : 0));
    auto it = open.find(dt);
    if (it != open.end() && open_bytes[dt] + bytes <= fusion_bytes) {
      Action& bucket = plan.actions[it->second];
      bucket.entries.push_back(mine);
      bucket.total_count += e0.count;
      open_bytes[dt] += bytes;
      continue;
    }
    open[dt] = plan.actions.size();
    open_bytes[dt] = bytes;
    plan.actions.push_back(std::move(a));
  }
  return plan;
}

// ---- RoundCache --------------------------------------------------------------------------

namespace {
// An entry's changing fields, at these offsets from its start (SerializeTo's order).
constexpr uint32_t kOccurrenceAt = 0;
constexpr uint32_t kAgeAt = 16;
static_assert(kEntryBytes == 56);
}  // namespace

void RoundCache::Remember(absl::string_view bytes, const RankList& list, Layout* layout) {
  layout->valid = true;
  layout->bytes = bytes.size();
  layout->runs.clear();
  layout->fixed.clear();
  layout->changing.clear();
  // [from, to) is fixed.
  auto run = [&](size_t from, size_t to) {
    if (to <= from) return;
    layout->runs.push_back({static_cast<uint32_t>(from), static_cast<uint32_t>(to - from)});
    layout->fixed.append(bytes.data() + from, to - from);
  };
  size_t at = kHeaderBytes;  // the first entry
  size_t fixed_from = 0;
  for (const Entry& e : list.entries) {
    const size_t payload_at = at + kEntryBytes + e.name.size() + PadOf(e.name.size()) +
                              sizeof(e.shape.dims[0]) * static_cast<size_t>(e.shape.ndim);
    run(fixed_from, at + kOccurrenceAt);
    run(at + kOccurrenceAt + sizeof(uint32_t), at + kAgeAt);
    run(at + kAgeAt + sizeof(uint32_t), payload_at);
    layout->changing.push_back({static_cast<uint32_t>(at + kOccurrenceAt),
                                static_cast<uint32_t>(at + kAgeAt),
                                static_cast<uint32_t>(payload_at)});
    // The payload changes; its padding moves with it (Parse checks that it is zero).
    at = payload_at + (e.has_payload ? e.payload.size() + PadOf(e.payload.size()) : 0);
    fixed_from = at;
  }
  run(fixed_from, bytes.size());
}

absl::Status RoundCache::Parse(absl::string_view bytes, int rank, RankList* list) {
  if (static_cast<size_t>(rank) >= layouts_.size()) layouts_.resize(rank + 1);
  Layout& layout = layouts_[rank];
  layout.repeated = false;
  // Offsets are kept in 32 bits: a larger message (never in a round) is always parsed.
  if (layout.valid && bytes.size() == layout.bytes && bytes.size() <= UINT32_MAX &&
      list->entries.size() == layout.changing.size()) {
    bool same = true;
    const char* fixed = layout.fixed.data();
    for (const Layout::Run& r : layout.runs) {
      if (std::memcmp(bytes.data() + r.at, fixed, r.len) != 0) {
        same = false;
        break;
      }
      fixed += r.len;
    }
    // A payload's padding changes place with it, but must be zero, as Parse checks.
    for (size_t i = 0; same && i < list->entries.size(); ++i) {
      const size_t size = list->entries[i].payload.size();
      same = AllZero(bytes.substr(layout.changing[i].payload_at + size, PadOf(size)));
    }
    if (same) {
      for (size_t i = 0; i < list->entries.size(); ++i) {
        Entry& e = list->entries[i];
        const Layout::Changing& c = layout.changing[i];
        std::memcpy(&e.occurrence, bytes.data() + c.occurrence_at, sizeof e.occurrence);
        std::memcpy(&e.age_ms, bytes.data() + c.age_at, sizeof e.age_ms);
        e.payload = absl::string_view(bytes.data() + c.payload_at, e.payload.size());
      }
      layout.repeated = true;
      ++parses_skipped_;
      return absl::OkStatus();
    }
  }
  layout.valid = false;
  RETURN_IF_ERROR(ParseInto(bytes, rank, list));
  if (bytes.size() <= UINT32_MAX) Remember(bytes, *list, &layout);
  return absl::OkStatus();
}

bool RoundCache::Reusable(const Plan& plan, const std::vector<RankList>& lists) {
  if (!plan.missing.empty() || !plan.foreign.empty() || !plan.leaving.empty() ||
      plan.pending || lists.empty()) {
    return false;
  }
  for (const Action& a : plan.actions) {
    if (a.type == Action::Type::kFail) return false;
  }
  // Every rank lists the same names, in the same order (then entry i is one key on every
  // rank whenever the occurrences agree), each name once.
  const std::vector<Entry>& first = lists[0].entries;
  for (const RankList& l : lists) {
    if (l.entries.size() != first.size()) return false;
    for (size_t i = 0; i < first.size(); ++i) {
      if (l.entries[i].name != first[i].name || l.entries[i].phase != first[i].phase) {
        return false;
      }
    }
  }
  if (first.size() <= 16) {
    for (size_t i = 0; i < first.size(); ++i) {
      for (size_t j = i + 1; j < first.size(); ++j) {
        if (first[i].name == first[j].name) return false;
      }
    }
  } else {
    absl::flat_hash_set<absl::string_view> names;
    for (const Entry& e : first) {
      if (!names.insert(e.name).second) return false;
    }
  }
  return true;
}

const Plan& RoundCache::Decide(const std::vector<RankList>& lists, int self,
                               size_t fusion_bytes, size_t max_tensor_bytes) {
  bool reuse = plan_reusable_ && self == self_ && fusion_bytes == fusion_bytes_ &&
               max_tensor_bytes == max_tensor_bytes_ && !lists.empty() &&
               layouts_.size() == lists.size();
  for (size_t r = 0; reuse && r < lists.size(); ++r) reuse = layouts_[r].repeated;
  for (size_t r = 1; reuse && r < lists.size(); ++r) {
    for (size_t i = 0; reuse && i < lists[0].entries.size(); ++i) {
      reuse = lists[r].entries[i].occurrence == lists[0].entries[i].occurrence;
    }
  }
  for (Layout& l : layouts_) l.repeated = false;  // a round's verdict is used once
  if (reuse) {
    const std::vector<Entry>& first = lists[0].entries;
    // Entry i is the same key on every rank: this round's payloads, where Decide took them.
    for (Action& a : plan_.actions) {
      if (a.type != Action::Type::kEager && a.type != Action::Type::kTwoShot) continue;
      const size_t i = a.entries[0];
      if (first[i].kind == OpKind::kBroadcast) {
        a.payloads[0] = lists[first[i].root].entries[i].payload;
      } else {
        for (size_t r = 0; r < lists.size(); ++r) a.payloads[r] = lists[r].entries[i].payload;
      }
    }
    ++plans_reused_;
    return plan_;
  }
  plan_ = negotiation::Decide(lists, self, fusion_bytes, max_tensor_bytes);
  plan_reusable_ = Reusable(plan_, lists);
  self_ = self;
  fusion_bytes_ = fusion_bytes;
  max_tensor_bytes_ = max_tensor_bytes;
  return plan_;
}

void RoundCache::Clear() {
  layouts_.clear();
  plan_ = Plan();
  plan_reusable_ = false;
}

}  // namespace hybridps::negotiation
