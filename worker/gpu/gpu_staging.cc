#include "worker/gpu/gpu_staging.h"

#include <pthread.h>
#include <sys/prctl.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/spin.h"
#include "common/status.h"

namespace hybridps {
namespace {

// While copies are in flight the stager's thread polls them without pause for kSpinFor
// after its last progress (an operation arrived or returned, a copy ended): a copy of a
// few MiB ends sooner than a sleeping thread wakes. Then it polls every kPollInterval.
// Without copies in flight it sleeps until woken (measurements: docs/design/gpu.md).
constexpr absl::Duration kPollInterval = absl::Microseconds(20);
constexpr absl::Duration kSpinFor = absl::Microseconds(500);

std::string DeviceOf(const TensorView& t) {
  return t.device == Device::kGPU ? absl::StrCat("on GPU ", t.device_id) : "in host memory";
}

}  // namespace

// ---- StagingCache ---------------------------------------------------------------------

StagingCache::~StagingCache() {
  for (auto& [name, list] : free_list_) {
    for (const Buffer& b : list) free_(b.data);
  }
}

absl::StatusOr<StagingCache::Buffer> StagingCache::Acquire(const std::string& name,
                                                           size_t bytes) {
  std::vector<Buffer>& list = free_list_[name];
  int best = -1;  // the smallest free buffer that is large enough
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].bytes >= bytes && (best < 0 || list[i].bytes < list[best].bytes)) {
      best = static_cast<int>(i);
    }
  }
  if (best >= 0) {
    Buffer b = list[best];
    list.erase(list.begin() + best);
    return b;
  }
  for (const Buffer& b : list) {
    free_(b.data);
    cached_bytes_ -= b.bytes;
  }
  list.clear();
  ASSIGN_OR_RETURN(void* data, alloc_(bytes));
  ++allocations_;
  cached_bytes_ += bytes;
  return Buffer{data, bytes};
}

void StagingCache::Release(const std::string& name, Buffer buffer) {
  free_list_[name].push_back(buffer);
}

// ---- GpuStager ------------------------------------------------------------------------

struct GpuStager::Op {
  std::string name;
  bool broadcast = false;
  int root = 0;
  int priority = 0;
  TensorView in, out;
  bool gpu = false;  // in and out on the GPU; else a CPU operation queued behind its name
  std::shared_ptr<HandleState> handle;
  // The loop holder (GpuStager::Turn).
  StagingCache::Buffer staging;
  bool has_staging = false;
  bool copying = false;  // a copy of `ticket` runs (into or out of `staging`)
  uint64_t ticket = 0;
  absl::Time copy_deadline;
  absl::Time copy_started;  // for the timeline
  DeviceCopier::Direction copy_direction = DeviceCopier::Direction::kToHost;
  bool handed = false;  // given to the backend
  bool counted = false;  // in gpu_unfinished_

  size_t bytes() const { return in.bytes(); }
  std::string Describe() const {
    return absl::StrCat(broadcast ? "broadcast" : "push_pull", " of '", name, "' (", in.count,
                        " ", DTypeName(in.dtype), " elements ", DeviceOf(in), ")");
  }
  absl::Status Annotate(absl::string_view step, const absl::Status& s) const {
    return absl::Status(s.code(), absl::StrCat(Describe(), ": ", step, ": ", s.message()));
  }
};

GpuStager::GpuStager(std::unique_ptr<DeviceCopier> copier, Backend backend, int num_workers,
                     absl::Duration op_timeout, bool waiting_threads_help,
                     absl::Duration wait_grace, Timeline* timeline)
    : copier_(std::move(copier)),
      timeline_(timeline),
      timeline_lane_(timeline ? timeline->AddLane("GPU staging: copies") : 0),
      backend_(std::move(backend)),
      num_workers_(num_workers),
      op_timeout_(op_timeout),
      wait_grace_(wait_grace),
      waiting_threads_help_(waiting_threads_help),
      cache_([this](size_t bytes) { return copier_->AllocHost(bytes); },
             [this](void* data) { copier_->FreeHost(data); }) {
  gate_->Open(this);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hps-gpu-stage");
    Loop();
  });
}

GpuStager::~GpuStager() {
  Shutdown();
  gate_->Close();  // after the helpers in progress returned
}

void GpuStager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock lock(&join_mu_);  // Shutdown may be called from several threads
  if (thread_.joinable()) thread_.join();
}

GpuStager::Stats GpuStager::stats() {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<Handle> GpuStager::PushPullAsync(absl::string_view name, TensorView in,
                                                TensorView out, int priority) {
  auto op = std::make_shared<Op>();
  op->gpu = in.device == Device::kGPU || out.device == Device::kGPU;
  if (op->gpu) {
    if (name.empty()) return absl::InvalidArgumentError("a tensor name must not be empty");
    if (in.device != out.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push_pull of '", name, "': the input is ", DeviceOf(in), " but the output ",
          DeviceOf(out), "; both must be GPU tensors or both CPU tensors"));
    }
    if (in.count != out.count || in.dtype != out.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push_pull of '", name, "': the GPU input holds ", in.count, " ", DTypeName(in.dtype),
          " elements, the GPU output ", out.count, " ", DTypeName(out.dtype)));
    }
    RETURN_IF_ERROR(CheckGpuTensor(name, in, "the input"));
    if (out.data != in.data) RETURN_IF_ERROR(CheckGpuTensor(name, out, "the output"));
  }
  op->name = std::string(name);
  op->in = in;
  op->out = out;
  op->priority = priority;
  return Submit(std::move(op));
}

absl::StatusOr<Handle> GpuStager::BroadcastAsync(absl::string_view name, TensorView tensor,
                                                 int root, int priority) {
  auto op = std::make_shared<Op>();
  op->gpu = tensor.device == Device::kGPU;
  if (op->gpu) {
    if (name.empty()) return absl::InvalidArgumentError("a tensor name must not be empty");
    if (root < 0 || root >= num_workers_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast of '", name, "': root rank ",
                                                     root, " is not a worker (there are ",
                                                     num_workers_, ")"));
    }
    RETURN_IF_ERROR(CheckGpuTensor(name, tensor, "the tensor"));
  }
  op->name = std::string(name);
  op->broadcast = true;
  op->root = root;
  op->in = op->out = tensor;
  op->priority = priority;
  return Submit(std::move(op));
}

absl::Status GpuStager::CheckGpuTensor(absl::string_view name, const TensorView& t,
                                       absl::string_view what) {
  const std::string where =
      absl::StrCat("tensor '", name, "': ", what, " (", DeviceOf(t), ")");
  if (absl::Status s = CheckTensorShape(t.shape, t.count); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  if (t.data == nullptr && t.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", t.count, " elements but no data"));
  }
  int device;
  {
    absl::MutexLock lock(&mu_);
    device = device_;
  }
  if (device < 0) {  // the first GPU tensor: its device becomes the worker's
    auto count = copier_->DeviceCount();
    if (!count.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": cannot stage it: ", count.status().message()));
    }
    if (t.device_id < 0 || t.device_id >= *count) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": this process sees ", *count, " CUDA device(s)"));
    }
    absl::MutexLock lock(&mu_);
    if (device_ < 0) device_ = t.device_id;
    device = device_;
  }
  if (t.device_id != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": this worker stages GPU tensors from GPU ", device,
        " (the device of its first GPU tensor); use one GPU per worker process"));
  }
  if (t.count > 0) {
    absl::Status s = copier_->CheckPointer(t.data, device);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Handle> GpuStager::Submit(OpPtr op) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::FailedPreconditionError("the store was shut down");
    if (!broken_.ok()) return broken_;
    if (op->gpu || pending_.contains(op->name)) {
      op->handle = std::make_shared<HandleState>();
      // Each step has its bound: the copy to the host (op_timeout), the backend's
      // operation (at most three op_timeouts, dist_allreduce's), the copy back.
      op->handle->SetDeadline(absl::Now() + 5 * op_timeout_ + wait_grace_, op->Describe());
      if (waiting_threads_help_) {
        WaitHelperGate<GpuStager>::Install(gate_, op->handle.get());
      }
      ++pending_[op->name];
      ++outstanding_;
      if (!op->gpu) ++stats_.queued_cpu_ops;
      incoming_.push_back(op);
      return Handle(op->handle);
    }
  }
  // A CPU operation with nothing of its name ahead of it here.
  return op->broadcast ? backend_.broadcast(op->name, op->in, op->root, op->priority)
                       : backend_.push_pull(op->name, op->in, op->out, op->priority);
}

void GpuStager::Loop() {
  // Timed waits below wake within a microsecond of their timeout, not the default 50.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  mu_.Lock();
  while (AwaitTurn(/*helper=*/false, nullptr)) {
    mu_.Unlock();
    Turn();
    mu_.Lock();
  }
  mu_.Unlock();
}

void GpuStager::HelpWith(HandleState* state) {
  mu_.Lock();
  ++helpers_;
  while (AwaitTurn(/*helper=*/true, state)) {
    mu_.Unlock();
    Turn();
    mu_.Lock();
  }
  --helpers_;  // the stager's thread takes over from the last helper
  mu_.Unlock();
}

bool GpuStager::AwaitTurn(bool helper, HandleState* state) {
  // Done: the helper's operation completed; the stager's thread at shutdown once every
  // operation finished.
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return helper ? state->DoneFast() : stopping_ && outstanding_ == 0;
  };
  // The stager's thread leaves the turns to the helpers while there are any.
  auto free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !loop_busy_ && (helper || helpers_ == 0);
  };
  auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !incoming_.empty() || !returned_.empty();
  };
  auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done() || (free() && (work() || copies_ > 0));
  };
  auto wake_on_work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done() || (free() && work());
  };
  // A helper gives up at its handle's deadline: Wait() then says that the store is stuck
  // (the stager's thread takes the steps over).
  const absl::Time give_up = helper ? state->wait_deadline() : absl::InfiniteFuture();
  for (;;) {
    if (done() || absl::Now() >= give_up) return false;
    if (free()) {
      // See kSpinFor: while copies are in flight, spinning takes a turn without waiting,
      // and past it a turn polls them every kPollInterval.
      if (work() || (copies_ > 0 && absl::Now() - last_progress_ <= kSpinFor)) break;
      if (copies_ > 0) {
        mu_.AwaitWithTimeout(absl::Condition(&wake_on_work), kPollInterval);
        if (done()) return false;
        if (free()) break;
        continue;
      }
    }
    // Without copies in flight: sleep until there is work (or the loop is free again).
    mu_.AwaitWithDeadline(absl::Condition(&wake), give_up);
  }
  loop_busy_ = true;
  if (helper) ++stats_.caller_turns;
  return true;
}

void GpuStager::Turn() {
  std::deque<OpPtr> incoming;
  std::vector<std::pair<OpPtr, absl::Status>> returned;
  size_t copies;
  {
    absl::MutexLock lock(&mu_);
    incoming.swap(incoming_);
    returned.swap(returned_);
    copies = copies_;
  }
  const bool arrived = !incoming.empty() || !returned.empty();
  for (const OpPtr& op : incoming) Accept(op);
  SubmitReady();
  for (const auto& [op, status] : returned) Returned(op, status);
  PollCopiesBack();
  const size_t now_copies = to_submit_.size() + copying_back_.size();
  const bool progress = arrived || now_copies != copies;
  {
    absl::MutexLock lock(&mu_);
    copies_ = now_copies;
    if (progress) last_progress_ = absl::Now();
    loop_busy_ = false;
  }
  if (!progress) CpuRelax();
}

void GpuStager::Accept(const OpPtr& op) {
  auto held = held_.find(op->name);
  if ((held != held_.end() && !held->second.empty()) ||
      (op->gpu && gpu_unfinished_.contains(op->name))) {
    held_[op->name].push_back(op);
    absl::MutexLock lock(&mu_);
    ++stats_.held_ops;
    return;
  }
  Stage(op);
}

void GpuStager::Stage(const OpPtr& op) {
  absl::Status broken;
  int device;
  {
    absl::MutexLock lock(&mu_);
    broken = broken_;
    device = device_;
  }
  if (!broken.ok()) return Finish(op, broken);
  if (op->gpu) {
    ++gpu_unfinished_[op->name];
    op->counted = true;
  }
  if (op->gpu && op->bytes() > 0) {
    if (!bound_) {
      absl::Status s = copier_->Bind(device);
      if (!s.ok()) return Fail(op, op->Annotate("starting the staging", s));
      bound_ = true;
    }
    auto buffer = cache_.Acquire(op->name, op->bytes());
    if (!buffer.ok()) {
      return Fail(op, op->Annotate(absl::StrCat("allocating ", op->bytes(),
                                                " bytes of pinned host memory"),
                                   buffer.status()));
    }
    op->staging = *buffer;
    op->has_staging = true;
    absl::Status s = StartCopy(op, DeviceCopier::Direction::kToHost, op->staging.data,
                               op->in.data);
    if (!s.ok()) return Fail(op, op->Annotate("copying to the host", s));
    {
      absl::MutexLock lock(&mu_);
      stats_.host_allocations = cache_.allocations();
      stats_.staging_bytes = cache_.cached_bytes();
    }
  }
  to_submit_.push_back(op);
}

bool GpuStager::CopyDone(const OpPtr& op, absl::string_view what, bool* failed) {
  auto done = copier_->Poll(op->ticket);
  if (!done.ok()) {
    op->copying = false;  // it ended, failing
    *failed = true;
    Fail(op, op->Annotate(what, done.status()));
    return false;
  }
  if (*done) {
    op->copying = false;
    if (Recording(timeline_)) {
      const bool to_host = op->copy_direction == DeviceCopier::Direction::kToHost;
      timeline_->Span(absl::StrCat("'", op->name, "'"),
                      to_host ? "device-to-host copy" : "host-to-device copy",
                      op->copy_started, absl::Now(), timeline_lane_,
                      absl::StrCat("\"bytes\": ", op->bytes()));
    }
    return true;
  }
  if (absl::Now() > op->copy_deadline) {
    *failed = true;
    Fail(op, absl::DeadlineExceededError(
                 absl::StrCat(op->Describe(), ": ", what, " did not finish within ",
                              absl::FormatDuration(op_timeout_), " (is the GPU hung?)")));
  }
  return false;
}

void GpuStager::SubmitReady() {
  while (!to_submit_.empty()) {
    OpPtr op = to_submit_.front();
    if (op->copying) {
      bool failed = false;
      if (!CopyDone(op, "copying to the host", &failed)) return;  // Fail emptied the queue
    }
    to_submit_.pop_front();
    SubmitToBackend(op);
  }
}

void GpuStager::SubmitToBackend(const OpPtr& op) {
  TensorView in = op->in, out = op->out;
  if (op->gpu) {  // the staging buffer, in place (nullptr for an empty tensor)
    in = out = TensorView{op->has_staging ? op->staging.data : nullptr, op->in.count,
                          op->in.dtype, Device::kCPU, 0, op->in.shape};
  }
  absl::StatusOr<Handle> h = op->broadcast
                                 ? backend_.broadcast(op->name, in, op->root, op->priority)
                                 : backend_.push_pull(op->name, in, out, op->priority);
  op->handed = true;
  {
    absl::MutexLock lock(&mu_);
    Unpend(op->name);  // after the backend has it: later ones of the name come after it
    if (op->gpu) ++stats_.gpu_ops;
  }
  if (!h.ok()) return Finish(op, h.status());
  h->OnComplete([this, op](const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    returned_.emplace_back(op, status);
  });
}

void GpuStager::Returned(const OpPtr& op, const absl::Status& status) {
  if (!status.ok() || !op->has_staging) return Finish(op, status);
  absl::Status s = StartCopy(op, DeviceCopier::Direction::kToDevice, op->out.data,
                             op->staging.data);
  if (!s.ok()) return Fail(op, op->Annotate("copying back to the GPU", s));
  copying_back_.push_back(op);
}

absl::Status GpuStager::StartCopy(const OpPtr& op, DeviceCopier::Direction direction,
                                  void* dst, const void* src) {
  ASSIGN_OR_RETURN(op->ticket, copier_->Start(direction, dst, src, op->bytes()));
  op->copying = true;
  op->copy_started = absl::Now();
  op->copy_direction = direction;
  op->copy_deadline = op->copy_started + op_timeout_;
  return absl::OkStatus();
}

void GpuStager::PollCopiesBack() {
  for (size_t i = 0; i < copying_back_.size();) {
    OpPtr op = copying_back_[i];
    bool failed = false;
    const bool done = CopyDone(op, "copying back to the GPU", &failed);
    if (!done && !failed) {
      ++i;
      continue;
    }
    copying_back_.erase(copying_back_.begin() + i);
    if (done) Finish(op, absl::OkStatus());
  }
}

void GpuStager::ReleaseHeld(const std::string& name) {
  auto it = held_.find(name);
  while (it != held_.end() && !it->second.empty()) {
    OpPtr op = it->second.front();
    if (op->gpu && gpu_unfinished_.contains(name)) return;
    it->second.pop_front();
    if (it->second.empty()) held_.erase(it);
    Stage(op);  // may finish ops (and erase entries): look the name up again
    it = held_.find(name);
  }
}

void GpuStager::Unpend(const std::string& name) {
  auto it = pending_.find(name);
  if (it != pending_.end() && --it->second == 0) pending_.erase(it);
}

void GpuStager::Finish(const OpPtr& op, absl::Status status) {
  if (op->has_staging) {
    if (op->copying) {
      cache_.Abandon(op->staging);  // the copy may still write into it
    } else {
      cache_.Release(op->name, op->staging);
    }
    op->has_staging = false;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!op->handed) Unpend(op->name);
    --outstanding_;
  }
  op->handle->Complete(std::move(status));
  if (op->counted) {
    op->counted = false;
    auto it = gpu_unfinished_.find(op->name);
    if (--it->second == 0) {
      gpu_unfinished_.erase(it);
      ReleaseHeld(op->name);
    }
  }
}

void GpuStager::Fail(const OpPtr& op, absl::Status status) {
  HPS_LOG(ERROR) << status.message();
  absl::Status broken;
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) {
      broken_ = absl::Status(status.code(),
                             absl::StrCat("GPU staging failed earlier: ", status.message()));
    }
    broken = broken_;
  }
  Finish(op, std::move(status));
  // What waits to be handed to the backend never will be: the rounds would not match.
  std::deque<OpPtr> queued;
  queued.swap(to_submit_);
  for (const OpPtr& q : queued) {
    if (q != op) Finish(q, broken);
  }
}

}  // namespace hybridps
