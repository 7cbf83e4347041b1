#include "server/optimizer_host.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizers/spec_wire.h"

namespace hybridps {
namespace {

using optimizers::UpdateRule;

std::string Where(absl::string_view name, uint32_t part) {
  return absl::StrCat("tensor '", name, "' partition ", part);
}

absl::Status CheckMultipliers(const wire::OptimizerSpec& spec) {
  for (const auto& [name, m] : spec.multipliers()) {
    for (auto [what, v] : {std::pair{"lr_mult", m.lr_mult()}, std::pair{"wd_mult", m.wd_mult()}}) {
      if (!(std::isfinite(v) && v >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer '", spec.rule(), "': tensor '", name, "' has ", what, " = ", v,
            "; it must be finite and >= 0"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const UpdateRule>> MakeRule(const wire::OptimizerSpec& spec) {
  auto parsed = optimizers::SpecFromWire(spec);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckMultipliers(spec); !s.ok()) return s;
  auto rule = optimizers::MakeUpdateRule(*parsed);
  if (!rule.ok()) return rule.status();
  return std::shared_ptr<const UpdateRule>(std::move(*rule));
}

optimizers::Partition PartitionOf(OptimizerHost::Slot& s, const void* grad)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  optimizers::Partition p;
  p.weight = s.weight.data();
  p.grad = grad;
  p.dtype = s.dtype;
  p.count = s.count;
  return p;
}

}  // namespace

absl::Status OptimizerHost::Configure(const wire::OptimizerSpec& spec, bool validate_only) {
  auto rule = MakeRule(spec);
  if (!rule.ok()) return rule.status();
  if (validate_only) return absl::OkStatus();
  rule_ = std::move(*rule);
  spec_ = spec;
  spec_.set_rule(rule_->name());
  slots_.clear();
  return absl::OkStatus();
}

absl::Status OptimizerHost::SetParam(const wire::SetOptimizerParam& param, bool validate_only) {
  if (!active()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot set optimizer hyper-parameter '", param.name(),
        "': no optimizer is set on the servers (SetOptimizer first)"));
  }
  wire::OptimizerSpec spec = spec_;
  (*spec.mutable_params())[param.name()] = param.value();
  auto rule = MakeRule(spec);
  if (!rule.ok()) return rule.status();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    if (!((*rule)->Layout(dt) == rule_->Layout(dt))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer '", rule_->name(), "': setting '", param.name(), "' to ", param.value(),
          " changes the optimizer state it keeps (",
          absl::StrJoin(rule_->Layout(dt).buffers, ","), " -> ",
          absl::StrJoin((*rule)->Layout(dt).buffers, ","),
          "); set a new optimizer with SetOptimizer instead"));
    }
  }
  if (validate_only) return absl::OkStatus();
  rule_ = std::move(*rule);
  spec_ = std::move(spec);
  return absl::OkStatus();
}

void OptimizerHost::StoreBroadcast(const wire::DataRequest& req, const void* data) {
  const DType dt = static_cast<DType>(req.dtype());
  if (!UpdateRule::SupportsDType(dt)) return;
  // The tensor broadcast with another size or dtype: its old partitions go.
  for (auto it = slots_.lower_bound({req.key(), 0});
       it != slots_.end() && it->first.first == req.key();) {
    const Slot& old = *it->second;
    if (old.total_count != req.total_count() || old.dtype != dt) {
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  std::shared_ptr<Slot>& slot = slots_[{req.key(), req.part()}];
  if (!slot || slot->dtype != dt || slot->count != req.count() ||
      slot->total_count != req.total_count() || slot->offset != req.offset() ||
      slot->name != req.name()) {
    slot = std::make_shared<Slot>();
    slot->name = req.name();
    slot->key = req.key();
    slot->part = req.part();
    slot->dtype = dt;
    slot->total_count = req.total_count();
    slot->offset = req.offset();
    slot->count = req.count();
  }
  slot->generation = req.round();
  absl::MutexLock lock(&slot->mu);
  slot->weight.assign(static_cast<const char*>(data), req.count() * DTypeSize(dt));
  slot->state.clear();
  slot->updates = 0;
}

absl::StatusOr<std::shared_ptr<OptimizerHost::Slot>> OptimizerHost::Find(
    const wire::DataRequest& req) {
  if (!UpdateRule::SupportsDType(static_cast<DType>(req.dtype()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push_pull of ", Where(req.name(), req.part()), ": its dtype is ",
        DTypeName(static_cast<DType>(req.dtype())), " but the servers' optimizer updates "
        "float32, float16 and bfloat16 weights only"));
  }
  const auto it = slots_.find({req.key(), req.part()});
  if (it == slots_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push_pull of ", Where(req.name(), req.part()), ": the servers hold no weights for "
        "it; with an optimizer set, Broadcast its initial weights before the first "
        "push_pull"));
  }
  const Slot& s = *it->second;
  if (s.dtype != static_cast<DType>(req.dtype()) || s.total_count != req.total_count() ||
      s.count != req.count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push_pull of ", Where(req.name(), req.part()), ": the gradient has ",
        req.total_count(), " ", DTypeName(static_cast<DType>(req.dtype())),
        " elements but the weights on the servers have ", s.total_count, " ",
        DTypeName(s.dtype)));
  }
  return it->second;
}

absl::StatusOr<OptimizerHost::Job> OptimizerHost::MakeJob(const wire::DataRequest& req,
                                                          void* grad) {
  if (!active()) return absl::FailedPreconditionError("no optimizer is set");
  auto slot = Find(req);
  if (!slot.ok()) return slot.status();
  Job job;
  job.rule = rule_;
  const auto m = spec_.multipliers().find(req.name());
  if (m != spec_.multipliers().end()) {
    job.lr_mult = m->second.lr_mult();
    job.wd_mult = m->second.wd_mult();
  }
  job.layer_adaptation = !optimizers::IsLarsExemptName(req.name());
  job.items.push_back(Job::Item{std::move(*slot), grad});
  return job;
}

absl::Status OptimizerHost::AddToJob(Job& job, const wire::DataRequest& req, void* grad) {
  auto slot = Find(req);
  if (!slot.ok()) return slot.status();
  job.items.push_back(Job::Item{std::move(*slot), grad});
  return absl::OkStatus();
}

absl::Status OptimizerHost::Run(const Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const UpdateRule& rule = *job.rule;
  // Items are in partition order and a slot is in at most one job at a time; the I/O
  // thread locks one slot at a time: no lock-order cycle.
  for (const Job::Item& it : job.items) it.slot->mu.Lock();
  std::vector<optimizers::Partition> parts;
  std::vector<std::vector<float*>> state_ptrs(job.items.size());
  absl::Status status;
  int64_t t = 0;
  for (size_t i = 0; i < job.items.size() && status.ok(); ++i) {
    Slot& s = *job.items[i].slot;
    const size_t nbuf = rule.Layout(s.dtype).num_buffers();
    for (size_t b = 0; b < nbuf; ++b) state_ptrs[i].push_back(nullptr);
    optimizers::Partition p = PartitionOf(s, job.items[i].grad);
    const bool fresh = s.state.size() != nbuf * s.count;
    if (fresh) s.state.assign(nbuf * s.count, 0.f);
    for (size_t b = 0; b < nbuf; ++b) state_ptrs[i][b] = s.state.data() + b * s.count;
    p.state = std::span<float* const>(state_ptrs[i]);
    if (fresh) status = rule.InitState(p);
    t = std::max(t, s.updates + 1);
    parts.push_back(p);
  }
  if (status.ok()) {
    optimizers::StepArgs args = rule.Step(t, t, job.lr_mult, job.wd_mult);
    args.layer_adaptation = job.layer_adaptation;
    optimizers::TensorNorms norms;
    if (rule.needs_tensor_norms()) {
      optimizers::NormPartials total;
      for (const optimizers::Partition& p : parts) {
        auto partial = rule.Prepare(p, args);
        if (!partial.ok()) {
          status = partial.status();
          break;
        }
        total += *partial;
      }
      norms = optimizers::FinishNorms(total);
    }
    for (size_t i = 0; i < parts.size() && status.ok(); ++i) {
      // The new weights also go over the summed gradient, which becomes the reply, in the
      // update's own pass.
      parts[i].weight_copy = job.items[i].grad;
      status = rule.Apply(parts[i], args, norms);
    }
  }
  for (const Job::Item& it : job.items) {
    Slot& s = *it.slot;
    if (status.ok()) s.updates = t;
    s.mu.Unlock();
  }
  if (!status.ok() && !job.items.empty()) {
    return absl::Status(status.code(), absl::StrCat("update of tensor '",
                                                    job.items[0].slot->name,
                                                    "': ", status.message()));
  }
  return status;
}

absl::Status OptimizerHost::Load(const wire::OptimizerLoad& load) {
  for (const wire::PartState& ps : load.parts()) {
    const std::string where = Where(ps.name(), ps.part());
    if (!IsValidDType(ps.dtype()) || !UpdateRule::SupportsDType(static_cast<DType>(ps.dtype()))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": weights of dtype ", ps.dtype(), " cannot be optimised"));
    }
    const DType dt = static_cast<DType>(ps.dtype());
    if (ps.count() > ps.total_count() || ps.offset() > ps.total_count() - ps.count() ||
        ps.weight().size() != ps.count() * DTypeSize(dt)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", ps.weight().size(), " weight bytes for ", ps.count(), " ",
          DTypeName(dt), " elements at offset ", ps.offset(), " of ", ps.total_count()));
    }
    if (ps.buffers_size() > 0) {
      if (!active()) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": optimizer state given but no optimizer is set"));
      }
      const optimizers::StateLayout layout = rule_->Layout(dt);
      if (!std::equal(ps.buffers().begin(), ps.buffers().end(), layout.buffers.begin(),
                      layout.buffers.end())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the saved state (", absl::StrJoin(ps.buffers(), ","),
            ") does not fit optimizer '", rule_->name(), "' (",
            absl::StrJoin(layout.buffers, ","), ")"));
      }
      if (ps.state().size() != layout.bytes(ps.count())) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", ps.state().size(),
                                                       " state bytes instead of ",
                                                       layout.bytes(ps.count())));
      }
    }
    if (ps.updates() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": negative update count ", ps.updates()));
    }
  }
  for (const wire::PartState& ps : load.parts()) {
    auto slot = std::make_shared<Slot>();
    slot->name = ps.name();
    slot->key = ps.key();
    slot->part = ps.part();
    slot->dtype = static_cast<DType>(ps.dtype());
    slot->total_count = ps.total_count();
    slot->offset = ps.offset();
    slot->count = ps.count();
    {
      absl::MutexLock lock(&slot->mu);
      slot->weight = ps.weight();
      slot->state.resize(ps.state().size() / sizeof(float));
      if (!ps.state().empty()) std::memcpy(slot->state.data(), ps.state().data(), ps.state().size());
      slot->updates = ps.updates();
    }
    slots_[{ps.key(), ps.part()}] = std::move(slot);
  }
  return absl::OkStatus();
}

void OptimizerHost::Dump(uint64_t from, size_t budget, wire::OptimizerResponse* out) {
  if (active()) *out->mutable_spec() = spec_;
  auto it = slots_.begin();
  uint64_t index = 0;
  for (; it != slots_.end() && index < from; ++it) ++index;
  size_t bytes = 0;
  for (; it != slots_.end() && (bytes < budget || out->parts_size() == 0); ++it, ++index) {
    Slot& s = *it->second;
    absl::MutexLock lock(&s.mu);
    wire::PartState* ps = out->add_parts();
    ps->set_name(s.name);
    ps->set_key(s.key);
    ps->set_part(s.part);
    ps->set_dtype(static_cast<uint32_t>(s.dtype));
    ps->set_total_count(s.total_count);
    ps->set_offset(s.offset);
    ps->set_count(s.count);
    ps->set_updates(s.updates);
    ps->set_generation(s.generation);
    ps->set_weight(s.weight);
    if (active() && !s.state.empty()) {
      for (const std::string& b : rule_->Layout(s.dtype).buffers) ps->add_buffers(b);
      ps->set_state(reinterpret_cast<const char*>(s.state.data()), s.state.size() * sizeof(float));
    }
    bytes += s.weight.size() + s.state.size() * sizeof(float);
  }
  out->set_next(index);
  out->set_more(it != slots_.end());
}

}  // namespace hybridps
