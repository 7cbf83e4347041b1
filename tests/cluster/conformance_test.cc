// One conformance suite for every KVStore backend: the same tests, unchanged, against
// dist_hybrid (parameter server) and dist_allreduce (Gloo), over several transports and
// 1-4 workers, all in one process; and against dist_hybrid's GPU staging layer on a
// host-memory stand-in for the GPU ("staged": every tensor is taken as GPU memory). Exact
// sums over rounds in every dtype, sizes 0, 1, odd and large (and empty without data),
// many tensors in flight with mixed priorities and per-rank issue orders, in-place and
// out-of-place, broadcast from every root, and the failures users hit:
// mismatched operations (a named error on every rank) and a rank that never submits (a
// named error at the deadline).
#include "tests/cluster/conformance.h"

#include <gtest/gtest.h>

#if HYBRIDPS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hybridps::testing {
namespace {

TEST_P(ConformanceTest, ExactSumsOverRoundsInEveryDTypeAndSize) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  const std::vector<size_t> sizes = {0, 1, 7, 65, 1000, 4099, 100003};
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    struct T {
      std::string name;
      Buffer in, out;
      bool inplace;
    };
    std::vector<T> tensors;
    for (DType dt : kAllDTypes) {
      for (size_t size : sizes) {
        const bool inplace = tensors.size() % 2 == 0;
        tensors.push_back(T{absl::StrCat(DTypeName(dt), "/", size), Buffer(dt, size),
                            Buffer(dt, size), inplace});
      }
    }
    for (int round = 0; round < 3; ++round) {
      std::vector<Handle> handles;
      for (size_t t = 0; t < tensors.size(); ++t) {
        T& x = tensors[t];
        x.in.Fill(rank, round, static_cast<int>(t));
        auto h = kv->PushPullAsync(x.name, x.in.view(), x.inplace ? x.in.view() : x.out.view(),
                                   /*priority=*/static_cast<int>(t % 5) - 2);
        ASSERT_OK(h);
        handles.push_back(*h);
      }
      for (auto& h : handles) ASSERT_OK(h.Wait());
      for (size_t t = 0; t < tensors.size(); ++t) {
        T& x = tensors[t];
        const Buffer& result = x.inplace ? x.in : x.out;
        for (size_t i = 0; i < x.in.count; ++i) {
          ASSERT_EQ(result.at(i), Sum(i, n(), round, static_cast<int>(t)))
              << x.name << " element " << i << " round " << round;
        }
        for (size_t i = 0; !x.inplace && i < x.in.count; ++i) {  // the input is untouched
          ASSERT_EQ(x.in.at(i), Value(i, rank, round, static_cast<int>(t))) << x.name;
        }
      }
    }
  });
}

TEST_P(ConformanceTest, LargeTensorsInPlaceAndOutOfPlace) {
  ClusterConfig c = Config();
  c.partition_bytes = 4 << 20;
  auto cluster = Start(c);
  ASSERT_NE(cluster, nullptr);
  const size_t count = (10 << 20) / 4 + 3;  // 10 MiB and an odd tail
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer a(DType::kFloat32, count), out(DType::kFloat32, count);
    for (int round = 0; round < 2; ++round) {
      a.Fill(rank, round, 1);
      const bool inplace = round == 0;
      ASSERT_TRUE(kv->PushPull("big", a.view(), inplace ? a.view() : out.view()).ok());
      const Buffer& result = inplace ? a : out;
      for (size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(result.at(i), Sum(i, n(), round, 1)) << i;
      }
      ASSERT_EQ(result.at(count - 1), Sum(count - 1, n(), round, 1));
    }
  });
}

// Each rank issues the same tensors in its own order, with mixed priorities; some names
// get two operations in a row (they must run in issue order).
TEST_P(ConformanceTest, ManyTensorsInFlightInPerRankOrders) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  constexpr int kTensors = 60;
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<Buffer> bufs;
    for (int i = 0; i < kTensors; ++i) {
      const size_t size = static_cast<size_t>((i * 7919) % 5000 + (i % 3 == 0 ? 20000 : 0));
      bufs.emplace_back(i % 2 ? DType::kFloat32 : DType::kInt32, size);
    }
    std::vector<int> order(kTensors);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(1000 + rank));
    std::vector<std::pair<int, Handle>> handles, again;
    for (int i : order) {
      bufs[i].Fill(rank, 0, i);
      auto h = kv->PushPullAsync(absl::StrCat("t", i), bufs[i].view(), bufs[i].view(),
                                 /*priority=*/(i * 31) % 7 - 3);
      ASSERT_OK(h);
      handles.emplace_back(i, *h);
      if (i % 10 == 0) {
        // A second push_pull of the same tensor, in place, with a higher priority: it must
        // still run after the first (the result is then n times the sum).
        auto h2 = kv->PushPullAsync(absl::StrCat("t", i), bufs[i].view(), bufs[i].view(), 5);
        ASSERT_OK(h2);
        again.emplace_back(i, *h2);
      }
    }
    for (auto& [i, h] : handles) ASSERT_OK(h.Wait()) << "t" << i;
    for (auto& [i, h] : again) ASSERT_OK(h.Wait()) << "t" << i;
    for (int i = 0; i < kTensors; ++i) {
      const double times = i % 10 == 0 ? n() : 1;
      for (size_t k = 0; k < bufs[i].count; k += 13) {
        ASSERT_EQ(bufs[i].at(k), times * Sum(k, n(), 0, i)) << "t" << i << " element " << k;
      }
    }
    ASSERT_OK(kv->Barrier());
  });
}

TEST_P(ConformanceTest, BroadcastFromEveryRootInEveryDType) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    for (int root = 0; root < n(); ++root) {
      std::vector<Buffer> bufs;
      std::vector<Handle> handles;
      int salt = 0;
      for (DType dt : kAllDTypes) {
        for (size_t size : {size_t{0}, size_t{1}, size_t{333}, size_t{70001}}) {
          bufs.emplace_back(dt, size);
        }
      }
      for (Buffer& b : bufs) {
        b.Fill(rank, root, salt);
        auto h = kv->BroadcastAsync(absl::StrCat("w", salt), b.view(), root, salt % 3);
        ASSERT_OK(h);
        handles.push_back(*h);
        ++salt;
      }
      for (auto& h : handles) ASSERT_OK(h.Wait());
      for (size_t t = 0; t < bufs.size(); ++t) {
        for (size_t i = 0; i < bufs[t].count; i += 7) {
          ASSERT_EQ(bufs[t].at(i), Value(i, root, root, static_cast<int>(t)))
              << "root " << root << " tensor " << t << " element " << i;
        }
      }
    }
    // A broadcast and a push_pull on one name keep their order (the node's GPU reduction
    // refuses them in flight together instead: node_gpu_reduce_test.cc).
    if (GetParam().node_gpu) return;
    Buffer x(DType::kFloat32, 100);
    x.Fill(rank, 0, 3);
    auto hb = kv->BroadcastAsync("mixed", x.view(), n() - 1);
    auto hp = kv->PushPullAsync("mixed", x.view(), x.view());
    ASSERT_TRUE(hb.ok() && hp.ok());
    ASSERT_OK(hb->Wait());
    ASSERT_OK(hp->Wait());
    for (size_t i = 0; i < x.count; ++i) ASSERT_EQ(x.at(i), n() * Value(i, n() - 1, 0, 3));
    EXPECT_FALSE(kv->IsCapable(Capability::kOptimizer) && GetParam().backend == "dist_allreduce");
  });
}

// An empty tensor may come without a data pointer; it still takes part in every round.
TEST_P(ConformanceTest, EmptyTensorsWithoutDataTakePart) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    const TensorView none{nullptr, 0, DType::kFloat32};
    for (int round = 0; round < 2; ++round) {
      for (int root = 0; root < n(); ++root) {
        absl::Status s = kv->Broadcast("empty", none, root);
        ASSERT_OK(s) << "broadcast from " << root;
      }
      absl::Status s = kv->PushPull("empty", none, none);
      ASSERT_OK(s) << "push_pull: " << s;
    }
    // The name still works with data afterwards.
    Buffer b(DType::kFloat32, 5);
    b.Fill(rank, 0, 9);
    ASSERT_OK(kv->PushPull("after-empty", b.view(), b.view()));
    for (size_t i = 0; i < b.count; ++i) ASSERT_EQ(b.at(i), Sum(i, n(), 0, 9));
  });
}

// Arguments one worker can tell are wrong fail at once, on that worker, with an
// InvalidArgument naming the tensor and what is wrong; the job goes on.
TEST_P(ConformanceTest, BadArgumentsFailAtSubmissionNamingTheTensor) {
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer a(DType::kFloat32, 10), b(DType::kFloat32, 12), c(DType::kInt32, 10);
    auto refused = [&](const char* what, absl::StatusOr<Handle> h,
                       std::vector<std::string> words) {
      ASSERT_FALSE(h.ok()) << what << ": accepted";
      EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << what << ": "
                                                                       << h.status();
      words.push_back("'bad-");
      for (const std::string& w : words) EXPECT_TRUE(Mentions(h.status().message(), w)) << what;
    };
    refused("root -1", kv->BroadcastAsync("bad-root", a.view(), -1), {"-1"});
    refused("root n", kv->BroadcastAsync("bad-root", a.view(), n()), {absl::StrCat(n())});
    refused("counts", kv->PushPullAsync("bad-count", a.view(), b.view()), {"10", "12"});
    refused("dtypes", kv->PushPullAsync("bad-dtype", a.view(), c.view()),
            {"float32", "int32"});
    refused("no data", kv->PushPullAsync("bad-data", TensorView{nullptr, 4, DType::kFloat32},
                                         a.view()), {"4"});
    TensorView misshapen = a.view();  // a shape that does not hold the view's count
    const int64_t dims[] = {2, 3};
    misshapen.shape = TensorShape::Of(dims, 2);
    refused("shape", kv->PushPullAsync("bad-shape", misshapen, misshapen),
            {"(2, 3)", absl::StrCat(a.count)});
    refused("broadcast shape", kv->BroadcastAsync("bad-shape", misshapen, 0), {"(2, 3)"});
    misshapen.shape.ndim = kMaxShapeDims + 1;
    refused("dimensions", kv->PushPullAsync("bad-shape", misshapen, misshapen),
            {"dimensions"});
    // Nothing of it reached the job: the names still work.
    a.Fill(rank, 0, 3);
    absl::Status s = kv->PushPull("bad-count", a.view(), a.view());
    ASSERT_OK(s);
    for (size_t i = 0; i < a.count; ++i) ASSERT_EQ(a.at(i), Sum(i, n(), 0, 3));
  });
}

TEST_P(MultiWorkerTest, RankThatNeverSubmitsFailsTheOthersAtTheDeadline) {
  ClusterConfig c = Config();
  c.op_timeout = absl::Milliseconds(1500);
  c.stall_warning = absl::Milliseconds(500);
  auto cluster = Start(c);
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::Status> status(n());
  std::vector<absl::Duration> took(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == n() - 1) return;  // the last rank never submits
    Buffer b(DType::kFloat32, 10);
    const absl::Time start = absl::Now();
    status[rank] = kv->PushPull("lonely", b.view(), b.view());
    took[rank] = absl::Now() - start;
  });
  for (int rank = 0; rank + 1 < n(); ++rank) {
    const absl::Status& s = status[rank];
    ASSERT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(Mentions(s.message(), "'lonely'"));
    EXPECT_GE(took[rank], absl::Milliseconds(1400)) << s;  // not before the deadline
    EXPECT_LT(took[rank], absl::Milliseconds(3500)) << s;
    if (GetParam().backend == "dist_allreduce") {
      EXPECT_TRUE(Mentions(s.message(), absl::StrCat("rank ", n() - 1, " never submitted")));
    }
  }
}

// A worker that leaves the job (its store shut down, as when its process ends early):
// the others' operations that need it fail soon, naming it, instead of waiting for the
// deadline.
TEST_P(MultiWorkerTest, WorkerThatLeavesFailsTheOthersNamingIt) {
  auto cluster = Start(Config());  // op_timeout 60 s
  ASSERT_NE(cluster, nullptr);
  const int gone = n() - 1;
  cluster->Leave(gone);
  std::vector<absl::Status> status(n());
  std::vector<absl::Duration> took(n());
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    if (rank == gone) return;
    Buffer b(DType::kFloat32, 1000);
    b.Fill(rank, 0, 1);
    const absl::Time start = absl::Now();
    status[rank] = kv->PushPull("after-leave", b.view(), b.view());
    took[rank] = absl::Now() - start;
    // Nor can a barrier complete without it.
    const absl::Time barrier_start = absl::Now();
    absl::Status barrier = kv->Barrier();
    EXPECT_FALSE(barrier.ok()) << "worker " << rank;
    EXPECT_LT(absl::Now() - barrier_start, absl::Seconds(10)) << barrier;
    EXPECT_TRUE(Mentions(barrier.message(), absl::StrCat(" ", gone))) << barrier;
  });
  for (int rank = 0; rank < gone; ++rank) {
    const absl::Status& s = status[rank];
    EXPECT_FALSE(s.ok()) << "worker " << rank;
    EXPECT_LT(took[rank], absl::Seconds(10)) << s;
    // "worker 2 (host h, pid p) left the job" / "rank 2 left the job"
    EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("worker ", gone)) ||
                absl::StrContains(s.message(), absl::StrCat("rank ", gone)))
        << s;
    EXPECT_TRUE(Mentions(s.message(), "'after-leave'"));
    std::printf("  worker %d after %s: %s\n", rank, absl::FormatDuration(took[rank]).c_str(),
                s.ToString().c_str());
  }
}

// Where GPU tensors cannot be reduced: dist_hybrid (CPU only), dist_allreduce built
// without CUDA/NCCL (Unimplemented), and dist_allreduce with NCCL but no GPU on rank 0
// (FailedPrecondition). With a GPU, dist_allreduce takes them: tests/gpu.
TEST_P(ConformanceTest, GpuTensorsAreAClearError) {
  if (GetParam().staged) GTEST_SKIP() << "the staged stores take every tensor as GPU memory";
  // dist_allreduce with NCCL: no GPU on rank 0 means no communicator. dist_hybrid with
  // CUDA: no device to stage from. Without CUDA: no GPU support at all.
  bool nccl = false, staging = false;
#if HYBRIDPS_WITH_NCCL
  nccl = GetParam().backend == "dist_allreduce";
#endif
#if HYBRIDPS_WITH_CUDA
  staging = GetParam().backend == "dist_hybrid";
  int devices = 0;
  if ((nccl || staging) && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    GTEST_SKIP() << "a GPU is visible: " << GetParam().backend
                 << " handles GPU tensors (tests/gpu)";
  }
#endif
  auto cluster = Start(Config());
  ASSERT_NE(cluster, nullptr);
  float x[4] = {};
  TensorView gpu{x, 4, DType::kFloat32, Device::kGPU, 0};
  auto h = cluster->worker(0)->PushPullAsync("gpu", gpu, gpu);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), nccl || staging ? absl::StatusCode::kFailedPrecondition
                                               : absl::StatusCode::kUnimplemented)
      << h.status();
  EXPECT_TRUE(Mentions(h.status().message(), "'gpu'"));
  if (nccl) {
    EXPECT_TRUE(Mentions(h.status().message(), "rank 0 has no GPU"));
  }
  if (staging) {
    EXPECT_TRUE(Mentions(h.status().message(), "cudaGetDeviceCount"));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest, ::testing::ValuesIn(Params()), Name);

std::vector<Param> MultiWorkerParams() {
  std::vector<Param> p;
  for (const Param& q : Params()) {
    if (q.workers >= 2) p.push_back(q);
  }
  return p;
}

INSTANTIATE_TEST_SUITE_P(Backends, MultiWorkerTest, ::testing::ValuesIn(MultiWorkerParams()),
                         Name);

}  // namespace

std::vector<Param> Params() {
  std::vector<Param> p = {{"dist_hybrid", "inproc", 1, 1}, {"dist_hybrid", "inproc", 2, 2},
                          {"dist_hybrid", "inproc", 3, 2}, {"dist_hybrid", "inproc", 4, 3},
                          {"dist_hybrid", "tcp", 2, 2},    {"dist_hybrid", "tcp", 4, 2}};
  // Nodes of several local ranks: 1-3 nodes of 2-4 local ranks.
  for (auto [transport, workers, servers, local] :
       {std::tuple{"inproc", 2, 1, 2}, std::tuple{"inproc", 4, 2, 2},
        std::tuple{"tcp", 6, 2, 2}, std::tuple{"inproc", 3, 1, 3},
        std::tuple{"ipc", 6, 2, 3}, std::tuple{"inproc", 4, 1, 4},
        std::tuple{"tcp", 8, 2, 4}}) {
    p.push_back({"dist_hybrid", transport, workers, servers, local});
  }
#if HYBRIDPS_HAVE_GLOO
  for (int w = 1; w <= 4; ++w) p.push_back({"dist_allreduce", "inproc", w, 0});
  p.push_back({"dist_allreduce", "tcp", 2, 0});
  p.push_back({"dist_allreduce", "tcp", 3, 0});
  // No fusion, and only the executor thread runs the rounds (HYBRIDPS_CALLER_ROUNDS=0).
  p.push_back({"dist_allreduce", "inproc", 3, 0, 1, false, true, "nofusion_noCaller",
               [](ClusterConfig* c) {
                 c->fusion_bytes = 0;
                 c->caller_rounds = 0;
               }});
  // Every worker on one host (one node): CPU allreduces in shared memory; and two nodes
  // of two, where they go through Gloo.
  for (auto [transport, workers, local] :
       {std::tuple{"inproc", 2, 2}, std::tuple{"inproc", 3, 3}, std::tuple{"tcp", 4, 4},
        std::tuple{"inproc", 4, 2}}) {
    p.push_back({"dist_allreduce", transport, workers, 0, local});
  }
  // Hierarchical (HYBRIDPS_HIERARCHICAL_ALLREDUCE): 2 nodes of 2 and of 3 local ranks sum
  // in shared memory, their local ranks 0 over Gloo (the ring); 3 nodes of 2 and of 1,
  // whose leaders allreduce directly (GlooComm::AllreduceDirect).
  for (auto [transport, workers, local] :
       {std::tuple{"inproc", 4, 2}, std::tuple{"tcp", 6, 3}, std::tuple{"inproc", 6, 2},
        std::tuple{"tcp", 3, 1}}) {
    p.push_back({"dist_allreduce", transport, workers, 0, local, false, true, "hier",
                 [](ClusterConfig* c) {
                   c->worker_options = [](int, Options* o) { o->hierarchical_allreduce = 1; };
                 }});
  }
  // Two-shots (HYBRIDPS_TWO_SHOT_BYTES) from 4 KiB up, the eager path below.
  p.push_back({"dist_allreduce", "tcp", 2, 0, 1, false, true, "twoshot",
               [](ClusterConfig* c) {
                 c->worker_options = [](int, Options* o) {
                   o->eager_bytes = 4096;
                   o->two_shot_bytes = 8 << 20;
                 };
               }});
#endif
  // Every tensor of a node on the reducer thread (HYBRIDPS_LOCAL_INLINE_BYTES=0), and
  // every one on the I/O thread, with wire chunks of 4 KiB.
  p.push_back({"dist_hybrid", "inproc", 4, 2, 2, false, true, "threaded",
               [](ClusterConfig* c) { c->local_inline_bytes = 0; }});
  p.push_back({"dist_hybrid", "tcp", 6, 2, 3, false, true, "inline_chunks4k",
               [](ClusterConfig* c) {
                 c->local_inline_bytes = size_t{1} << 30;
                 c->wire_chunk_bytes = 4096;
               }});
  // Through the GPU staging layer (stand-in GPU): one worker, several, nodes of 2 and 3.
  for (auto [transport, workers, servers, local] :
       {std::tuple{"inproc", 1, 1, 1}, std::tuple{"inproc", 3, 2, 1},
        std::tuple{"tcp", 4, 2, 1}, std::tuple{"inproc", 4, 2, 2},
        std::tuple{"ipc", 6, 2, 3}}) {
    p.push_back({"dist_hybrid", transport, workers, servers, local, /*staged=*/true});
  }
  // Push_pulls through the node's GPU reduction (HYBRIDPS_GPU_LOCAL_REDUCE=nccl), on
  // stand-ins for CUDA and NCCL: nodes of 2 and of 3.
  p.push_back({"dist_hybrid", "inproc", 4, 2, 2, /*staged=*/true, true, "", nullptr, true});
  p.push_back({"dist_hybrid", "tcp", 6, 2, 3, /*staged=*/true, true, "", nullptr, true});
  // Only the stager's own thread runs the staging steps (HYBRIDPS_CALLER_ROUNDS=0).
  p.push_back({"dist_hybrid", "inproc", 3, 2, 1, /*staged=*/true, /*helpers=*/false});
  p.push_back({"dist_hybrid", "inproc", 4, 2, 2, /*staged=*/true, /*helpers=*/false});
  return p;
}

}  // namespace hybridps::testing
