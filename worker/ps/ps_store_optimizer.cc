// dist_hybrid's server-side optimizer: SetOptimizer, SetOptimizerParam and the saving and
// loading of the servers' weights and optimizer state.
//
// Collective calls (SetOptimizer, LoadOptimizerStates) start with a barrier; then rank 0
// alone talks to the servers and publishes the outcome through the scheduler's store,
// where the other workers wait for it: every worker returns the same status. Changing
// the optimizer or loading state re-places the weights: rank 0 gathers them from every
// server, installs the spec (which drops what the servers held) and sends them back
// under the new placement (LAMB and LARS keep a tensor's partitions on one server).
//
// The state file: the 8 bytes "HPSOPT02", then records of a little-endian uint64 length,
// that many bytes of protobuf and the bytes' FNV-1a hash (a little-endian uint64, so
// that a corrupt file is refused, not loaded): first the wire::OptimizerSpec in effect,
// then one wire::PartState per partition (name, dtype, offset, count, update count,
// weights and every state buffer, element-aligned with the weights). "HPSOPT01" files
// (no hashes) still load. Loading checks the whole file before anything changes, then
// reassembles each tensor and splits it again for the new job's servers.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/status.h"
#include "common/wire.h"
#include "optimizers/spec_wire.h"
#include "worker/ps/ps_store.h"

namespace hybridps {
namespace {

constexpr char kFileMagic[8] = {'H', 'P', 'S', 'O', 'P', 'T', '0', '2'};
constexpr char kFileMagicV1[8] = {'H', 'P', 'S', 'O', 'P', 'T', '0', '1'};
constexpr size_t kBatchBytes = 32 << 20;

}  // namespace

// A whole tensor, reassembled from its partitions.
struct PsStore::SavedTensor {
  wire::PartState meta;  // name, key, dtype, total_count, updates, buffers (no data)
  std::string weight;    // total_count elements
  std::string state;     // buffers one after another, total_count floats each
  uint64_t covered = 0;
};

namespace {

using SavedTensors = std::map<std::string, PsStore::SavedTensor>;

absl::Status AddPart(SavedTensors& tensors, const wire::PartState& p, bool with_state) {
  PsStore::SavedTensor& t = tensors[p.name()];
  const size_t es = DTypeSize(static_cast<DType>(p.dtype()));
  const size_t nbuf = with_state ? p.buffers_size() : 0;
  if (t.covered == 0 && t.weight.empty()) {
    t.meta = p;
    t.meta.clear_weight();
    t.meta.clear_state();
    if (!with_state) t.meta.clear_buffers();
    t.weight.assign(p.total_count() * es, '\0');
    t.state.assign(nbuf * p.total_count() * sizeof(float), '\0');
  }
  const bool same_buffers = !with_state || std::equal(p.buffers().begin(), p.buffers().end(),
                                                      t.meta.buffers().begin(),
                                                      t.meta.buffers().end());
  if (!IsValidDType(p.dtype()) || p.dtype() != t.meta.dtype() ||
      p.total_count() != t.meta.total_count() || !same_buffers ||
      p.count() > p.total_count() || p.offset() > p.total_count() - p.count() ||
      p.weight().size() != p.count() * es ||
      p.state().size() != (with_state ? nbuf * p.count() * sizeof(float) : p.state().size())) {
    return absl::DataLossError(absl::StrCat(
        "tensor '", p.name(), "': its saved partitions disagree (partition at offset ",
        p.offset(), ": ", p.count(), " of ", p.total_count(), " elements of dtype ", p.dtype(),
        ", ", p.buffers_size(), " state buffers)"));
  }
  std::memcpy(t.weight.data() + p.offset() * es, p.weight().data(), p.weight().size());
  for (size_t b = 0; b < nbuf; ++b) {
    std::memcpy(t.state.data() + (b * p.total_count() + p.offset()) * sizeof(float),
                p.state().data() + b * p.count() * sizeof(float), p.count() * sizeof(float));
  }
  t.meta.set_updates(with_state ? std::max(t.meta.updates(), p.updates()) : 0);
  t.covered += p.count();
  return absl::OkStatus();
}

// The tensors of `parts` (their latest generation; older partitions, left behind by a
// broadcast with another size, are dropped), each checked to be whole. `with_state`:
// keep the optimizer state and update counts, else weights only.
absl::StatusOr<SavedTensors> Assemble(const std::vector<wire::PartState>& parts,
                                      bool with_state) {
  std::map<std::string, uint64_t> latest;
  for (const wire::PartState& p : parts) {
    uint64_t& g = latest[p.name()];
    g = std::max(g, p.generation());
  }
  SavedTensors tensors;
  for (const wire::PartState& p : parts) {
    if (p.generation() != latest[p.name()]) continue;
    RETURN_IF_ERROR(AddPart(tensors, p, with_state));
  }
  for (const auto& [name, t] : tensors) {
    if (t.covered != t.meta.total_count()) {
      return absl::DataLossError(absl::StrCat("tensor '", name, "': its partitions cover ",
                                              t.covered, " of ", t.meta.total_count(),
                                              " elements"));
    }
  }
  return tensors;
}

void WriteU64(std::ofstream& out, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  out.write(reinterpret_cast<const char*>(b), 8);
}

absl::Status WriteRecord(std::ofstream& out, const google::protobuf::MessageLite& m) {
  std::string bytes;
  if (!m.SerializeToString(&bytes)) return absl::InternalError("serialisation failed");
  WriteU64(out, bytes.size());
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  WriteU64(out, Fnv1a64(bytes));
  return absl::OkStatus();
}

// Reads 8 bytes; false when none are left, an error when fewer than 8 are.
absl::StatusOr<bool> ReadU64(std::ifstream& in, const std::string& path, uint64_t* v) {
  unsigned char b[8];
  in.read(reinterpret_cast<char*>(b), 8);
  if (in.gcount() == 0 && in.eof()) return false;
  if (in.gcount() != 8) return absl::DataLossError(absl::StrCat("'", path, "' is truncated"));
  *v = 0;
  for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return true;
}

// Record `index` of the file (its checksum checked when `checksums`); false at a clean
// end of file.
absl::StatusOr<bool> ReadRecord(std::ifstream& in, const std::string& path, bool checksums,
                                size_t index, google::protobuf::MessageLite* m) {
  uint64_t n = 0;
  ASSIGN_OR_RETURN(bool more, ReadU64(in, path, &n));
  if (!more) return false;
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("'", path, "' is corrupt: record ", index, " ",
                                            why, "; nothing was loaded"));
  };
  if (n > (uint64_t{1} << 40)) return corrupt(absl::StrCat("claims ", n, " bytes"));
  std::string bytes(n, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(n));
  if (static_cast<uint64_t>(in.gcount()) != n) return corrupt("is truncated");
  if (checksums) {
    uint64_t sum = 0;
    ASSIGN_OR_RETURN(bool has_sum, ReadU64(in, path, &sum));
    if (!has_sum) return corrupt("has no checksum (truncated)");
    if (sum != Fnv1a64(bytes)) return corrupt("does not match its checksum");
  }
  if (!m->ParseFromString(bytes)) return corrupt("does not parse");
  return true;
}

}  // namespace

std::vector<Partition> PsStore::Place(uint64_t key, size_t count, DType dtype) const {
  // Mixed deployments weight the extra server hosts by BytePS's optimum (partition.h).
  std::vector<Partition> parts =
      PartitionTensor(key, count, dtype, options_.partition_bytes,
                      ServerPlacement{num_servers_, options_.extra_servers});
  if (one_server_per_tensor_.load(std::memory_order_relaxed)) {
    for (Partition& p : parts) p.server = parts[0].server;
  }
  return SplitIntoChunks(std::move(parts), dtype, options_.wire_chunk_bytes);
}

void PsStore::FailServerCalls(const absl::Status& status, absl::Time now) {
  for (auto it = server_calls_.begin(); it != server_calls_.end();) {
    if (status.ok() && it->second.deadline > now) {
      ++it;
      continue;
    }
    auto done = std::move(it->second.done);
    const int server = it->second.server;
    server_calls_.erase(it++);
    done(status.ok() ? absl::DeadlineExceededError(absl::StrCat(
                           "server ", server, " (", servers_[server].endpoint(),
                           ") did not answer an optimizer request within ",
                           absl::FormatDuration(options_.op_timeout)))
                     : status);
  }
}

absl::Status PsStore::RunOnIo(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    Command c;
    c.run = std::move(fn);
    commands_.push_back(std::move(c));
    CallIoLocked();
  }
  credits_->waker.Wake();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<wire::OptimizerResponse>> PsStore::CallServers(
    std::vector<std::pair<int, wire::OptimizerRequest>> requests) {
  struct State {
    explicit State(size_t n) : pending(n), replies(n, absl::UnknownError("no reply")) {}
    absl::Mutex mu;
    size_t pending ABSL_GUARDED_BY(mu);
    std::vector<absl::StatusOr<wire::Envelope>> replies ABSL_GUARDED_BY(mu);
    absl::Notification done;
  };
  auto st = std::make_shared<State>(requests.size());
  if (requests.empty()) return std::vector<wire::OptimizerResponse>{};
  RETURN_IF_ERROR(RunOnIo([this, st, requests = std::move(requests)]() mutable {
    for (size_t i = 0; i < requests.size(); ++i) {
      auto done = [st, i](absl::StatusOr<wire::Envelope> r) {
        absl::MutexLock lock(&st->mu);
        st->replies[i] = std::move(r);
        if (--st->pending == 0) st->done.Notify();
      };
      const int server = requests[i].first;
      // A server's first connection. The calls that come here (SetOptimizer, saving and
      // loading state) are made between steps, after the pushes they depend on returned;
      // the other lanes give no order against them (Options::max_server_lanes).
      Socket* sock = data_[lane_first_[server]].get();
      if (!broken_.ok() || sock == nullptr) {
        done(broken_.ok() ? absl::UnavailableError("no connection") : broken_);
        continue;
      }
      wire::Envelope env;
      const uint64_t id = next_request_id_++;
      env.set_id(id);
      *env.mutable_optimizer_request() = std::move(requests[i].second);
      Message msg = Encode("", env);
      if (absl::Status s = sock->Send(msg); !s.ok()) {
        done(absl::UnavailableError(
            absl::StrCat("send to server ", server, " failed: ", s.message())));
        continue;
      }
      server_calls_.emplace(id, ServerCall{server, absl::Now() + options_.op_timeout,
                                           std::move(done)});
    }
  }));
  st->done.WaitForNotification();
  std::vector<absl::StatusOr<wire::Envelope>> replies;
  {
    absl::MutexLock lock(&st->mu);
    replies = std::move(st->replies);
  }
  std::vector<wire::OptimizerResponse> out;
  for (auto& r : replies) {
    if (!r.ok()) return r.status();
    if (r->body_case() != wire::Envelope::kOptimizerResponse) {
      return absl::InternalError("a server sent a malformed optimizer reply");
    }
    out.push_back(std::move(*r->mutable_optimizer_response()));
  }
  return out;
}

absl::StatusOr<wire::Envelope> PsStore::CallScheduler(wire::Envelope env) {
  auto result = std::make_shared<absl::StatusOr<wire::Envelope>>();
  auto done = std::make_shared<absl::Notification>();
  RETURN_IF_ERROR(RunOnIo([this, env = std::move(env), result, done]() mutable {
    control_->Request(std::move(env), absl::Now() + options_.op_timeout,
                      [result, done](absl::StatusOr<wire::Envelope> r) {
                        *result = std::move(r);
                        done->Notify();
                      });
  }));
  done->WaitForNotification();
  return *result;
}

absl::Status PsStore::OptimizerCollective(
    absl::string_view what,
    const std::function<absl::StatusOr<wire::CollectiveResult>()>& rank0) {
  const uint64_t seq = ++optimizer_collectives_;
  RETURN_IF_ERROR(Barrier());
  const std::string key = absl::StrCat("hybridps/optimizer/", seq);
  wire::CollectiveResult result;
  if (rank_ == 0) {
    absl::StatusOr<wire::CollectiveResult> r = rank0();
    if (r.ok()) {
      result = std::move(*r);
    } else {
      result.mutable_error()->set_code(static_cast<int>(r.status().code()));
      result.mutable_error()->set_message(std::string(r.status().message()));
    }
    wire::Envelope env;
    env.mutable_kv_set()->set_key(key);
    env.mutable_kv_set()->set_value(result.SerializeAsString());
    RETURN_IF_ERROR(CallScheduler(std::move(env)).status());
  } else {
    wire::Envelope env;
    env.mutable_kv_wait()->add_keys(key);
    env.mutable_kv_wait()->set_timeout_ms(absl::ToInt64Milliseconds(options_.op_timeout));
    ASSIGN_OR_RETURN(wire::Envelope reply, CallScheduler(std::move(env)));
    if (reply.body_case() != wire::Envelope::kKvReply || reply.kv_reply().values_size() != 1 ||
        !result.ParseFromString(reply.kv_reply().values(0))) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": no outcome from worker 0 within ",
                       absl::FormatDuration(options_.op_timeout)));
    }
  }
  if (result.has_error() && result.error().code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(result.error().code()),
                        absl::StrCat(what, ": ", result.error().message()));
  }
  one_server_per_tensor_.store(result.tensor_norms());
  return absl::OkStatus();
}

absl::Status PsStore::ConfigureServers(const wire::OptimizerSpec& spec, bool validate_only) {
  std::vector<std::pair<int, wire::OptimizerRequest>> reqs;
  for (int s = 0; s < num_servers_; ++s) {
    wire::OptimizerRequest r;
    r.set_validate_only(validate_only);
    *r.mutable_configure() = spec;
    reqs.emplace_back(s, std::move(r));
  }
  return CallServers(std::move(reqs)).status();
}

absl::StatusOr<std::vector<wire::PartState>> PsStore::GatherParts(
    wire::OptimizerResponse* spec) {
  std::vector<wire::PartState> parts;
  for (int s = 0; s < num_servers_; ++s) {
    uint64_t from = 0;
    while (true) {
      wire::OptimizerRequest r;
      r.set_dump_from(from);
      std::vector<std::pair<int, wire::OptimizerRequest>> reqs;
      reqs.emplace_back(s, std::move(r));
      ASSIGN_OR_RETURN(auto replies, CallServers(std::move(reqs)));
      wire::OptimizerResponse& resp = replies[0];
      if (s == 0 && from == 0 && spec != nullptr && resp.has_spec()) {
        *spec->mutable_spec() = resp.spec();
      }
      for (auto& p : *resp.mutable_parts()) parts.push_back(std::move(p));
      if (!resp.more()) break;
      from = resp.next();
    }
  }
  return parts;
}

absl::Status PsStore::ScatterTensors(const SavedTensors& tensors) {
  std::vector<wire::OptimizerLoad> batch(num_servers_);
  std::vector<size_t> batch_bytes(num_servers_, 0);
  auto flush = [&](bool all) -> absl::Status {
    std::vector<std::pair<int, wire::OptimizerRequest>> reqs;
    for (int s = 0; s < num_servers_; ++s) {
      if (batch[s].parts_size() == 0 || (!all && batch_bytes[s] < kBatchBytes)) continue;
      wire::OptimizerRequest r;
      *r.mutable_load() = std::move(batch[s]);
      batch[s].Clear();
      batch_bytes[s] = 0;
      reqs.emplace_back(s, std::move(r));
    }
    return CallServers(std::move(reqs)).status();
  };
  for (const auto& [name, t] : tensors) {
    const DType dt = static_cast<DType>(t.meta.dtype());
    const size_t es = DTypeSize(dt);
    const size_t nbuf = t.meta.buffers_size();
    for (const Partition& p : Place(t.meta.key(), t.meta.total_count(), dt)) {
      wire::PartState ps = t.meta;
      ps.set_part(p.index);
      ps.set_offset(p.offset);
      ps.set_count(p.count);
      ps.set_weight(t.weight.substr(p.offset * es, p.count * es));
      std::string* state = ps.mutable_state();
      for (size_t b = 0; b < nbuf; ++b) {
        state->append(t.state, (b * t.meta.total_count() + p.offset) * sizeof(float),
                      p.count * sizeof(float));
      }
      batch_bytes[p.server] += ps.weight().size() + state->size();
      *batch[p.server].add_parts() = std::move(ps);
    }
    RETURN_IF_ERROR(flush(false));
  }
  return flush(true);
}

absl::Status PsStore::SetOptimizer(const ServerOptimizer& optimizer) {
  wire::OptimizerSpec spec;
  optimizers::SpecToWire(optimizer.spec, &spec);
  for (const auto& [name, m] : optimizer.multipliers) {
    wire::KeyMultipliers& w = (*spec.mutable_multipliers())[name];
    w.set_lr_mult(m.lr_mult);
    w.set_wd_mult(m.wd_mult);
  }
  return OptimizerCollective("SetOptimizer", [&]() -> absl::StatusOr<wire::CollectiveResult> {
    ASSIGN_OR_RETURN(optimizers::OptimizerSpec parsed, optimizers::SpecFromWire(spec));
    ASSIGN_OR_RETURN(auto rule, optimizers::MakeUpdateRule(parsed));
    // Every server checks it before any changes; then the weights the servers hold move
    // to the placement the rule wants, with fresh state.
    RETURN_IF_ERROR(ConfigureServers(spec, /*validate_only=*/true));
    ASSIGN_OR_RETURN(std::vector<wire::PartState> parts, GatherParts(nullptr));
    ASSIGN_OR_RETURN(SavedTensors tensors, Assemble(parts, /*with_state=*/false));
    parts.clear();
    RETURN_IF_ERROR(ConfigureServers(spec, /*validate_only=*/false));
    one_server_per_tensor_.store(rule->needs_tensor_norms());
    RETURN_IF_ERROR(ScatterTensors(tensors));
    wire::CollectiveResult result;
    result.set_rule(rule->name());
    result.set_tensor_norms(rule->needs_tensor_norms());
    return result;
  });
}

absl::Status PsStore::SetOptimizerParam(absl::string_view param, double value) {
  for (bool validate_only : {true, false}) {
    std::vector<std::pair<int, wire::OptimizerRequest>> reqs;
    for (int s = 0; s < num_servers_; ++s) {
      wire::OptimizerRequest r;
      r.set_validate_only(validate_only);
      r.mutable_set_param()->set_name(std::string(param));
      r.mutable_set_param()->set_value(value);
      reqs.emplace_back(s, std::move(r));
    }
    absl::Status s = CallServers(std::move(reqs)).status();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("SetOptimizerParam: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status PsStore::SaveOptimizerStates(const std::string& path) {
  wire::OptimizerResponse spec;
  ASSIGN_OR_RETURN(std::vector<wire::PartState> parts, GatherParts(&spec));
  if (!spec.has_spec()) {
    return absl::FailedPreconditionError(
        "SaveOptimizerStates: no optimizer is set on the servers (SetOptimizer first)");
  }
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("SaveOptimizerStates: cannot write '", tmp, "'"));
    }
    out.write(kFileMagic, sizeof kFileMagic);
    RETURN_IF_ERROR(WriteRecord(out, spec.spec()));
    for (const wire::PartState& p : parts) RETURN_IF_ERROR(WriteRecord(out, p));
    out.flush();
    if (!out) {
      return absl::DataLossError(absl::StrCat("SaveOptimizerStates: writing '", tmp,
                                              "' failed (disk full?)"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("SaveOptimizerStates: cannot rename '", tmp, "' to '", path, "'"));
  }
  HPS_LOG(INFO) << "saved the optimizer state of " << parts.size() << " partitions to "
                << path;
  return absl::OkStatus();
}

absl::Status PsStore::LoadOptimizerStates(const std::string& path) {
  return OptimizerCollective(
      "LoadOptimizerStates", [&]() -> absl::StatusOr<wire::CollectiveResult> {
        std::ifstream in(path, std::ios::binary);
        if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
        char magic[sizeof kFileMagic];
        in.read(magic, sizeof magic);
        const bool full = in.gcount() == sizeof magic;
        const bool checksums = full && std::memcmp(magic, kFileMagic, sizeof magic) == 0;
        if (!checksums && !(full && std::memcmp(magic, kFileMagicV1, sizeof magic) == 0)) {
          return absl::DataLossError(
              absl::StrCat("'", path, "' is not a hybridps optimizer state file"));
        }
        wire::OptimizerSpec spec;
        ASSIGN_OR_RETURN(bool have_spec, ReadRecord(in, path, checksums, 0, &spec));
        if (!have_spec) return absl::DataLossError(absl::StrCat("'", path, "' is empty"));
        std::vector<wire::PartState> parts;
        while (true) {
          wire::PartState p;
          ASSIGN_OR_RETURN(bool more, ReadRecord(in, path, checksums, parts.size() + 1, &p));
          if (!more) break;
          parts.push_back(std::move(p));
        }
        ASSIGN_OR_RETURN(optimizers::OptimizerSpec parsed, optimizers::SpecFromWire(spec));
        ASSIGN_OR_RETURN(auto rule, optimizers::MakeUpdateRule(parsed));
        // The whole file is checked before anything changes on the servers.
        ASSIGN_OR_RETURN(SavedTensors tensors, Assemble(parts, /*with_state=*/true));
        const size_t num_parts = parts.size();
        parts.clear();
        RETURN_IF_ERROR(ConfigureServers(spec, /*validate_only=*/true));
        RETURN_IF_ERROR(ConfigureServers(spec, /*validate_only=*/false));
        one_server_per_tensor_.store(rule->needs_tensor_norms());
        RETURN_IF_ERROR(ScatterTensors(tensors));
        HPS_LOG(INFO) << "loaded the optimizer state of " << num_parts
                      << " saved partitions from " << path;
        wire::CollectiveResult result;
        result.set_rule(rule->name());
        result.set_tensor_norms(rule->needs_tensor_norms());
        return result;
      });
}

}  // namespace hybridps
