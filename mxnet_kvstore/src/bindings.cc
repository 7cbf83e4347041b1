// _hybridps_core: the Python extension over the worker API (worker/kvstore.h) and the
// MXNet engine bridge. The Python package hybridps (mxnet_kvstore/hybridps/) is the
// user-facing side; this module is its private implementation.
//
// One store per process: joining a job is done once, so Store.open(type) returns the same
// store on every call (MXNet's kv.create makes a new Python object each time).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#if HYBRIDPS_WITH_NCCL
#include <nccl.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/options.h"
#include "common/version.h"
#include "mxnet_kvstore/src/engine_bridge.h"
#include "optimizers/lr_schedule.h"
#include "optimizers/update_rule.h"
#include "worker/kvstore.h"
#include "worker/process_set.h"

namespace py = pybind11;

namespace hybridps {
namespace {

// Raises the Python exception matching `status` (ValueError for bad arguments,
// TimeoutError for deadlines, NotImplementedError, else RuntimeError).
void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  std::string msg(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      throw py::value_error(msg);
    case absl::StatusCode::kDeadlineExceeded:
      PyErr_SetString(PyExc_TimeoutError, msg.c_str());
      throw py::error_already_set();
    case absl::StatusCode::kUnimplemented:
      PyErr_SetString(PyExc_NotImplementedError, msg.c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(msg);
  }
}

struct Global {
  absl::Mutex mu;
  std::shared_ptr<KVStore> store ABSL_GUARDED_BY(mu);
  std::string type ABSL_GUARDED_BY(mu);
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  std::string merge ABSL_GUARDED_BY(mu);  // Options::mxnet_merge of the job's environment
  Options options ABSL_GUARDED_BY(mu);    // the job's, which process sets derive theirs from
  // This worker's process sets by id (Horovod's add_process_set), shut down before the
  // store.
  std::map<int, std::shared_ptr<KVStore>> sets ABSL_GUARDED_BY(mu);
};
Global& G() {
  static Global* g = new Global();  // never destroyed: Python's atexit shuts the store down
  return *g;
}

// An LrSchedule from hybridps.mxnet.optimizer.schedule()'s dict (MXNet's field names).
optimizers::LrSchedule ScheduleFromDict(const py::dict& d) {
  optimizers::LrSchedule s;
  auto kind = optimizers::ParseLrScheduleKind(py::str(d["kind"]).cast<std::string>());
  ThrowIfError(kind.status());
  s.kind = *kind;
  auto get = [&d](const char* name, auto& field) {
    if (d.contains(name)) field = d[name].cast<std::decay_t<decltype(field)>>();
  };
  get("base_lr", s.base_lr);
  get("warmup_steps", s.warmup_steps);
  get("warmup_begin_lr", s.warmup_begin_lr);
  if (d.contains("warmup_mode")) {
    std::string mode = d["warmup_mode"].cast<std::string>();
    if (mode == "linear") {
      s.warmup_mode = optimizers::WarmupMode::kLinear;
    } else if (mode == "constant") {
      s.warmup_mode = optimizers::WarmupMode::kConstant;
    } else {
      throw py::value_error(absl::StrCat("unknown warmup_mode '", mode,
                                         "' (linear or constant)"));
    }
  }
  get("step", s.step);
  get("factor", s.factor);
  get("stop_factor_lr", s.stop_factor_lr);
  get("steps", s.steps);
  get("max_update", s.max_update);
  get("final_lr", s.final_lr);
  get("pwr", s.pwr);
  return s;
}

// Runs `fn` on the store without the GIL and raises its error.
template <typename Fn>
void CallReleased(Fn fn) {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = fn();
  }
  ThrowIfError(s);
}

// The Python object: a reference to the process's store, or to one of its process sets.
class PyStore {
 public:
  explicit PyStore(std::shared_ptr<KVStore> store) : store_(std::move(store)) {}

  static PyStore Open(const std::string& type) {
    Global& g = G();
    absl::MutexLock lock(&g.mu);
    if (g.store) {
      if (g.type != type) {
        throw py::value_error(absl::StrCat(
            "this process already joined the job with a '", g.type, "' store; it cannot also "
            "create '", type, "' (one store type per process)"));
      }
      return PyStore(g.store);
    }
    if (g.shut_down) {
      throw std::runtime_error(absl::StrCat(
          "the hybridps ", g.type, " store of this process was shut down; it cannot rejoin"));
    }
    absl::StatusOr<Options> options = OptionsFromEnvironment();
    ThrowIfError(options.status());
    if (options->scheduler_port == 0 && options->scheduler_endpoint.empty()) {
      throw std::runtime_error(absl::StrCat(
          "mx.kv.create('", type, "'): no hybridps job in this process's environment "
          "(HYBRIDPS_SCHEDULER_PORT is not set). Start the script through the launcher: "
          "scripts/hybridrun -np N [--servers M] -- python your_script.py"));
    }
    if (type == "dist_hybrid" && options->num_servers < 1) {
      throw std::runtime_error(
          "mx.kv.create('dist_hybrid'): this job has no servers (hybridrun --backend "
          "dist_allreduce starts none); launch with --backend dist_hybrid --servers M, or "
          "use mx.kv.create('dist_allreduce')");
    }
    absl::StatusOr<std::unique_ptr<KVStore>> store;
    {
      py::gil_scoped_release release;
      store = KVStore::Create(type, *options);
    }
    ThrowIfError(store.status());
    g.store = std::shared_ptr<KVStore>(std::move(*store));
    g.type = type;
    g.merge = options->mxnet_merge;
    g.options = *options;
    return PyStore(g.store);
  }

  static void ShutdownProcessStore() {
    std::shared_ptr<KVStore> store;
    std::map<int, std::shared_ptr<KVStore>> sets;
    {
      Global& g = G();
      absl::MutexLock lock(&g.mu);
      store = std::move(g.store);
      g.store.reset();
      sets.swap(g.sets);
      if (store) g.shut_down = true;
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      for (auto& [id, set] : sets) s.Update(set->Shutdown());
      if (store) s.Update(store->Shutdown());
    }
    ThrowIfError(s);
  }

  // Collective over the job's workers (see worker/process_set.h): the process set `id` of
  // `ranks`; None on a worker that is not one of them.
  std::optional<PyStore> AddProcessSet(const std::vector<int>& ranks, int id,
                                       const std::string& refusal) {
    Options options;
    {
      Global& g = G();
      absl::MutexLock lock(&g.mu);
      if (g.shut_down) {
        throw std::runtime_error("the store was shut down: it makes no more process sets");
      }
      if (g.store != store_) {
        throw py::value_error("process sets are made from the job's store only");
      }
      options = g.options;
    }
    absl::StatusOr<std::unique_ptr<KVStore>> set;
    {
      py::gil_scoped_release release;
      set = CreateProcessSet(*store_, options, ranks, id, refusal);
    }
    ThrowIfError(set.status());
    if (!*set) return std::nullopt;
    std::shared_ptr<KVStore> shared(std::move(*set));
    std::string refused;
    {
      Global& g = G();
      absl::MutexLock lock(&g.mu);
      if (g.shut_down) {
        refused = "the store was shut down while the set was being added";
      } else if (!g.sets.emplace(id, shared).second) {
        // hybridps.mxnet numbers its sets once each, so this is a caller's mistake.
        refused = absl::StrCat("process set ", id, " exists already");
      }
    }
    if (!refused.empty()) {
      CallReleased([&] { return shared->Shutdown(); });
      throw std::runtime_error(absl::StrCat("process set ", id, ": ", refused));
    }
    return PyStore(shared);
  }

  // Leaves process set `id` (a no-op when this worker is not in it or left it already).
  static void RemoveProcessSet(int id) {
    std::shared_ptr<KVStore> set;
    {
      Global& g = G();
      absl::MutexLock lock(&g.mu);
      auto it = g.sets.find(id);
      if (it == g.sets.end()) return;
      set = std::move(it->second);
      g.sets.erase(it);
    }
    CallReleased([&] { return set->Shutdown(); });
  }

  std::string type() const { return std::string(store_->type()); }
  int rank() const { return store_->rank(); }
  int num_workers() const { return store_->num_workers(); }
  int local_rank() const { return store_->local_rank(); }
  int local_size() const { return store_->local_size(); }
  int cross_rank() const { return store_->cross_rank(); }
  int cross_size() const { return store_->cross_size(); }
  bool optimizer_capable() const { return store_->IsCapable(Capability::kOptimizer); }
  // Where a pushpull of several device arrays sums them (HYBRIDPS_MXNET_MERGE).
  std::string merge() const {
    Global& g = G();
    absl::MutexLock lock(&g.mu);
    return g.merge;
  }

  void Barrier() {
    CallReleased([this] { return store_->Barrier(); });
  }

  void SetOptimizer(const std::string& rule, const std::map<std::string, double>& params,
                    const py::dict& schedule, bool multi_precision,
                    const std::map<std::string, std::pair<double, double>>& multipliers) {
    ServerOptimizer opt;
    opt.spec.rule = rule;
    opt.spec.params = params;
    opt.spec.schedule = ScheduleFromDict(schedule);
    opt.spec.multi_precision = multi_precision;
    for (const auto& [name, m] : multipliers) opt.multipliers[name] = {m.first, m.second};
    CallReleased([&] { return store_->SetOptimizer(opt); });
  }
  void SetOptimizerParam(const std::string& name, double value) {
    CallReleased([&] { return store_->SetOptimizerParam(name, value); });
  }
  void SetGradientCompression(const std::string& type, float threshold,
                              const std::string& name_prefix) {
    GradientCompression c;
    c.threshold = threshold;
    if (type == "2bit") {
      c.type = Compression::kTwoBit;
    } else if (type != "none") {
      throw py::value_error(absl::StrCat("unknown gradient compression '", type, "'"));
    }
    CallReleased([&] { return store_->SetGradientCompression(c, name_prefix); });
  }
  void StartTimeline(const std::string& path) {
    CallReleased([&] { return store_->StartTimeline(path); });
  }
  void StopTimeline() {
    CallReleased([&] { return store_->StopTimeline(); });
  }
  void SaveOptimizerStates(const std::string& path) {
    CallReleased([&] { return store_->SaveOptimizerStates(path); });
  }
  void LoadOptimizerStates(const std::string& path) {
    CallReleased([&] { return store_->LoadOptimizerStates(path); });
  }

  // Pushes an engine operation (see engine_bridge.h). Handles are NDArrayHandle values
  // (ctypes pointers as ints); input 0 means in place on the output; order 0: none.
  void Push(const std::string& kind, const std::string& name, uintptr_t input,
            uintptr_t output, size_t count, const std::string& dtype, int priority,
            int root_rank, uintptr_t order, const std::vector<int64_t>& shape) {
    mxnet_bridge::OpSpec spec;
    if (kind == "push_pull") {
      spec.kind = mxnet_bridge::OpKind::kPushPull;
    } else if (kind == "broadcast") {
      spec.kind = mxnet_bridge::OpKind::kBroadcast;
    } else if (kind == "mark") {
      spec.kind = mxnet_bridge::OpKind::kMark;
    } else {
      throw py::value_error(absl::StrCat("unknown operation kind '", kind, "'"));
    }
    absl::StatusOr<DType> dt = ParseDType(dtype);
    if (!dt.ok()) {
      throw py::value_error(absl::StrCat("tensor '", name, "': dtype ", dtype,
                                         " is not supported by hybridps (float32, float64, "
                                         "float16, int32, int64, uint8)"));
    }
    spec.name = name;
    spec.input = reinterpret_cast<void*>(input);
    spec.output = reinterpret_cast<void*>(output);
    spec.count = count;
    spec.shape = TensorShape::Of(shape.data(), shape.size());
    if (spec.shape.known() && spec.shape.elements() != count) {
      throw py::value_error(absl::StrCat("tensor '", name, "': shape ",
                                         spec.shape.ToString(), " does not hold ", count,
                                         " elements"));
    }
    spec.dtype = *dt;
    spec.priority = priority;
    spec.root_rank = root_rank;
    spec.order = reinterpret_cast<void*>(order);
    absl::Status s;
    {
      // NaiveEngine runs the operation inline and waits for its completion.
      py::gil_scoped_release release;
      s = mxnet_bridge::Push(store_, spec);
    }
    ThrowIfError(s);
  }

 private:
  std::shared_ptr<KVStore> store_;
};

}  // namespace
}  // namespace hybridps

PYBIND11_MODULE(_hybridps_core, m) {
  using hybridps::PyStore;
  namespace bridge = hybridps::mxnet_bridge;
  m.doc() = "hybridps worker API and MXNet engine bridge (private; use hybridps.mxnet)";
  m.attr("__version__") = hybridps::Version();
  // What this build has (its compile definitions): Horovod's *_built() answer from these.
#if HYBRIDPS_HAVE_GLOO
  m.attr("built_with_gloo") = true;
#else
  m.attr("built_with_gloo") = false;
#endif
#if HYBRIDPS_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
#if HYBRIDPS_WITH_NCCL
  m.attr("built_with_nccl") = true;
  m.attr("nccl_version") = static_cast<int>(NCCL_VERSION_CODE);  // the headers built with
#else
  m.attr("built_with_nccl") = false;
  m.attr("nccl_version") = 0;
#endif

  m.def("attach_mxnet", [](const std::string& path) {
    hybridps::ThrowIfError(bridge::Attach(path));
  }, py::arg("libmxnet_path"));
  m.def("set_timeline", &bridge::SetTimeline, py::arg("on"));
  m.def("take_timeline", [] {
    py::list out;
    for (const auto& e : bridge::TakeTimeline()) {
      const char* kind = e.kind == bridge::OpKind::kPushPull    ? "push_pull"
                         : e.kind == bridge::OpKind::kBroadcast ? "broadcast"
                                                                : "mark";
      out.append(py::make_tuple(e.name, kind, e.start_ns, e.end_ns));
    }
    return out;
  }, "Timeline events since the last call: (name, kind, start_ns, end_ns).");
  m.def("now_ns", &bridge::NowNs, "CLOCK_MONOTONIC in ns (the timeline's clock).");
  m.def("pending", &bridge::Pending, "Engine operations pushed and not yet completed.");
  m.def("known_rules", &hybridps::optimizers::KnownRules,
        "The optimizer rules the servers run (lower-case MXNet names).");
  m.def("rule_param_names", [](const std::string& rule) {
    return hybridps::optimizers::RuleParamNames(rule);
  }, py::arg("rule"), "The hyper-parameter names `rule` takes (MXNet's names).");
  m.def("shutdown", &PyStore::ShutdownProcessStore,
        "Leaves the job (the process's store, if any). Later operations fail.");

  py::class_<PyStore>(m, "Store")
      .def_static("open", &PyStore::Open, py::arg("type"),
                  "The process's store of `type`, joining the job on first use.")
      .def("add_process_set", &PyStore::AddProcessSet, py::arg("ranks"), py::arg("id"),
           py::arg("refusal") = "",
           "Collective: the process set `id` of the workers `ranks` (a dist_allreduce "
           "store over them), or None on the others; a non-empty `refusal` fails it on "
           "every worker.")
      .def_static("remove_process_set", &PyStore::RemoveProcessSet, py::arg("id"),
                  "Leaves process set `id` (nothing when this worker is not in it).")
      .def_property_readonly("type", &PyStore::type)
      .def_property_readonly("rank", &PyStore::rank)
      .def_property_readonly("num_workers", &PyStore::num_workers)
      .def_property_readonly("local_rank", &PyStore::local_rank)
      .def_property_readonly("local_size", &PyStore::local_size)
      .def_property_readonly("cross_rank", &PyStore::cross_rank)
      .def_property_readonly("cross_size", &PyStore::cross_size)
      .def_property_readonly("optimizer_capable", &PyStore::optimizer_capable)
      .def_property_readonly("merge", &PyStore::merge)
      .def("barrier", &PyStore::Barrier)
      .def("set_optimizer", &PyStore::SetOptimizer, py::arg("rule"), py::arg("params"),
           py::arg("schedule"), py::arg("multi_precision"), py::arg("multipliers"))
      .def("set_optimizer_param", &PyStore::SetOptimizerParam, py::arg("name"),
           py::arg("value"))
      .def("save_optimizer_states", &PyStore::SaveOptimizerStates, py::arg("path"))
      .def("set_gradient_compression", &PyStore::SetGradientCompression, py::arg("type"),
           py::arg("threshold"), py::arg("name_prefix") = "")
      .def("start_timeline", &PyStore::StartTimeline, py::arg("path"))
      .def("stop_timeline", &PyStore::StopTimeline)
      .def("load_optimizer_states", &PyStore::LoadOptimizerStates, py::arg("path"))
      .def("push", &PyStore::Push, py::arg("kind"), py::arg("name"), py::arg("input"),
           py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("priority") = 0,
           py::arg("root_rank") = 0, py::arg("order") = 0,
           py::arg("shape") = std::vector<int64_t>{});
}
