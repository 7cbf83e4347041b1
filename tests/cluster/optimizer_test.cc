// The server-side optimizer (KVStore::SetOptimizer) in in-process clusters: W workers
// pushing gradients to S servers that run the rule give the weights one process gets by
// applying the same rule (optimizers/ directly) to the summed gradients.
//
// Gradients and initial weights are small multiples of 1/64, so their sums are exact in
// every dtype whatever order the server adds them in: the rules that need no tensor norms
// must then agree to the last bit. LAMB and LARS run with their tensors split into several
// partitions against the rule applied to the whole tensor: their norms are sums in a
// different order, so the weights agree to 2 units in the last place of the dtype
// (float32 2.4e-7, float16 2e-3, bfloat16 1.6e-2 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "optimizers/update_rule.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/ps/ps_store.h"

namespace hybridps::testing {
namespace {

using optimizers::LrScheduleKind;
using optimizers::OptimizerSpec;

struct TensorDef {
  std::string name;
  DType dtype;
  size_t count;
  KeyMultipliers mult;
};

// The tensors of most tests: several partitions each at partition_bytes 512, a LARS-exempt
// bias, a tensor of a few bytes (its frames keep their bytes inline), multipliers.
std::vector<TensorDef> DefaultTensors() {
  return {{"dense.weight", DType::kFloat32, 1000, {0.5, 2.0}},
          {"emb.weight", DType::kFloat16, 700, {}},
          {"dense.bias", DType::kBFloat16, 333, {2.0, 0.0}},
          {"tiny", DType::kFloat32, 3, {}}};
}

double Grad(int rank, int step, size_t t, size_t i) {
  return static_cast<double>(
             static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13 +
                               static_cast<size_t>(step) * 5 + t * 3) % 17) - 8) / 64.0;
}

double Init(size_t t, size_t i) {
  return static_cast<double>(static_cast<int>((i * 11 + t * 5) % 23) - 11) / 16.0;
}

std::string Make(DType dt, size_t n, const std::function<double(size_t)>& f) {
  std::string b(n * DTypeSize(dt), '\0');
  for (size_t i = 0; i < n; ++i) SetElement(dt, b.data(), i, f(i));
  return b;
}

std::string SummedGrad(const TensorDef& d, size_t t, int workers, int step) {
  return Make(d.dtype, d.count, [&](size_t i) {
    double s = 0;
    for (int r = 0; r < workers; ++r) s += Grad(r, step, t, i);
    return s;
  });
}

// One process applying the rule to the summed gradients of one whole tensor.
class Reference {
 public:
  Reference(const OptimizerSpec& spec, const TensorDef& d, std::string weights)
      : def_(d), weight_(std::move(weights)) {
    Respec(spec);
    const size_t nbuf = rule_->Layout(d.dtype).num_buffers();
    state_.assign(nbuf * d.count, 0.f);
    for (size_t b = 0; b < nbuf; ++b) ptrs_.push_back(state_.data() + b * d.count);
    EXPECT_OK(rule_->InitState(Part(weight_.data())));  // (grad unused)
  }
  // A new spec with the same state layout (SetOptimizerParam).
  void Respec(const OptimizerSpec& spec) {
    auto rule = optimizers::MakeUpdateRule(spec);
    ASSERT_OK(rule);
    rule_ = std::move(*rule);
  }
  void Step(const std::string& grad) {
    ++t_;
    optimizers::StepArgs args = rule_->Step(t_, t_, def_.mult.lr_mult, def_.mult.wd_mult);
    args.layer_adaptation = !optimizers::IsLarsExemptName(def_.name);
    absl::Status s = rule_->Update(Part(grad.data()), args);
    ASSERT_OK(s);
  }
  const std::string& weights() const { return weight_; }

 private:
  optimizers::Partition Part(const void* grad) {
    optimizers::Partition p;
    p.weight = weight_.data();
    p.grad = grad;
    p.dtype = def_.dtype;
    p.count = def_.count;
    p.state = std::span<float* const>(ptrs_);
    return p;
  }
  TensorDef def_;
  std::string weight_;
  std::unique_ptr<optimizers::UpdateRule> rule_;
  std::vector<float> state_;
  std::vector<float*> ptrs_;
  int64_t t_ = 0;
};

// Relative tolerance of `ulps` units in the last place of `dt`; 0 ulps: bit-identical.
void ExpectWeights(const TensorDef& d, const std::string& got, const std::string& want,
                   int ulps, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  if (ulps == 0) {
    for (size_t i = 0; i < d.count; ++i) {
      const size_t es = DTypeSize(d.dtype);
      ASSERT_EQ(got.substr(i * es, es), want.substr(i * es, es))
          << where << " '" << d.name << "' element " << i << ": " << GetElement(d.dtype, got.data(), i)
          << " vs " << GetElement(d.dtype, want.data(), i);
    }
    return;
  }
  const double eps = d.dtype == DType::kFloat32   ? 1.2e-7
                     : d.dtype == DType::kFloat16 ? 9.8e-4
                                                  : 7.8e-3;
  for (size_t i = 0; i < d.count; ++i) {
    const double a = GetElement(d.dtype, got.data(), i);
    const double b = GetElement(d.dtype, want.data(), i);
    ASSERT_NEAR(a, b, ulps * eps * std::max(std::fabs(b), 1e-3))
        << where << " '" << d.name << "' element " << i;
  }
}

std::unique_ptr<LocalCluster> Start(int workers, int servers, size_t partition_bytes = 512,
                                    const std::string& transport = "inproc") {
  ClusterConfig c;
  c.transport = transport;
  c.workers = workers;
  c.servers = servers;
  c.partition_bytes = partition_bytes;
  auto cl = LocalCluster::Start(c);
  EXPECT_OK(cl);
  return cl.ok() ? std::move(*cl) : nullptr;
}

ServerOptimizer WithMultipliers(const OptimizerSpec& spec, const std::vector<TensorDef>& defs) {
  ServerOptimizer o;
  o.spec = spec;
  for (const TensorDef& d : defs) {
    if (d.mult.lr_mult != 1 || d.mult.wd_mult != 1) o.multipliers[d.name] = d.mult;
  }
  return o;
}

// Every worker broadcasts (root 0's initial weights win).
void BroadcastAll(LocalCluster* cl, const std::vector<TensorDef>& defs) {
  cl->RunOnWorkers([&](int rank, KVStore* kv) {
    for (size_t t = 0; t < defs.size(); ++t) {
      std::string w = Make(defs[t].dtype, defs[t].count,
                           [&](size_t i) { return rank == 0 ? Init(t, i) : 99.0; });
      ASSERT_OK(kv->Broadcast(defs[t].name, TensorView{w.data(), defs[t].count, defs[t].dtype},
                                0)
                      );
      EXPECT_EQ(w, Make(defs[t].dtype, defs[t].count, [&](size_t i) { return Init(t, i); }));
    }
  });
}

// Steps [first, first + n) on every worker; returns rank 0's weights after each step
// (result[step - first][tensor]); every worker must have received the same.
std::vector<std::vector<std::string>> Train(LocalCluster* cl, const std::vector<TensorDef>& defs,
                                            int first, int n) {
  const int workers = cl->num_workers();
  std::vector<std::vector<std::vector<std::string>>> got(workers);
  cl->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int step = first; step < first + n; ++step) {
      std::vector<std::string> grads, outs;
      std::vector<Handle> handles;
      for (size_t t = 0; t < defs.size(); ++t) {
        const TensorDef& d = defs[t];
        grads.push_back(Make(d.dtype, d.count, [&](size_t i) { return Grad(rank, step, t, i); }));
        outs.push_back(std::string(grads.back().size(), '\0'));
      }
      for (size_t t = 0; t < defs.size(); ++t) {
        const TensorDef& d = defs[t];
        TensorView in{grads[t].data(), d.count, d.dtype};
        // Half of the tensors in place (out aliases in).
        TensorView out = t % 2 == 0 ? in : TensorView{outs[t].data(), d.count, d.dtype};
        auto h = kv->PushPullAsync(d.name, in, out);
        ASSERT_OK(h);
        handles.push_back(*h);
      }
      for (Handle& h : handles) ASSERT_OK(h.Wait());
      for (size_t t = 0; t < defs.size(); ++t) {
        if (t % 2 == 0) outs[t] = grads[t];
      }
      got[rank].push_back(outs);
    }
  });
  for (int r = 1; r < workers; ++r) EXPECT_EQ(got[r], got[0]) << "worker " << r << " differs";
  return got[0];
}

// Trains `steps` steps from the broadcast initial weights and compares every step with
// Reference (which must start from the same spec and multipliers).
void TrainAndCompare(LocalCluster* cl, const std::vector<TensorDef>& defs,
                     const OptimizerSpec& spec, int steps, int ulps) {
  std::vector<Reference> refs;
  for (size_t t = 0; t < defs.size(); ++t) {
    refs.emplace_back(spec, defs[t], Make(defs[t].dtype, defs[t].count,
                                          [&](size_t i) { return Init(t, i); }));
  }
  const auto got = Train(cl, defs, 0, steps);
  for (int step = 0; step < steps; ++step) {
    for (size_t t = 0; t < defs.size(); ++t) {
      refs[t].Step(SummedGrad(defs[t], t, cl->num_workers(), step));
      ExpectWeights(defs[t], got[step][t], refs[t].weights(), ulps,
                    absl::StrCat(spec.rule, " step ", step));
    }
  }
}

struct RuleCase {
  std::string rule;
  std::map<std::string, double> params;
  bool multi_precision = true;
  LrScheduleKind schedule = LrScheduleKind::kNone;
  int ulps = 0;
  std::string transport = "inproc";  // tcp: received frames are ZeroMQ's, not copies
};

void PrintTo(const RuleCase& c, std::ostream* os) {
  *os << c.rule << (c.multi_precision ? " multi_precision" : "") << " over " << c.transport;
}

std::string CaseName(const ::testing::TestParamInfo<RuleCase>& info) {
  return absl::StrCat(info.param.rule, info.param.multi_precision ? "" : "_no_mp",
                      info.param.schedule == LrScheduleKind::kNone ? "" : "_scheduled", "_",
                      info.param.transport);
}

OptimizerSpec SpecOf(const RuleCase& c) {
  OptimizerSpec spec;
  spec.rule = c.rule;
  spec.params = c.params;
  spec.multi_precision = c.multi_precision;
  spec.schedule.kind = c.schedule;
  if (c.schedule == LrScheduleKind::kFactor) {
    spec.schedule.step = 2;
    spec.schedule.factor = 0.5;
    spec.schedule.base_lr = 0.01;
  }
  return spec;
}

class RuleTest : public ::testing::TestWithParam<RuleCase> {};

// 3 workers x 2 servers; weights broadcast before the optimizer is set (MXNet's Module
// order: init, then set_optimizer).
TEST_P(RuleTest, ClusterEqualsOneProcessOnSummedGradients) {
  const RuleCase& c = GetParam();
  const std::vector<TensorDef> defs = DefaultTensors();
  auto cl = Start(/*workers=*/3, /*servers=*/2, 512, c.transport);
  ASSERT_NE(cl, nullptr);
  ASSERT_TRUE(cl->worker(0)->IsCapable(Capability::kOptimizer));
  BroadcastAll(cl.get(), defs);
  const OptimizerSpec spec = SpecOf(c);
  cl->RunOnWorkers([&](int, KVStore* kv) {
    absl::Status s = kv->SetOptimizer(WithMultipliers(spec, defs));
    ASSERT_OK(s);
  });
  TrainAndCompare(cl.get(), defs, spec, /*steps=*/4, c.ulps);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, RuleTest,
    ::testing::Values(
        RuleCase{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}}},
        RuleCase{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}, /*multi_precision=*/false},
        RuleCase{"nag", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.001}}},
        RuleCase{"signum", {{"learning_rate", 0.01}, {"wd_lh", 0.01}}},
        RuleCase{"adam", {{"wd", 0.001}}, true, LrScheduleKind::kFactor},
        RuleCase{"adam", {{"wd", 0.001}}, true, LrScheduleKind::kFactor, 0, "tcp"},
        RuleCase{"adamw", {{"learning_rate", 0.01}, {"wd", 0.01}}},
        RuleCase{"adagrad", {{"learning_rate", 0.1}}},
        RuleCase{"rmsprop", {{"learning_rate", 0.01}, {"centered", 1}}},
        RuleCase{"lamb", {{"learning_rate", 0.01}, {"wd", 0.01}}, true, LrScheduleKind::kNone, 2},
        RuleCase{"lamb", {{"learning_rate", 0.01}}, true, LrScheduleKind::kNone, 2, "tcp"},
        RuleCase{"lars", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.001}}, true,
                 LrScheduleKind::kNone, 2}),
    CaseName);

// Partitions of 64 KiB and more are updated on the servers' engine threads (smaller ones
// on the I/O thread, as above).
TEST(OptimizerClusterTest, LargePartitionsEqualOneProcess) {
  const std::vector<TensorDef> defs = {{"conv.weight", DType::kFloat32, 100000, {0.5, 1.0}},
                                       {"emb.weight", DType::kFloat16, 70000, {}},
                                       {"fc.weight", DType::kBFloat16, 40000, {}}};
  auto cl = Start(2, 2, /*partition_bytes=*/256 << 10);
  ASSERT_NE(cl, nullptr);
  const OptimizerSpec spec = SpecOf(RuleCase{"adam", {{"wd", 0.01}}, true, LrScheduleKind::kFactor});
  cl->RunOnWorkers([&](int, KVStore* kv) {
    ASSERT_OK(kv->SetOptimizer(WithMultipliers(spec, defs)));
  });
  BroadcastAll(cl.get(), defs);
  TrainAndCompare(cl.get(), defs, spec, 3, 0);
}

// A tensor broadcast again with another size replaces all of its old partitions (changing
// the optimizer, which moves the weights, then still finds one consistent tensor).
TEST(OptimizerClusterTest, BroadcastWithAnotherSizeReplacesTheWeights) {
  auto cl = Start(2, 2);
  ASSERT_NE(cl, nullptr);
  OptimizerSpec spec;
  spec.rule = "adam";
  cl->RunOnWorkers([&](int, KVStore* kv) { ASSERT_OK(kv->SetOptimizer({spec, {}})); });
  BroadcastAll(cl.get(), {{"w", DType::kFloat32, 1000, {}}});  // 8 partitions
  const std::vector<TensorDef> defs = {{"w", DType::kFloat16, 100, {}}};
  BroadcastAll(cl.get(), defs);  // 1 partition
  spec.rule = "rmsprop";
  cl->RunOnWorkers([&](int, KVStore* kv) {
    absl::Status s = kv->SetOptimizer({spec, {}});
    ASSERT_OK(s);
  });
  TrainAndCompare(cl.get(), defs, spec, 2, 0);
}

OptimizerSpec Sgd(double lr) {
  OptimizerSpec spec;
  spec.rule = "sgd";
  spec.params = {{"learning_rate", lr}, {"momentum", 0.9}};
  spec.multi_precision = true;
  return spec;
}

// A job training DefaultTensors() (no multipliers) with `spec`, checking every step
// against Reference.
class CheckedJob {
 public:
  CheckedJob(int workers, int servers, const OptimizerSpec& spec)
      : workers_(workers), cluster_(Start(workers, servers)) {
    if (cluster_ == nullptr) return;
    for (TensorDef d : DefaultTensors()) {
      d.mult = {};
      defs_.push_back(d);
    }
    cluster_->RunOnWorkers([&](int, KVStore* kv) { ASSERT_OK(kv->SetOptimizer({spec, {}})); });
    BroadcastAll(cluster_.get(), defs_);
    for (size_t t = 0; t < defs_.size(); ++t) {
      refs_.emplace_back(spec, defs_[t], Make(defs_[t].dtype, defs_[t].count,
                                              [&](size_t i) { return Init(t, i); }));
    }
  }
  LocalCluster* cluster() { return cluster_.get(); }
  void Respec(const OptimizerSpec& spec) {
    for (Reference& r : refs_) r.Respec(spec);
  }
  void Step(int step) {
    const auto got = Train(cluster_.get(), defs_, step, 1);
    for (size_t t = 0; t < defs_.size(); ++t) {
      refs_[t].Step(SummedGrad(defs_[t], t, workers_, step));
      ExpectWeights(defs_[t], got[0][t], refs_[t].weights(), 0, absl::StrCat("step ", step));
    }
  }

 private:
  int workers_;
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<TensorDef> defs_;
  std::vector<Reference> refs_;
};

// A tensor far larger than a partition, 4 servers: LAMB and LARS keep all its partitions
// on one server and take the norms of the whole tensor.
TEST(OptimizerClusterTest, LambAndLarsSplitTensorEqualsWholeTensor) {
  for (const std::string rule : {"lamb", "lars"}) {
    SCOPED_TRACE(rule);
    const std::vector<TensorDef> defs = {{"big.weight", DType::kFloat32, 20000, {}}};
    auto cl = Start(2, 4, /*partition_bytes=*/4096);  // 20 partitions
    ASSERT_NE(cl, nullptr);
    OptimizerSpec spec;
    spec.rule = rule;
    spec.params = {{"learning_rate", 0.05}, {"wd", 0.01}};
    cl->RunOnWorkers([&](int, KVStore* kv) { ASSERT_OK(kv->SetOptimizer({spec, {}})); });
    BroadcastAll(cl.get(), defs);
    auto* ps = PsOf(cl->worker(0));
    ASSERT_NE(ps, nullptr);
    const std::vector<uint64_t> before = ps->PushesPerServer();
    TrainAndCompare(cl.get(), defs, spec, /*steps=*/3, /*ulps=*/2);
    const std::vector<uint64_t> after = ps->PushesPerServer();
    int servers_used = 0;
    for (size_t i = 0; i < after.size(); ++i) servers_used += after[i] > before[i] ? 1 : 0;
    EXPECT_EQ(servers_used, 1) << "the tensor's partitions went to several servers";
  }
}

TEST(OptimizerClusterTest, BadSpecFailsOnEveryWorkerAndChangesNothing) {
  CheckedJob job(3, 2, Sgd(0.1));
  LocalCluster* cl = job.cluster();
  ASSERT_NE(cl, nullptr);
  job.Step(0);
  struct Bad {
    OptimizerSpec spec;
    std::map<std::string, KeyMultipliers> mult;
    std::string expect;
  };
  std::vector<Bad> bad(4);
  bad[0].spec.rule = "nosuch";
  bad[0].expect = "unknown optimizer rule 'nosuch'";
  bad[1].spec = Sgd(std::nan(""));
  bad[1].expect = "learning_rate";
  bad[2].spec = Sgd(0.1);
  bad[2].spec.params["bogus"] = 1;
  bad[2].expect = "no hyper-parameter 'bogus'";
  bad[3].spec = Sgd(0.1);
  bad[3].mult["dense.weight"] = {-1, 1};
  bad[3].expect = "tensor 'dense.weight' has lr_mult = -1";
  for (const Bad& b : bad) {
    cl->RunOnWorkers([&](int rank, KVStore* kv) {
      absl::Status s = kv->SetOptimizer({b.spec, b.mult});
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "worker " << rank << ": " << s;
      EXPECT_NE(s.message().find(b.expect), std::string::npos) << "worker " << rank << ": " << s;
    });
  }
  // The running job is unaffected: same rule, same momentum state.
  job.Step(1);
  job.Step(2);
}

// A push_pull of `count` elements of `dt` (in place) fails with every one of `expect` in
// its message, leaving the tensor as it was.
void ExpectPushPullFails(KVStore* kv, const std::string& name, DType dt, size_t count,
                         const std::vector<std::string>& expect) {
  std::string g = Make(dt, count, [](size_t i) { return 1.0; });
  const std::string before = g;
  TensorView v{g.data(), count, dt};
  absl::Status s = kv->PushPull(name, v, v);
  EXPECT_FALSE(s.ok()) << "worker " << kv->rank();
  for (const std::string& e : expect) EXPECT_NE(s.message().find(e), std::string::npos) << s;
  EXPECT_EQ(g, before);
}

TEST(OptimizerClusterTest, PushPullWithoutWeightsFailsNamingTheTensor) {
  auto cl = Start(2, 2);
  ASSERT_NE(cl, nullptr);
  cl->RunOnWorkers([&](int, KVStore* kv) {
    ASSERT_OK(kv->SetOptimizer({Sgd(0.1), {}}));
    ExpectPushPullFails(kv, "ghost", DType::kFloat32, 100, {"'ghost'", "Broadcast"});
  });
  // A push_pull of a tensor whose weights have another dtype names both.
  BroadcastAll(cl.get(), {{"w", DType::kFloat32, 50, {}}});
  cl->RunOnWorkers([&](int, KVStore* kv) {
    ExpectPushPullFails(kv, "w", DType::kFloat16, 50, {"'w'", "float16", "float32"});
    ExpectPushPullFails(kv, "counts", DType::kInt32, 8, {"'counts'", "int32"});
  });
}

TEST(OptimizerClusterTest, SetOptimizerParamChangesTheLearningRate) {
  OptimizerSpec spec = Sgd(0.1);
  CheckedJob job(2, 2, spec);
  LocalCluster* cl = job.cluster();
  ASSERT_NE(cl, nullptr);
  job.Step(0);
  KVStore* kv0 = cl->worker(0);
  ASSERT_OK(kv0->SetOptimizerParam("learning_rate", 0.02));
  spec.params["learning_rate"] = 0.02;
  job.Respec(spec);
  job.Step(1);
  // Refused, changing nothing: unknown name, NaN, a change of the state kept.
  absl::Status s = kv0->SetOptimizerParam("bogus", 1);
  EXPECT_NE(s.message().find("'bogus'"), std::string::npos) << s;
  s = cl->worker(1)->SetOptimizerParam("wd", std::nan(""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'wd'"), std::string::npos) << s;
  s = kv0->SetOptimizerParam("momentum", 0);
  EXPECT_NE(s.message().find("SetOptimizer"), std::string::npos) << s;
  job.Step(2);
  ASSERT_OK(cl->worker(1)->SetOptimizerParam("wd", 0.5));
  spec.params["wd"] = 0.5;
  job.Respec(spec);
  job.Step(3);
}

// Save in a job with 3 servers, load into one with 1 server (and other partitions):
// the next steps give identical weights.
TEST(OptimizerClusterTest, SaveLoadIntoOtherServerCountContinuesIdentically) {
  const std::vector<TensorDef> defs = DefaultTensors();
  const std::string path = absl::StrCat(::testing::TempDir(), "/hps_opt_state_", getpid());
  for (const std::string rule : {"adam", "sgd"}) {
    SCOPED_TRACE(rule);
    OptimizerSpec spec = SpecOf(RuleCase{rule, {{"learning_rate", 0.01}, {"momentum", 0.9}},
                                         true, LrScheduleKind::kFactor});
    if (rule == "adam") spec.params.erase("momentum");
    std::vector<std::vector<std::string>> expected;
    {
      auto a = Start(2, 3, 512);
      ASSERT_NE(a, nullptr);
      a->RunOnWorkers([&](int, KVStore* kv) {
        ASSERT_OK(kv->SetOptimizer(WithMultipliers(spec, defs)));
      });
      BroadcastAll(a.get(), defs);
      Train(a.get(), defs, 0, 3);
      absl::Status s = a->worker(1)->SaveOptimizerStates(path);
      ASSERT_OK(s);
      expected = Train(a.get(), defs, 3, 2);
    }
    // A copy with one byte flipped in the middle (inside some tensor's weights or state):
    // refused on every worker, naming the file, and nothing changes.
    const std::string flipped = path + ".flipped";
    {
      std::ifstream in(path, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      ASSERT_GT(bytes.size(), 100u);
      bytes[bytes.size() / 2] ^= 0x10;
      std::ofstream(flipped, std::ios::binary) << bytes;
    }
    auto b = Start(2, 1, 1024);
    ASSERT_NE(b, nullptr);
    b->RunOnWorkers([&](int rank, KVStore* kv) {
      absl::Status bad = kv->LoadOptimizerStates(flipped);
      EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << "worker " << rank << bad;
      EXPECT_NE(bad.message().find(flipped), std::string::npos) << bad;
      EXPECT_NE(bad.message().find("checksum"), std::string::npos) << bad;
      absl::Status s = kv->LoadOptimizerStates(path);
      ASSERT_OK(s);
    });
    std::remove(flipped.c_str());
    const auto got = Train(b.get(), defs, 3, 2);
    for (int step = 0; step < 2; ++step) {
      for (size_t t = 0; t < defs.size(); ++t) {
        ExpectWeights(defs[t], got[step][t], expected[step][t], 0,
                      absl::StrCat("step ", 3 + step));
      }
    }
    std::remove(path.c_str());
  }
}

TEST(OptimizerClusterTest, LoadOfAMissingOrCorruptFileFailsOnEveryWorker) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/hps_opt_bad_", getpid());
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("HPSOPT02garbage", f);
    std::fclose(f);
  }
  auto cl = Start(2, 2);
  ASSERT_NE(cl, nullptr);
  cl->RunOnWorkers([&](int rank, KVStore* kv) {
    absl::Status s = kv->LoadOptimizerStates(path + ".missing");
    EXPECT_NE(s.message().find("cannot open"), std::string::npos) << "worker " << rank << s;
    s = kv->LoadOptimizerStates(path);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "worker " << rank << s;
  });
  EXPECT_EQ(cl->worker(0)->SaveOptimizerStates(path).code(),
            absl::StatusCode::kFailedPrecondition);
  std::remove(path.c_str());
}

#if HYBRIDPS_HAVE_GLOO
TEST(OptimizerClusterTest, AllreduceHasNoServerOptimizer) {
  ClusterConfig c;
  c.backend = "dist_allreduce";
  c.workers = 2;
  auto cl = LocalCluster::Start(c);
  ASSERT_OK(cl);
  KVStore* kv = (*cl)->worker(0);
  EXPECT_FALSE(kv->IsCapable(Capability::kOptimizer));
  absl::Status s = kv->SetOptimizer({Sgd(0.1), {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("dist_allreduce"), std::string::npos) << s;
}
#endif

}  // namespace
}  // namespace hybridps::testing
