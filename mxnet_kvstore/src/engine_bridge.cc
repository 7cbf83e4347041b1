#include "mxnet_kvstore/src/engine_bridge.h"

#include <dlfcn.h>
#include <time.h>

#include <atomic>
#include <deque>
#include <stdexcept>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

// The two structs of MXNet's engine ABI an asynchronous operation meets (include/mxnet/
// engine.h and include/dmlc/logging.h of MXNet 1.x, unchanged since 1.0). Declared here
// so that nothing is compiled against MXNet's headers.
namespace dmlc {
struct Error : public std::runtime_error {
  explicit Error(const std::string& s) : std::runtime_error(s) {}
};
}  // namespace dmlc

namespace hybridps {
namespace mxnet_bridge {
namespace {

// mxnet::engine::CallbackOnComplete: copied by value; operator() calls
// callback(engine, param, error).
struct CallbackOnComplete {
  void (*callback)(void* engine, void* param, const dmlc::Error* error);
  void* engine;
  void* param;
  void operator()(const dmlc::Error* error = nullptr) const { callback(engine, param, error); }
};

// mxnet::Context {DeviceType dev_type; int32_t dev_id;} with kCPU = 1.
struct MxContext {
  int32_t dev_type;
  int32_t dev_id;
};
constexpr MxContext kCpuContext{1, 0};
// mxnet::FnProperty::kCPUPrioritized: the only CPU property whose operations go through
// the engine's priority queue (their own thread pool, MXNET_CPU_PRIORITY_NTHREADS).
constexpr int kCpuPrioritized = 3;

using EngineAsyncFunc = void (*)(void*, void*, void*);
using EngineFuncParamDeleter = void (*)(void*);
using PushAsyncNDFn = int (*)(EngineAsyncFunc, void*, EngineFuncParamDeleter, const void*,
                              void**, int, void**, int, const void*, int, const char*, bool);
using GetDataFn = int (*)(void*, void**);
using ShallowCopyFn = int (*)(void*, void**);
using FreeFn = int (*)(void*);
using GetLastErrorFn = const char* (*)();

struct Api {
  PushAsyncNDFn push_async_nd = nullptr;
  GetDataFn get_data = nullptr;
  ShallowCopyFn shallow_copy = nullptr;
  FreeFn free = nullptr;
  GetLastErrorFn last_error = nullptr;
};
std::atomic<const Api*> g_api{nullptr};
std::atomic<int64_t> g_pending{0};

std::string MxError(const Api& api) {
  const char* e = api.last_error ? api.last_error() : nullptr;
  return e ? std::string(e) : std::string("(no message)");
}

const char* KindName(OpKind kind) {
  switch (kind) {
    case OpKind::kPushPull:
      return "push_pull";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kMark:
      return "mark";
  }
  return "?";
}

// Calls the engine callbacks, off the store's threads (which may hold their locks while
// completing handles) and never inside an engine operation.
class Completer {
 public:
  static Completer& Get() {
    static Completer* c = new Completer();  // never destroyed: its thread lives to the end
    return *c;
  }
  void Add(CallbackOnComplete cb, absl::Status status, TimelineEvent event) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(Item{cb, std::move(status), std::move(event)});
  }
  void SetTimeline(bool on) {
    absl::MutexLock lock(&mu_);
    timeline_on_ = on;
    if (!on) timeline_.clear();
  }
  std::vector<TimelineEvent> TakeTimeline() {
    absl::MutexLock lock(&mu_);
    std::vector<TimelineEvent> out;
    out.swap(timeline_);
    return out;
  }

 private:
  struct Item {
    CallbackOnComplete cb;
    absl::Status status;
    TimelineEvent event;
  };
  Completer() {
    std::thread([this] { Loop(); }).detach();
  }
  void Loop() {
    pthread_setname_np(pthread_self(), "hps-mx-complete");
    for (;;) {
      Item item;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](std::deque<Item>* q) { return !q->empty(); }, &queue_));
        item = std::move(queue_.front());
        queue_.pop_front();
        if (timeline_on_) {
          item.event.end_ns = NowNs();
          timeline_.push_back(item.event);
        }
      }
      g_pending.fetch_sub(1, std::memory_order_relaxed);
      if (item.status.ok()) {
        item.cb();
      } else {
        dmlc::Error error(absl::StrCat("hybridps: ", item.status.message()));
        item.cb(&error);
      }
    }
  }

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool timeline_on_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<TimelineEvent> timeline_ ABSL_GUARDED_BY(mu_);
};

struct OpParam {
  std::shared_ptr<KVStore> store;
  OpSpec spec;  // input/output/order: our own shallow copies, freed by DeleteOpParam
};

void DeleteOpParam(void* p) {
  auto* op = static_cast<OpParam*>(p);
  const Api* api = g_api.load();
  if (op->spec.input) api->free(op->spec.input);
  if (op->spec.output) api->free(op->spec.output);
  if (op->spec.order) api->free(op->spec.order);
  delete op;
}

absl::StatusOr<void*> DataOf(const Api& api, void* handle, const OpSpec& spec) {
  void* data = nullptr;
  if (api.get_data(handle, &data) != 0) {
    return absl::InternalError(absl::StrCat(KindName(spec.kind), " of '", spec.name,
                                            "': cannot read the array's data: ",
                                            MxError(api)));
  }
  if (data == nullptr && spec.count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(KindName(spec.kind), " of '", spec.name,
                                                   "': the array has no data"));
  }
  return data;
}

absl::StatusOr<Handle> Start(const Api& api, const OpParam& op) {
  const OpSpec& spec = op.spec;
  if (spec.kind == OpKind::kMark) {
    auto done = std::make_shared<HandleState>();
    done->Complete(absl::OkStatus());
    return Handle(done);
  }
  auto out = DataOf(api, spec.output, spec);
  if (!out.ok()) return out.status();
  TensorView out_view{*out, spec.count, spec.dtype, Device::kCPU, 0, spec.shape};
  switch (spec.kind) {
    case OpKind::kBroadcast:
      return op.store->BroadcastAsync(spec.name, out_view, spec.root_rank, spec.priority);
    case OpKind::kPushPull: {
      TensorView in_view = out_view;
      if (spec.input) {
        auto in = DataOf(api, spec.input, spec);
        if (!in.ok()) return in.status();
        in_view.data = *in;
      }
      return op.store->PushPullAsync(spec.name, in_view, out_view, spec.priority);
    }
    case OpKind::kMark:
      break;
  }
  return absl::InternalError("unknown operation kind");
}

// The engine operation (EngineAsyncFunc): runs on an engine thread once the arrays are
// ready. Never throws; never blocks on the network.
void RunOp(void* /*run_context*/, void* on_complete, void* param) {
  CallbackOnComplete cb = *static_cast<CallbackOnComplete*>(on_complete);  // on the stack
  auto* op = static_cast<OpParam*>(param);
  const Api& api = *g_api.load();
  TimelineEvent event{op->spec.name, op->spec.kind, NowNs(), 0};
  absl::StatusOr<Handle> handle = absl::InternalError("not started");
  try {
    handle = Start(api, *op);
  } catch (const std::exception& e) {
    handle = absl::InternalError(absl::StrCat(KindName(op->spec.kind), " of '",
                                              op->spec.name, "': ", e.what()));
  }
  if (!handle.ok()) {
    Completer::Get().Add(cb, handle.status(), std::move(event));
    return;
  }
  handle->OnComplete([cb, event = std::move(event)](const absl::Status& status) {
    Completer::Get().Add(cb, status, event);
  });
}

}  // namespace

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

absl::Status Attach(const std::string& libmxnet_path) {
  if (g_api.load() != nullptr) return absl::OkStatus();
  void* lib = dlopen(libmxnet_path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "libmxnet.so is not loaded in this process (", libmxnet_path,
        "): import mxnet before hybridps.mxnet"));
  }
  auto api = std::make_unique<Api>();
  struct Sym {
    const char* name;
    void** slot;
  };
  const Sym syms[] = {
      {"MXEnginePushAsyncND", reinterpret_cast<void**>(&api->push_async_nd)},
      {"MXNDArrayGetData", reinterpret_cast<void**>(&api->get_data)},
      {"MXShallowCopyNDArray", reinterpret_cast<void**>(&api->shallow_copy)},
      {"MXNDArrayFree", reinterpret_cast<void**>(&api->free)},
      {"MXGetLastError", reinterpret_cast<void**>(&api->last_error)},
  };
  for (const Sym& s : syms) {
    *s.slot = dlsym(lib, s.name);
    if (*s.slot == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          libmxnet_path, " has no ", s.name, ": hybridps needs MXNet 1.6 or later (1.9.1 is "
          "tested)"));
    }
  }
  const Api* expected = nullptr;
  if (!g_api.compare_exchange_strong(expected, api.get())) return absl::OkStatus();
  api.release();  // lives as long as the process
  return absl::OkStatus();
}

bool Attached() { return g_api.load() != nullptr; }

void SetTimeline(bool on) { Completer::Get().SetTimeline(on); }
std::vector<TimelineEvent> TakeTimeline() { return Completer::Get().TakeTimeline(); }
int64_t Pending() { return g_pending.load(std::memory_order_relaxed); }

absl::Status Push(std::shared_ptr<KVStore> store, const OpSpec& spec) {
  const Api* api = g_api.load();
  if (api == nullptr) {
    return absl::FailedPreconditionError("the MXNet engine bridge is not attached");
  }
  if (spec.output == nullptr) return absl::InvalidArgumentError("no output array");
  auto op = std::make_unique<OpParam>();
  op->store = std::move(store);
  op->spec = spec;
  op->spec.input = op->spec.output = op->spec.order = nullptr;
  // Shallow copies (same memory and engine variable) keep the arrays alive while the op
  // waits in the engine, whatever Python does with its objects meanwhile.
  if (api->shallow_copy(spec.output, &op->spec.output) != 0) {
    return absl::InternalError(absl::StrCat("cannot reference the output array of '",
                                            spec.name, "': ", MxError(*api)));
  }
  if (spec.input && api->shallow_copy(spec.input, &op->spec.input) != 0) {
    api->free(op->spec.output);
    return absl::InternalError(absl::StrCat("cannot reference the input array of '",
                                            spec.name, "': ", MxError(*api)));
  }
  if (spec.order && spec.kind != OpKind::kMark &&
      api->shallow_copy(spec.order, &op->spec.order) != 0) {
    if (op->spec.input) api->free(op->spec.input);
    api->free(op->spec.output);
    return absl::InternalError(absl::StrCat("cannot reference the order array of '",
                                            spec.name, "': ", MxError(*api)));
  }
  void* const_nds[1] = {op->spec.input};
  void* mutable_nds[2] = {op->spec.output, op->spec.order};
  int num_const = op->spec.input ? 1 : 0;
  int num_mutable = op->spec.order ? 2 : 1;
  if (spec.kind == OpKind::kMark) {  // reads the array: waits for its writers only
    const_nds[0] = op->spec.output;
    num_const = 1;
    num_mutable = 0;
  }
  std::string op_name = absl::StrCat("hybridps_", KindName(spec.kind));
  g_pending.fetch_add(1, std::memory_order_relaxed);
  OpParam* raw = op.release();  // owned by the engine from here (DeleteOpParam)
  int rc = api->push_async_nd(&RunOp, raw, &DeleteOpParam, &kCpuContext, const_nds,
                              num_const, mutable_nds, num_mutable, &kCpuPrioritized,
                              spec.priority, op_name.c_str(), false);
  if (rc != 0) {
    // Whether the engine already released the parameter is unknown: leak it rather than
    // risk freeing it twice.
    g_pending.fetch_sub(1, std::memory_order_relaxed);
    return absl::InternalError(absl::StrCat("MXNet refused the ", KindName(spec.kind),
                                            " of '", spec.name, "': ", MxError(*api)));
  }
  return absl::OkStatus();
}

}  // namespace mxnet_bridge
}  // namespace hybridps
