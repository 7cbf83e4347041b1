// dist_hybrid's GPU staging layer (worker/gpu/gpu_staging.h) on machines without a GPU: the
// whole pipeline — submission checks, per-name order, staging buffers, the CPU store
// underneath (in-process clusters, also with nodes of several local ranks), completion
// and failures — with a host-memory stand-in for the CUDA runtime (HostCopier below:
// "GPU memory" is host memory labelled Device::kGPU; its copies are memcpy that report
// completion after a delay; faults are injected there). The CUDA copier itself
// (gpu_staging_cuda.cc) is exercised by tests/gpu/ps_gpu_test.cc, which needs a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/timeline.h"
#include "tests/cluster/host_copier.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/push_pull_in_turn.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/gpu/gpu_staging.h"
#if HYBRIDPS_WITH_CUDA
#include "worker/ps/ps_gpu.h"
#endif

namespace hybridps::testing {
namespace {

double SumOver(int n, size_t i, int round, int salt) {
  double want = 0;
  for (int r = 0; r < n; ++r) want += Value(i, r, round, salt);
  return want;
}

// A stager per worker of an in-process cluster, in front of the worker's store.
class StagedCluster {
 public:
  StagedCluster(const ClusterConfig& config, absl::Duration delay,
                std::vector<HostCopier::Faults> faults = {},
                absl::Duration stager_timeout = absl::Seconds(30),
                bool waiting_threads_help = true) {
    auto cl = LocalCluster::Start(config);
    EXPECT_OK(cl);
    if (!cl.ok()) return;
    cluster = std::move(*cl);
    for (int w = 0; w < cluster->num_workers(); ++w) {
      shared.push_back(std::make_shared<HostCopier::Shared>());
      // Worker-dependent copy times, so that the workers' copies finish in other orders.
      stagers.push_back(std::make_unique<GpuStager>(
          std::make_unique<HostCopier>(shared.back(), 2, delay * (w + 1),
                                       w < static_cast<int>(faults.size()) ? faults[w]
                                                                            : HostCopier::Faults{}),
          BackendOf(cluster->worker(w)), cluster->num_workers(), stager_timeout,
          waiting_threads_help));
    }
  }
  ~StagedCluster() {
    for (auto& s : stagers) {
      if (s) s->Shutdown();  // before the stores go
    }
  }
  void Run(const std::function<void(int, GpuStager*, HostCopier::Shared*)>& fn) {
    cluster->RunOnWorkers(
        [&](int rank, KVStore*) { fn(rank, stagers[rank].get(), shared[rank].get()); });
  }

  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::shared_ptr<HostCopier::Shared>> shared;
  std::vector<std::unique_ptr<GpuStager>> stagers;
};

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                DType::kUInt8};

ClusterConfig Config(int workers, int servers, int local_size = 1) {
  ClusterConfig c;
  c.workers = workers;
  c.servers = servers;
  c.local_size = local_size;
  c.partition_bytes = 4096;  // several partitions per tensor
  // Staging through the host, also where a real GPU per local rank would make "auto" NCCL.
  c.worker_options = [](int, Options* o) { o->gpu_local_reduce = "host"; };
  return c;
}

class StagedSumTest : public ::testing::TestWithParam<int> {};  // local ranks per node

TEST_P(StagedSumTest, EveryDTypeSumsExactlyInPlaceAndOutOfPlaceOverRounds) {
  const int local = GetParam();
  StagedCluster c(Config(2 * local, 2, local), absl::Microseconds(300));
  ASSERT_NE(c.cluster, nullptr);
  const int n = c.cluster->num_workers();
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    int salt = 0;
    for (DType dtype : kAllDTypes) {
      ++salt;
      FakeGpuTensor in(sh, dtype, 3001), out(sh, dtype, 3001);
      for (int round = 0; round < 3; ++round) {
        in.buf.Fill(rank, round, salt);
        const bool in_place = round != 1;
        auto h = st->PushPullAsync(absl::StrCat("t.", DTypeName(dtype)), in.view(),
                                   in_place ? in.view() : out.view(), 0);
        ASSERT_OK(h);
        ASSERT_OK(h->Wait());
        const Buffer& got = in_place ? in.buf : out.buf;
        for (size_t i = 0; i < 3001; ++i) {
          ASSERT_EQ(got.at(i), SumOver(n, i, round, salt))
              << DTypeName(dtype) << " round " << round << " element " << i;
        }
      }
    }
    EXPECT_EQ(sh->bound_device.load(), 0);
  });
  // Steady state: one staging buffer per name (7 dtypes), reused over the rounds.
  for (auto& s : c.stagers) {
    GpuStager::Stats st = s->stats();
    EXPECT_EQ(st.gpu_ops, 21u);
    EXPECT_EQ(st.host_allocations, 7u);
  }
}

INSTANTIATE_TEST_SUITE_P(LocalRanks, StagedSumTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("local", info.param); });

TEST(GpuStagingTest, BroadcastFromEveryRootAndEmptyTensors) {
  StagedCluster c(Config(3, 2), absl::Microseconds(200));
  ASSERT_NE(c.cluster, nullptr);
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    for (int root = 0; root < 3; ++root) {
      FakeGpuTensor t(sh, DType::kFloat32, 2000);
      t.buf.Fill(rank, 1, root);
      auto h = st->BroadcastAsync("w", t.view(), root, 0);
      ASSERT_OK(h);
      ASSERT_OK(h->Wait());
      for (size_t i = 0; i < 2000; ++i) ASSERT_EQ(t.buf.at(i), Value(i, root, 1, root));
    }
    FakeGpuTensor empty(sh, DType::kFloat32, 0);
    auto h = st->PushPullAsync("empty", empty.view(), empty.view(), 0);
    ASSERT_OK(h);
    EXPECT_OK(h->Wait());
  });
}

// GPU and CPU operations on one name, interleaved, all in flight at once, with copies
// that finish at different times on each worker: each must meet the same round of the
// others (a reordering would mix rounds and break the sums).
TEST(GpuStagingTest, OperationsOnOneNameKeepIssueOrderAcrossDevices) {
  StagedCluster c(Config(3, 1), absl::Milliseconds(3));
  ASSERT_NE(c.cluster, nullptr);
  constexpr int kRounds = 12;
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    std::vector<std::unique_ptr<FakeGpuTensor>> gpu;
    std::vector<std::unique_ptr<Buffer>> cpu;
    std::vector<Handle> handles;
    std::vector<Buffer*> results;
    for (int round = 0; round < kRounds; ++round) {
      const bool on_gpu = (round + rank) % 3 != 0;  // the workers differ in which are GPU
      TensorView v;
      if (on_gpu) {
        gpu.push_back(std::make_unique<FakeGpuTensor>(sh, DType::kInt32, 5000));
        gpu.back()->buf.Fill(rank, round, 7);
        v = gpu.back()->view();
        results.push_back(&gpu.back()->buf);
      } else {
        cpu.push_back(std::make_unique<Buffer>(DType::kInt32, 5000));
        cpu.back()->Fill(rank, round, 7);
        v = cpu.back()->view();
        results.push_back(cpu.back().get());
      }
      auto h = st->PushPullAsync("x", v, v, 0);
      ASSERT_OK(h);
      handles.push_back(*h);
    }
    for (int round = 0; round < kRounds; ++round) {
      ASSERT_OK(handles[round].Wait());
      for (size_t i = 0; i < 5000; ++i) {
        ASSERT_EQ(results[round]->at(i), SumOver(3, i, round, 7))
            << "worker " << rank << " round " << round << " element " << i;
      }
    }
    EXPECT_GT(st->stats().queued_cpu_ops, 0u);
  });
}

// With a timeline, each staged operation's copies are spans of their own lane: the copy
// to the host ends before the copy back starts, and both name the tensor.
TEST(GpuStagingTest, TheCopiesAreSpansOfTheTimeline) {
  auto cl = LocalCluster::Start(Config(2, 1));
  ASSERT_OK(cl);
  std::unique_ptr<LocalCluster> cluster = std::move(*cl);
  const std::string dir = ::testing::TempDir();
  std::vector<std::unique_ptr<Timeline>> timelines;
  std::vector<std::shared_ptr<HostCopier::Shared>> shared;
  std::vector<std::unique_ptr<GpuStager>> stagers;
  for (int w = 0; w < 2; ++w) {
    timelines.push_back(Timeline::Open(absl::StrCat(dir, "/staging"), absl::StrCat("w", w),
                                       w, {"operations"}));
    shared.push_back(std::make_shared<HostCopier::Shared>());
    stagers.push_back(std::make_unique<GpuStager>(
        std::make_unique<HostCopier>(shared.back(), 1, absl::Milliseconds(2),
                                     HostCopier::Faults{}),
        BackendOf(cluster->worker(w)), 2, absl::Seconds(30), true, Options{}.wait_grace,
        timelines.back().get()));
  }
  cluster->RunOnWorkers([&](int rank, KVStore*) {
    FakeGpuTensor t(shared[rank].get(), DType::kFloat32, 1000);
    for (int round = 0; round < 3; ++round) {
      auto h = stagers[rank]->PushPullAsync("t.staged", t.view(), t.view(), 0);
      ASSERT_OK(h);
      ASSERT_OK(h->Wait());
    }
  });
  for (auto& s : stagers) s->Shutdown();
  std::string path;
  ASSERT_OK(timelines[0]->Write(absl::ZeroDuration(), &path));
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Its lane: the one after the timeline's own ("operations"), and every copy on it.
  EXPECT_TRUE(absl::StrContains(
      json, "\"tid\": 1, \"args\": {\"name\": \"GPU staging: copies\"}"));
  EXPECT_EQ(absl::StrContains(json, "\"tid\": 0, \"args\": {\"bytes"), false) << json;
  // The spans in the order they ended: to the host, back, to the host, back, ...
  std::vector<std::string> order;
  std::vector<int64_t> starts, ends;
  for (size_t at = json.find("\"cat\": \""); at != std::string::npos;
       at = json.find("\"cat\": \"", at + 1)) {
    const size_t from = at + 8, to = json.find('"', from);
    order.push_back(json.substr(from, to - from));
    const size_t ts = json.find("\"ts\": ", to), dur = json.find("\"dur\": ", to);
    starts.push_back(std::stoll(json.substr(ts + 6)));
    ends.push_back(starts.back() + std::stoll(json.substr(dur + 7)));
    EXPECT_EQ(json.rfind("{\"name\": \"'t.staged'\"", at), json.rfind("{\"name\": ", at));
  }
  ASSERT_EQ(order.size(), 6u) << json;
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i], i % 2 == 0 ? "device-to-host copy" : "host-to-device copy") << json;
    if (i > 0) {
      EXPECT_LE(ends[i - 1], starts[i]) << json;  // each after the one before
    }
  }
  std::remove(path.c_str());
}

// Push_pulls of one GPU tensor in place, several in a row without waiting: each reads
// what the one before wrote (the second copy to the host waits for the first copy back),
// so k of them give n^(k-1) times the sum, as on the CPU path; other names pass them.
TEST(GpuStagingTest, InPlaceOperationsInARowReadTheEarlierResult) {
  StagedCluster c(Config(3, 2), absl::Milliseconds(2));
  ASSERT_NE(c.cluster, nullptr);
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    FakeGpuTensor x(sh, DType::kInt64, 3000), other(sh, DType::kFloat32, 3000);
    x.buf.Fill(rank, 0, 5);
    other.buf.Fill(rank, 0, 6);
    std::vector<Handle> hs;
    for (int k = 0; k < 3; ++k) {
      auto h = st->PushPullAsync("x", x.view(), x.view(), 0);
      ASSERT_OK(h);
      hs.push_back(*h);
    }
    auto h = st->PushPullAsync("other", other.view(), other.view(), 0);
    ASSERT_OK(h);
    ASSERT_OK(h->Wait());
    for (auto& hx : hs) ASSERT_OK(hx.Wait());
    for (size_t i = 0; i < x.buf.count; ++i) {
      ASSERT_EQ(x.buf.at(i), 9 * SumOver(3, i, 0, 5)) << "worker " << rank << " element " << i;
      ASSERT_EQ(other.buf.at(i), SumOver(3, i, 0, 6)) << "worker " << rank << " element " << i;
    }
    EXPECT_EQ(st->stats().held_ops, 2u) << "worker " << rank;
  });
}

// Many names in flight at once, then again: the second time allocates nothing.
TEST(GpuStagingTest, ManyTensorsInFlightReuseTheirStagingBuffers) {
  StagedCluster c(Config(2, 2), absl::Microseconds(500));
  ASSERT_NE(c.cluster, nullptr);
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    std::vector<std::unique_ptr<FakeGpuTensor>> ts;
    for (int k = 0; k < 20; ++k) {
      ts.push_back(std::make_unique<FakeGpuTensor>(sh, DType::kFloat32, 100 + 700 * k));
    }
    uint64_t allocations = 0;
    for (int round = 0; round < 2; ++round) {
      std::vector<Handle> hs;
      for (int k = 0; k < 20; ++k) {
        ts[k]->buf.Fill(rank, round, k);
        auto h = st->PushPullAsync(absl::StrCat("m", k), ts[k]->view(), ts[k]->view(), k % 3);
        ASSERT_OK(h);
        hs.push_back(*h);
      }
      for (int k = 0; k < 20; ++k) {
        ASSERT_OK(hs[k].Wait());
        for (size_t i = 0; i < ts[k]->buf.count; ++i) {
          ASSERT_EQ(ts[k]->buf.at(i), SumOver(2, i, round, k)) << "m" << k << " element " << i;
        }
      }
      if (round == 0) allocations = st->stats().host_allocations;
    }
    EXPECT_EQ(allocations, 20u);
    EXPECT_EQ(st->stats().host_allocations, allocations);
    EXPECT_EQ(sh->allocs.load(), 20);
  });
}

// Several user threads of one worker submitting at once (as MXNet's engine threads do),
// GPU and CPU tensors, each thread its own names.
TEST(GpuStagingTest, ConcurrentSubmittersOnOneWorker) {
  StagedCluster c(Config(2, 2), absl::Microseconds(300));
  ASSERT_NE(c.cluster, nullptr);
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 4; ++round) {
          const bool on_gpu = (round + t) % 2 == 0;
          FakeGpuTensor g(sh, DType::kInt64, 2000 + 100 * t);
          Buffer& b = g.buf;
          b.Fill(rank, round, t);
          TensorView v = on_gpu ? g.view() : b.view();
          auto h = st->PushPullAsync(absl::StrCat("thread", t), v, v, 0);
          ASSERT_OK(h);
          ASSERT_OK(h->Wait());
          for (size_t i = 0; i < b.count; ++i) {
            ASSERT_EQ(b.at(i), SumOver(2, i, round, t)) << "thread " << t << " round " << round;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
  });
}

// A thread waiting on a GPU operation's handle runs the staging steps itself (no hand-off
// to the stager's thread and back); switched off, only the stager's thread does. Sums are
// exact either way, also with several threads waiting at once.
TEST(GpuStagingTest, WaitingThreadsRunTheStagingThemselves) {
  for (bool help : {true, false}) {
    StagedCluster c(Config(2, 1), absl::Microseconds(50), {}, absl::Seconds(30), help);
    ASSERT_NE(c.cluster, nullptr);
    c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
      std::vector<std::thread> threads;
      for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&, t] {
          FakeGpuTensor g(sh, DType::kFloat32, 5000);
          for (int round = 0; round < 10; ++round) {
            g.buf.Fill(rank, round, t);
            auto h = st->PushPullAsync(absl::StrCat("w", t), g.view(), g.view(), 0);
            ASSERT_OK(h);
            ASSERT_OK(h->Wait());
            for (size_t i = 0; i < g.buf.count; i += 7) {
              ASSERT_EQ(g.buf.at(i), SumOver(2, i, round, t)) << "round " << round;
            }
          }
        });
      }
      for (auto& th : threads) th.join();
    });
    for (int w = 0; w < 2; ++w) {
      const GpuStager::Stats st = c.stagers[w]->stats();
      EXPECT_EQ(st.gpu_ops, 20u);
      if (help) {
        EXPECT_GE(st.caller_turns, 20u) << "worker " << w;
      } else {
        EXPECT_EQ(st.caller_turns, 0u) << "worker " << w;
      }
      std::printf("waiting threads help %d, worker %d: %llu turns by waiting threads\n", help,
                  w, static_cast<unsigned long long>(st.caller_turns));
    }
  }
}

// A GPU operation right after a waited CPU one (hybridps-bench --gpu takes turns between
// the two): the CPU part of the GPU operation, which nobody waits on (the stager takes a
// callback), goes to the store's I/O thread as soon as the waiting thread let the turns
// go, not after the idle hand-back (once 10 ms for every such operation, seen on an H100;
// made 90 s here, past the GPU handle's deadline of 5 x 2 s + the 30 s wait grace, so
// that the stall fails Wait() and then ends).
TEST(GpuStagingTest, GpuOperationsRightAfterWaitedCpuOnesDoNotWaitForTheIdleHandBack) {
  StagedCluster c(Config(2, 1), absl::Microseconds(50), {}, /*stager_timeout=*/absl::Seconds(2));
  ASSERT_NE(c.cluster, nullptr);
  for (int w = 0; w < 2; ++w) {
    PsOf(c.cluster->worker(w))->SetIdleHandBackForTesting(absl::Seconds(90));
  }
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    KVStore* kv = c.cluster->worker(rank);
    Buffer cpu(DType::kFloat32, 1 << 20);  // its waiting thread holds the turns a while
    FakeGpuTensor g(sh, DType::kFloat32, 5000);
    for (int round = 0; round < 5; ++round) {
      ASSERT_OK(kv->PushPull("cpu", cpu.view(), cpu.view()));
      g.buf.Fill(rank, round, 4);
      auto h = st->PushPullAsync("gpu", g.view(), g.view(), 0);
      ASSERT_OK(h);
      // After a failed Wait the operation still writes into g when the hand-back ends it.
      auto settle = absl::MakeCleanup(
          [&h] { (void)PollUntilDone(*h, absl::Now() + absl::Seconds(180)); });
      ASSERT_OK(h->Wait()) << "round " << round;
      for (size_t i = 0; i < g.buf.count; i += 7) {
        ASSERT_EQ(g.buf.at(i), SumOver(2, i, round, 4)) << "round " << round;
      }
    }
  });
}

// A thread waiting on a GPU operation whose CPU part never completes (a stuck store)
// gets DeadlineExceeded at its handle's deadline, as on the CPU path: the thread helping
// the stager gives up then instead of sleeping on.
TEST(GpuStagingTest, WaitOnAStuckCpuPathIsBoundedByTheHandlesDeadline) {
  auto shared = std::make_shared<HostCopier::Shared>();
  auto stuck = std::make_shared<HandleState>();  // the CPU path's operation, never done
  GpuStager::Backend backend;
  backend.push_pull = [stuck](absl::string_view, TensorView, TensorView,
                              int) -> absl::StatusOr<Handle> { return Handle(stuck); };
  backend.broadcast = [stuck](absl::string_view, TensorView, int,
                              int) -> absl::StatusOr<Handle> { return Handle(stuck); };
  FakeGpuTensor g(shared.get(), DType::kFloat32, 1000);  // outlives the stager
  // Deadline: 5 x op_timeout + wait_grace = 1.1 s after submission.
  GpuStager st(std::make_unique<HostCopier>(shared, 1, absl::ZeroDuration(),
                                            HostCopier::Faults{}),
               std::move(backend), 1, absl::Milliseconds(200), /*waiting_threads_help=*/true,
               /*wait_grace=*/absl::Milliseconds(100));
  g.buf.Fill(0, 0, 5);
  auto h = st.PushPullAsync("w", g.view(), g.view(), 0);
  ASSERT_OK(h);
  const absl::Status s = h->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "push_pull of 'w'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "threads are stuck")) << s;
  EXPECT_FALSE(h->Done());
  stuck->Complete(absl::OkStatus());  // the stager's thread finishes it (the copy back)
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  ASSERT_TRUE(PollUntilDone(*h, deadline)) << "the stager's thread did not take the steps over";
  EXPECT_OK(h->Wait());
  EXPECT_EQ(g.buf.at(17), Value(17, 0, 0, 5));  // the in-place "sum" of one worker
}

// The server-side optimizer applies to staged tensors like to CPU ones: SGD,
// w <- w - lr * (sum of the gradients), weights set by a broadcast from a GPU tensor.
TEST(GpuStagingTest, ServerOptimizerUpdatesStagedWeights) {
  StagedCluster c(Config(2, 2), absl::Microseconds(200));
  ASSERT_NE(c.cluster, nullptr);
  c.cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    ServerOptimizer opt;
    opt.spec.rule = "sgd";
    opt.spec.params["learning_rate"] = 0.5;
    absl::Status s = kv->SetOptimizer(opt);
    ASSERT_OK(s);
    GpuStager* st = c.stagers[rank].get();
    HostCopier::Shared* sh = c.shared[rank].get();
    FakeGpuTensor w(sh, DType::kFloat32, 3000), g(sh, DType::kFloat32, 3000);
    w.buf.Fill(0, 0, 1);  // the same start everywhere; root 1's is what counts
    auto h = st->BroadcastAsync("w", w.view(), 1, 0);
    ASSERT_OK(h);
    ASSERT_OK(h->Wait());
    std::vector<double> want(3000);
    for (size_t i = 0; i < 3000; ++i) want[i] = Value(i, 0, 0, 1);
    for (int step = 0; step < 3; ++step) {
      g.buf.Fill(rank, step, 2);
      h = st->PushPullAsync("w", g.view(), w.view(), 0);
      ASSERT_OK(h);
      ASSERT_OK(h->Wait());
      for (size_t i = 0; i < 3000; ++i) {
        want[i] -= 0.5 * SumOver(2, i, step, 2);
        ASSERT_EQ(w.buf.at(i), want[i]) << "step " << step << " element " << i;
      }
    }
  });
}

bool Mentions(const absl::Status& s, absl::string_view text) {
  return absl::StrContains(s.message(), text);
}

// Submission checks: wrong device, host pointer labelled GPU, mixed devices, bad sizes.
TEST(GpuStagingTest, DeviceRulesAreCheckedAtSubmissionWithNamedErrors) {
  StagedCluster c(Config(1, 1), absl::ZeroDuration());
  ASSERT_NE(c.cluster, nullptr);
  GpuStager* st = c.stagers[0].get();
  HostCopier::Shared* sh = c.shared[0].get();
  FakeGpuTensor a(sh, DType::kFloat32, 10, 0), b(sh, DType::kFloat32, 10, 1),
      c3(sh, DType::kFloat32, 10, 3);
  Buffer host(DType::kFloat32, 10);
  auto expect = [](absl::StatusOr<Handle> h, absl::StatusCode code,
                   std::vector<std::string> texts) {
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), code) << h.status();
    for (const auto& t : texts) EXPECT_TRUE(Mentions(h.status(), t)) << h.status();
  };
  // A device this process does not have (the stand-in has 2).
  expect(st->PushPullAsync("d3", c3.view(), c3.view(), 0), absl::StatusCode::kInvalidArgument,
         {"'d3'", "GPU 3", "sees 2 CUDA device(s)"});
  // The first good tensor fixes GPU 0; GPU 1 is refused afterwards.
  auto ok = st->PushPullAsync("a", a.view(), a.view(), 0);
  ASSERT_OK(ok);
  EXPECT_OK(ok->Wait());
  expect(st->PushPullAsync("b", b.view(), b.view(), 0), absl::StatusCode::kInvalidArgument,
         {"'b'", "GPU 1", "stages GPU tensors from GPU 0"});
  // Host memory labelled GPU.
  TensorView fake = host.view();
  fake.device = Device::kGPU;
  expect(st->PushPullAsync("h", fake, fake, 0), absl::StatusCode::kInvalidArgument,
         {"'h'", "not memory of GPU 0"});
  expect(st->BroadcastAsync("h", fake, 0, 0), absl::StatusCode::kInvalidArgument,
         {"'h'", "the tensor", "not memory of GPU 0"});
  // Input on the GPU, output in host memory, and the reverse.
  expect(st->PushPullAsync("m", a.view(), host.view(), 0), absl::StatusCode::kInvalidArgument,
         {"'m'", "the input is on GPU 0 but the output in host memory"});
  expect(st->PushPullAsync("m", host.view(), a.view(), 0), absl::StatusCode::kInvalidArgument,
         {"'m'", "the input is in host memory but the output on GPU 0"});
  // Sizes, data, root, name.
  TensorView shorter = a.view();
  shorter.count = 5;
  expect(st->PushPullAsync("s", a.view(), shorter, 0), absl::StatusCode::kInvalidArgument,
         {"'s'", "10 float32", "5 float32"});
  TensorView null = a.view();
  null.data = nullptr;
  expect(st->PushPullAsync("n", null, null, 0), absl::StatusCode::kInvalidArgument,
         {"'n'", "10 elements but no data"});
  expect(st->BroadcastAsync("r", a.view(), 1, 0), absl::StatusCode::kInvalidArgument,
         {"'r'", "root rank 1"});
  expect(st->PushPullAsync("", a.view(), a.view(), 0), absl::StatusCode::kInvalidArgument,
         {"name must not be empty"});
  // None of these reached the store or broke the stager: CPU and GPU still work.
  auto cpu = st->PushPullAsync("cpu", host.view(), host.view(), 0);
  ASSERT_OK(cpu);
  EXPECT_OK(cpu->Wait());
  auto again = st->PushPullAsync("a", a.view(), a.view(), 0);
  ASSERT_OK(again);
  EXPECT_OK(again->Wait());
}

TEST(GpuStagingTest, NoDeviceIsAFailedPreconditionNamingTheTensor) {
  StagedCluster c(Config(1, 1), absl::ZeroDuration(), {HostCopier::Faults{.no_device = true}});
  ASSERT_NE(c.cluster, nullptr);
  FakeGpuTensor a(c.shared[0].get(), DType::kFloat32, 10);
  auto h = c.stagers[0]->PushPullAsync("g", a.view(), a.view(), 0);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  EXPECT_TRUE(Mentions(h.status(), "'g'")) << h.status();
  EXPECT_TRUE(Mentions(h.status(), "cudaGetDeviceCount")) << h.status();
}

// A CUDA failure fails its operation naming the tensor, the GPU and the call, and breaks
// the stager: later operations, CPU ones included, fail at once. Each failure kind.
TEST(GpuStagingTest, CopyFailuresNameTensorGpuAndCallAndBreakTheStager) {
  struct Case {
    HostCopier::Faults faults;
    absl::StatusCode code;
    std::string text;
  };
  // Copy 0 is the tensor's copy to the host, copy 1 its copy back.
  const std::vector<Case> cases = {
      {{.fail_start = 0}, absl::StatusCode::kInternal, "copying to the host: cudaMemcpyAsync"},
      {{.fail_poll = 0}, absl::StatusCode::kInternal, "copying to the host: cudaEventQuery"},
      {{.hang = 0}, absl::StatusCode::kDeadlineExceeded,
       "copying to the host did not finish within 1s"},
      {{.fail_start = 1}, absl::StatusCode::kInternal,
       "copying back to the GPU: cudaMemcpyAsync"},
      {{.fail_poll = 1}, absl::StatusCode::kInternal, "copying back to the GPU: cudaEventQuery"},
      {{.hang = 1}, absl::StatusCode::kDeadlineExceeded,
       "copying back to the GPU did not finish within 1s"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.text);
    StagedCluster c(Config(1, 1), absl::Microseconds(100), {k.faults}, absl::Seconds(1));
    ASSERT_NE(c.cluster, nullptr);
    GpuStager* st = c.stagers[0].get();
    FakeGpuTensor a(c.shared[0].get(), DType::kFloat16, 100);
    auto h = st->PushPullAsync("a", a.view(), a.view(), 0);
    ASSERT_OK(h);
    absl::Status s = h->Wait();
    EXPECT_TRUE(Mentions(s, "push_pull of 'a' (100 float16 elements on GPU 0)")) << s;
    EXPECT_EQ(s.code(), k.code) << s;
    EXPECT_TRUE(Mentions(s, k.text)) << s;
    Buffer host(DType::kFloat32, 4);
    auto later = st->PushPullAsync("cpu", host.view(), host.view(), 0);
    ASSERT_FALSE(later.ok());
    EXPECT_TRUE(Mentions(later.status(), "GPU staging failed earlier")) << later.status();
  }
}

TEST(GpuStagingTest, ShutdownFinishesWhatIsQueuedAndRefusesLaterOperations) {
  StagedCluster c(Config(1, 1), absl::Milliseconds(20));
  ASSERT_NE(c.cluster, nullptr);
  GpuStager* st = c.stagers[0].get();
  std::vector<std::unique_ptr<FakeGpuTensor>> ts;
  std::vector<Handle> hs;
  for (int k = 0; k < 5; ++k) {
    ts.push_back(std::make_unique<FakeGpuTensor>(c.shared[0].get(), DType::kInt64, 1000));
    ts.back()->buf.Fill(0, 0, k);
    auto h = st->PushPullAsync(absl::StrCat("q", k), ts.back()->view(), ts.back()->view(), 0);
    ASSERT_OK(h);
    hs.push_back(*h);
  }
  st->Shutdown();
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE(hs[k].Done());
    EXPECT_OK(hs[k].Wait());
    EXPECT_EQ(ts[k]->buf.at(17), Value(17, 0, 0, k));
  }
  auto later = st->PushPullAsync("q0", ts[0]->view(), ts[0]->view(), 0);
  ASSERT_FALSE(later.ok());
  EXPECT_TRUE(Mentions(later.status(), "shut down")) << later.status();
  EXPECT_EQ(c.shared[0]->frees.load(), 0);  // buffers are freed with the stager
  c.stagers[0].reset();
  EXPECT_EQ(c.shared[0]->frees.load(), 5);
}

// One worker's CUDA failure leaves the other waiting for a round that will never complete:
// it fails at its deadline, nothing hangs, and both stagers shut down.
TEST(GpuStagingTest, APeersFailureEndsTheOthersOperationAtItsDeadline) {
  ClusterConfig config = Config(2, 1);
  config.op_timeout = absl::Seconds(2);
  StagedCluster c(config, absl::Microseconds(100), {HostCopier::Faults{.fail_start = 0}, {}});
  ASSERT_NE(c.cluster, nullptr);
  const absl::Time start = absl::Now();
  c.Run([&](int rank, GpuStager* st, HostCopier::Shared* sh) {
    FakeGpuTensor a(sh, DType::kFloat32, 1000);
    auto h = st->PushPullAsync("a", a.view(), a.view(), 0);
    ASSERT_OK(h);
    absl::Status s = h->Wait();
    ASSERT_FALSE(s.ok());
    if (rank == 0) {
      EXPECT_TRUE(Mentions(s, "cudaMemcpyAsync")) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_TRUE(Mentions(s, "'a'")) << s;
    }
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

#if HYBRIDPS_WITH_CUDA
// In a CUDA build KVStore::Create("dist_hybrid") stages GPU tensors (PsGpuStore, still a
// PsStore); CPU tensors go straight through: nothing staged, nothing queued, no GPU needed.
TEST(GpuStagingTest, CudaBuildsStoreIsAPsGpuStoreThatPassesCpuTensorsThrough) {
  auto cluster = LocalCluster::Start(Config(2, 2));
  ASSERT_OK(cluster);
  (*cluster)->RunOnWorkers([&](int rank, KVStore* kv) {
    ASSERT_NE(PsOf(kv), nullptr);
    auto* gpu = dynamic_cast<PsGpuStore*>(kv);
    ASSERT_NE(gpu, nullptr);
    Buffer b(DType::kFloat64, 5000);
    for (int round = 0; round < 3; ++round) {
      b.Fill(rank, round, 3);
      absl::Status s = kv->PushPull("cpu", b.view(), b.view());
      ASSERT_OK(s);
      for (size_t i = 0; i < 5000; ++i) ASSERT_EQ(b.at(i), SumOver(2, i, round, 3));
    }
    GpuStager::Stats st = gpu->staging_stats();
    EXPECT_EQ(st.gpu_ops, 0u);
    EXPECT_EQ(st.queued_cpu_ops, 0u);
    EXPECT_EQ(st.host_allocations, 0u);
  });
}
#endif

// ---- StagingCache ---------------------------------------------------------------------

TEST(StagingCacheTest, ReusesPerNameGrowsAndFreesEverything) {
  std::map<void*, size_t> live;
  int allocs = 0;
  auto cache = std::make_unique<StagingCache>(
      [&](size_t bytes) -> absl::StatusOr<void*> {
        ++allocs;
        void* p = new char[bytes];
        live[p] = bytes;
        return p;
      },
      [&](void* p) {
        live.erase(p);
        delete[] static_cast<char*>(p);
      });
  auto a = cache->Acquire("a", 100);
  ASSERT_OK(a);
  cache->Release("a", *a);
  auto a2 = cache->Acquire("a", 80);  // fits in the cached one
  ASSERT_OK(a2);
  EXPECT_EQ(a2->data, a->data);
  auto a3 = cache->Acquire("a", 100);  // a second one in flight: a new buffer
  ASSERT_OK(a3);
  EXPECT_NE(a3->data, a->data);
  EXPECT_EQ(allocs, 2);
  cache->Release("a", *a2);
  cache->Release("a", *a3);
  auto b = cache->Acquire("b", 100);  // another name never takes a's buffers
  ASSERT_OK(b);
  EXPECT_EQ(allocs, 3);
  cache->Release("b", *b);
  auto big = cache->Acquire("a", 1000);  // a grew: its smaller free buffers go
  ASSERT_OK(big);
  EXPECT_EQ(allocs, 4);
  EXPECT_EQ(live.size(), 2u);  // b's and the big one
  EXPECT_EQ(cache->cached_bytes(), 1100u);
  cache->Abandon(*big);  // a copy may still write into it: never freed
  EXPECT_EQ(cache->abandoned_bytes(), 1000u);
  cache.reset();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live.begin()->first, big->data);
  delete[] static_cast<char*>(big->data);
}

TEST(StagingCacheTest, AllocationFailureIsReturned) {
  StagingCache cache([](size_t) -> absl::StatusOr<void*> {
    return absl::ResourceExhaustedError("cudaHostAlloc(64 bytes) failed: out of memory");
  }, [](void*) {});
  auto a = cache.Acquire("a", 64);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(Mentions(a.status(), "cudaHostAlloc")) << a.status();
  EXPECT_EQ(cache.allocations(), 0u);
}

}  // namespace
}  // namespace hybridps::testing
