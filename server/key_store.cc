#include "server/key_store.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/compression.h"
#include "common/dtype.h"
#include "common/log.h"
#include "common/reduce.h"
#include "common/wire.h"

namespace hybridps {
namespace {

std::string Where(const wire::DataRequest& req) {
  return absl::StrFormat("tensor '%s' (key %016x, partition %u, round %u)", req.name(),
                         req.key(), req.part(), req.round());
}

TensorShape ShapeOf(const wire::DataRequest& req) {
  return TensorShape::Of(req.shape().data(), static_cast<size_t>(req.shape_size()));
}

// "12 float32 elements", or "(3, 4) float32" when the request gives the tensor's shape.
std::string Shape(const wire::DataRequest& req) {
  return DescribeTensor(ShapeOf(req), req.total_count(),
                        static_cast<DType>(req.dtype()));
}

// The float32 values of a compressed push (DataRequest.compression), or an error naming
// what is wrong with it.
absl::StatusOr<Frame> Decompress(const wire::DataRequest& req, const Frame& packed) {
  const GradientCompression c{static_cast<Compression>(req.compression()), req.threshold()};
  if (c.type != Compression::kTwoBit) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(req), ": unknown compression ", req.compression(), " (a newer worker?)"));
  }
  if (req.op() != wire::OP_PUSHPULL || req.dtype() != static_cast<uint32_t>(DType::kFloat32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(req), ": 2bit compression is for float32 push_pulls only"));
  }
  if (absl::Status s = CheckGradientCompression(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(req), ": ", s.message()));
  }
  // The size first: the count comes from the network, and sizes the buffer below.
  if (req.count() > packed.size() * 4 || TwoBitBytes(req.count()) != packed.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(req), ": a 2bit-compressed partition of ", req.count(), " elements takes ",
        TwoBitBytes(std::min<uint64_t>(req.count(), packed.size() * 4 + 16)), " bytes, not ",
        packed.size()));
  }
  Frame plain = Frame::Allocate(req.count() * sizeof(float));
  absl::Status s = TwoBitDequantize(packed.view(), req.count(), c.threshold,
                                    static_cast<float*>(plain.data()));
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(Where(req), ": ", s.message()));
  return plain;
}

std::string OpName(wire::DataOp op) {
  return op == wire::OP_BROADCAST ? "broadcast" : "push_pull";
}

}  // namespace

std::string KeyStore::NodeLabel(int node, const std::vector<std::string>& worker_names) const {
  auto name = [&](int w) {
    return static_cast<size_t>(w) < worker_names.size() ? worker_names[w]
                                                        : absl::StrCat("worker ", w);
  };
  if (static_cast<size_t>(node) >= workers_of_node_.size()) return name(node);
  const std::vector<int>& ws = workers_of_node_[node];
  if (ws.size() == 1) return name(ws[0]);
  std::vector<std::string> names;
  for (int w : ws) names.push_back(name(w));
  return absl::StrCat("node ", node, " (", absl::StrJoin(names, ", "), ")");
}

void KeyStore::WarnStalls(absl::Time now, absl::Duration after,
                          const std::vector<std::string>& worker_names) {
  for (auto& [k, p] : parts_) {
    if (p.num_arrived == 0 || p.num_arrived >= num_nodes_ || p.updating || !p.error.ok() ||
        now - p.opened < after || now - p.warned < after) {
      continue;
    }
    p.warned = now;
    std::vector<std::string> missing;
    for (int n = 0; n < num_nodes_; ++n) {
      if (!p.arrived[n]) missing.push_back(NodeLabel(n, worker_names));
    }
    const std::string text = absl::StrCat(
        "round ", p.round, " of '", p.name, "' partition ", k.part, " has waited ",
        absl::FormatDuration(absl::Trunc(now - p.opened, absl::Milliseconds(100))), " for ",
        absl::StrJoin(missing, ", "));
    HPS_LOG_EVERY_SEC(WARNING, 1) << text;
    for (const Waiter& w : p.waiters) {
      Reply r;
      r.peer = w.peer;
      r.env.set_id(w.id);
      r.env.mutable_stall_notice()->set_text(text);
      emit_(std::move(r));
    }
  }
}

void KeyStore::ReplyError(const std::string& peer, uint64_t id, const wire::DataRequest& req,
                          const absl::Status& status) {
  Reply r;
  r.peer = peer;
  r.env = MakeError(id, status);
  emit_(std::move(r));
}

std::string KeyStore::NodeName(int node) const {
  if (node < 0 || static_cast<size_t>(node) >= workers_of_node_.size()) {
    return absl::StrCat("worker ", node);
  }
  const std::vector<int>& w = workers_of_node_[node];
  if (w.size() == 1) return absl::StrCat("worker ", w[0]);
  return absl::StrCat("node ", node, " (workers ", absl::StrJoin(w, ", "), ")");
}

void KeyStore::Handle(const std::string& peer, int node, uint64_t id,
                      const wire::DataRequest& req, std::optional<Frame> payload) {
  if (!failed_.ok()) return ReplyError(peer, id, req, failed_);
  if (node < 0 || node >= num_nodes_) {
    return ReplyError(peer, id, req, absl::InvalidArgumentError(absl::StrCat(
        "worker node ", node, " is out of range [0, ", num_nodes_, ")")));
  }
  if (req.compression() != 0 && payload) {
    absl::StatusOr<Frame> plain = Decompress(req, *payload);
    if (!plain.ok()) return ReplyError(peer, id, req, plain.status());
    traffic_.bytes_in += payload->size();  // what crossed the network
    traffic_.bytes_decompressed += plain->size();
    payload = std::move(*plain);
  } else if (payload) {
    traffic_.bytes_in += payload->size();
  }
  Part& p = parts_[PartKey{req.key(), req.part()}];
  if (p.arrived.empty()) {
    p.name = req.name();
    p.arrived.assign(num_nodes_, false);
  } else if (p.name != req.name()) {
    return ReplyError(peer, id, req, absl::InvalidArgumentError(absl::StrCat(
        "tensor names '", req.name(), "' and '", p.name,
        "' hash to the same key; rename one of them")));
  }
  if (req.round() < p.round) {
    return ReplyError(peer, id, req, absl::FailedPreconditionError(absl::StrCat(
        Where(req), ": ", NodeName(node), " is at round ", req.round(), " but the server is at "
        "round ", p.round, "; the workers issued different sequences of operations on it")));
  }
  if (req.round() > p.round) {
    // Round numbers are per tensor, so a partition may skip some (a tensor whose size
    // changed). An open round with arrivals that a later round overtakes was left behind
    // by a failure (a worker gave up on it): abandon it rather than mix its data in.
    if (p.num_arrived > 0) {
      FailRound(p, absl::AbortedError(absl::StrCat(
          Where(req), " was abandoned: ", NodeName(node), " moved on to round ", req.round(),
          " after an earlier failure")));
      ResetRound(p);
    }
    p.round = req.round();
  }
  if (p.arrived[node]) {
    return ReplyError(peer, id, req, absl::FailedPreconditionError(absl::StrCat(
        Where(req), ": ", NodeName(node), " sent it twice in one round")));
  }
  p.arrived[node] = true;
  ++p.num_arrived;
  if (p.num_arrived == num_nodes_) {
    if (round_hook_) p.all_arrived = absl::Now();
    p.last_node = node;
  }
  if (p.num_arrived == 1) {
    p.op = req.op();
    p.dtype = req.dtype();
    p.count = req.count();
    p.root = req.root();
    p.first_node = node;
    p.opened = absl::Now();
    p.warned = absl::InfinitePast();
    p.first = req;
    p.total_count = req.total_count();
    p.shape = ShapeOf(req);
    p.shape_node = node;
  } else if (p.error.ok() && req.fail().empty()) {
    // A failing request (a node whose local ranks disagreed) carries one local rank's
    // shape; its own message, below, says more than a comparison with it would.
    std::string what;
    if (req.op() != p.op) {
      what = absl::StrCat(NodeName(node), " called ", OpName(req.op()), " but ",
                          NodeName(p.first_node), " called ", OpName(p.op));
    } else if (req.total_count() != p.total_count || req.dtype() != p.dtype ||
               req.count() != p.count) {
      what = absl::StrCat(NodeName(node), " sent ", Shape(req), " but ",
                          NodeName(p.first_node), " sent ", Shape(p.first));
    } else if (!ShapeOf(req).Agrees(p.shape)) {
      what = absl::StrCat(NodeName(node), " sent ", Shape(req), " but ",
                          NodeName(p.shape_node), " sent ",
                          DescribeTensor(p.shape, p.total_count, static_cast<DType>(p.dtype)));
    } else if (req.op() == wire::OP_BROADCAST && req.root() != p.root) {
      // The server knows the root's node only: "root worker 3", or "a root on node 1
      // (workers 2, 3)".
      auto root = [&](int n) {
        const std::string name = NodeName(n);
        return absl::StartsWith(name, "node ") ? absl::StrCat("a root on ", name)
                                               : absl::StrCat("root ", name);
      };
      what = absl::StrCat(NodeName(node), " broadcasts from ", root(req.root()), " but ",
                          NodeName(p.first_node), " from ", root(p.root));
    }
    if (!what.empty()) {
      FailRound(p, absl::InvalidArgumentError(absl::StrCat("mismatched ", OpName(p.op), " of ",
                                                          Where(req), ": ", what)));
    } else if (!p.shape.known()) {
      p.shape = ShapeOf(req);
      p.shape_node = node;
    }
  }
  if (p.error.ok()) FailIfSomeoneLeft(p);
  if (p.error.ok() && !req.fail().empty()) {  // the node's local ranks disagreed
    FailRound(p, absl::InvalidArgumentError(absl::StrCat(Where(req), ": ", req.fail())));
  }
  if (p.error.ok() && p.op == wire::OP_BROADCAST) {
    if (p.root < 0 || p.root >= num_nodes_) {
      FailRound(p, absl::InvalidArgumentError(absl::StrCat(
          "broadcast of ", Where(req), ": the root's node ", p.root, " is out of range [0, ",
          num_nodes_, ")")));
    } else if (node == p.root && !payload) {
      FailRound(p, absl::InvalidArgumentError(absl::StrCat(
          "broadcast of ", Where(req), ": the root sent no data")));
    }
  }
  if (!p.error.ok()) {
    ReplyError(peer, id, req, p.error);
  } else {
    p.waiters.push_back(Waiter{peer, id, node});
    if (p.op == wire::OP_PUSHPULL) {
      const DType dt = static_cast<DType>(p.dtype);
      if (!p.acc) {
        p.acc = std::move(payload);  // The first push is the accumulator: no copy.
      } else if (offload_ && (p.pending_sums > 0 || payload->size() >= kInlineSumBytes)) {
        ++p.pending_sums;
        offload_(SumTask{req.key(), req.part(), p.round, dt, p.count, p.acc->data(),
                         p.acc->Share(), std::move(*payload)});
      } else {
        SumInto(dt, p.acc->data(), payload->data(), p.count);
      }
    } else if (node == p.root) {
      p.acc = std::move(payload);
    }
  }
  MaybeEndRound(p, req.key(), req.part());
}

void KeyStore::SumDone(uint64_t key, uint32_t part, uint64_t round) {
  auto it = parts_.find(PartKey{key, part});
  if (it == parts_.end() || it->second.round != round) return;  // a failed round's sum
  Part& p = it->second;
  --p.pending_sums;
  MaybeEndRound(p, key, part);
}

void KeyStore::MaybeEndRound(Part& p, uint64_t key, uint32_t part) {
  if (p.num_arrived < num_nodes_ || p.updating) return;
  if (p.error.ok()) {
    if (p.pending_sums > 0) return;  // SumDone ends it.
    if (round_hook_) p.summed = absl::Now();
    absl::StatusOr<bool> taken = false;
    if (p.op == wire::OP_PUSHPULL && update_) taken = update_(p.first, &p.acc);
    if (round_hook_) p.updated = absl::Now();  // an update done inline ends here
    if (!taken.ok()) {
      FailRound(p, taken.status());
    } else if (*taken) {
      p.updating = true;  // UpdateDone ends it.
      return;
    } else {
      if (p.op == wire::OP_BROADCAST && broadcast_) broadcast_(p.first, p.acc->data());
      CloseRound(p, key, part);
    }
  }
  ResetRound(p);
  ++p.round;
}

void KeyStore::UpdateDone(uint64_t key, uint32_t part, uint64_t round,
                          const absl::Status& status, std::optional<Frame> result) {
  auto it = parts_.find(PartKey{key, part});
  if (it == parts_.end() || it->second.round != round || !it->second.updating) return;
  Part& p = it->second;
  p.updating = false;
  if (round_hook_) p.updated = absl::Now();
  if (status.ok() && result) {
    p.acc = std::move(result);
    CloseRound(p, key, part);
  } else {
    FailRound(p, status.ok() ? absl::InternalError("the update returned no weights") : status);
  }
  ResetRound(p);
  ++p.round;
}

void KeyStore::ResetRound(Part& p) {
  p.arrived.assign(num_nodes_, false);
  p.num_arrived = 0;
  p.pending_sums = 0;
  p.updating = false;
  p.waiters.clear();
  p.acc.reset();
  p.error = absl::OkStatus();
  p.op = wire::OP_NONE;
}

void KeyStore::CloseRound(Part& p, uint64_t key, uint32_t part) {
  for (Waiter& w : p.waiters) {
    Reply r;
    r.peer = std::move(w.peer);
    r.env.set_id(w.id);
    auto* resp = r.env.mutable_data_response();
    resp->set_key(key);
    resp->set_part(part);
    resp->set_round(p.round);
    resp->set_count(p.count);
    resp->set_dtype(p.dtype);
    if (!(p.op == wire::OP_BROADCAST && w.node == p.root)) {
      r.payload = p.acc->Share();
      traffic_.bytes_out += r.payload->size();
    }
    emit_(std::move(r));
  }
  ++traffic_.rounds;
  if (num_nodes_ > 1 && p.last_node >= 0) {
    traffic_.last_push.resize(num_nodes_);
    ++traffic_.last_push[p.last_node];
  }
  if (round_hook_) {
    round_hook_(p.name, part, p.round, {p.opened, p.all_arrived, p.summed, p.updated,
                                        p.op == wire::OP_BROADCAST});
  }
  p.value = std::move(p.acc);
}

void KeyStore::FailRound(Part& p, const absl::Status& status) {
  p.error = status;
  for (Waiter& w : p.waiters) {
    Reply r;
    r.peer = std::move(w.peer);
    r.env = MakeError(w.id, status);
    emit_(std::move(r));
  }
  p.waiters.clear();
  p.acc.reset();
}

void KeyStore::Leave(int node, const std::string& reason) {
  if (node < 0 || node >= num_nodes_) return;
  if (left_.empty()) left_.resize(num_nodes_);
  if (!left_[node].empty()) return;
  left_[node] = reason;
  for (auto& [k, p] : parts_) {
    if (p.num_arrived > 0 && p.error.ok()) FailIfSomeoneLeft(p);
  }
}

void KeyStore::FailIfSomeoneLeft(Part& p) {
  for (size_t r = 0; r < left_.size(); ++r) {
    if (left_[r].empty() || p.arrived[r]) continue;
    FailRound(p, absl::FailedPreconditionError(absl::StrCat(
        OpName(p.op), " of ", Where(p.first), ": ", left_[r],
        " before taking part in it; it cannot complete")));
    return;
  }
}

void KeyStore::FailAll(const absl::Status& status) {
  failed_ = status;
  for (auto& [k, p] : parts_) {
    if (!p.waiters.empty()) FailRound(p, status);
  }
}

}  // namespace hybridps
