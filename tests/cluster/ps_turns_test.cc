// dist_hybrid's I/O turns (worker/ps/ps_store.h, threading notes): a thread waiting on
// its operation runs the worker's I/O itself; operations nobody waits on still run
// through the I/O thread; several waiting threads take turns; a node of several local
// ranks keeps its I/O on the I/O thread.
#include <gtest/gtest.h>

#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "tests/cluster/local_cluster.h"
#include "tests/cluster/push_pull_in_turn.h"
#include "tests/cluster/tensor_fill.h"
#include "tests/status_matchers.h"
#include "worker/ps/ps_store.h"

namespace hybridps::testing {
namespace {

std::unique_ptr<LocalCluster> StartPs(int workers, int caller_rounds, int local_size = 1,
                                      const std::string& transport = "inproc") {
  ClusterConfig c;
  c.workers = workers;
  c.servers = 2;
  c.local_size = local_size;
  c.caller_rounds = caller_rounds;
  c.transport = transport;
  auto cluster = LocalCluster::Start(c);
  EXPECT_OK(cluster);
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

// Options::caller_rounds: with it on, threads waiting on their push_pulls run I/O turns
// (which of them and the I/O thread gets a given reply first is up to the OS scheduler:
// many operations, so that some are the waiting thread's); with it off, none do.
TEST(PsTurnsTest, WaitingThreadsRunTheWorkersIoThemselves) {
  for (int caller_rounds : {1, 0}) {
    SCOPED_TRACE(absl::StrCat("caller_rounds ", caller_rounds));
    auto cluster = StartPs(2, caller_rounds, 1, "tcp");
    ASSERT_NE(cluster, nullptr);
    PushPullInTurn(*cluster, 100, 50000);
    for (int w = 0; w < 2; ++w) {
      const uint64_t turns = PsOf(cluster->worker(w))->CallerTurns();
      std::printf("caller_rounds %d worker %d: %llu turns by waiting threads\n", caller_rounds,
                  w, static_cast<unsigned long long>(turns));
      if (caller_rounds) {
        EXPECT_GT(turns, 0u) << "worker " << w;
      } else {
        EXPECT_EQ(turns, 0u) << "worker " << w;
      }
    }
  }
}

// After a waited-for push_pull the I/O thread leaves the turns to waiting threads for a
// moment: operations nobody waits on (each rank only polls Done()) must still complete,
// through the I/O thread, with exact sums.
TEST(PsTurnsTest, OperationsNobodyWaitsOnRunThroughTheIoThread) {
  auto cluster = StartPs(2, 1);
  ASSERT_NE(cluster, nullptr);
  std::vector<uint64_t> before(2);
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer waited(DType::kFloat32, 10);
    ASSERT_OK(kv->PushPull("waited", waited.view(), waited.view()));
    before[rank] = PsOf(kv)->CallerTurns();
    std::vector<Buffer> bufs;
    std::vector<Handle> handles;
    for (int i = 0; i < 3; ++i) bufs.emplace_back(DType::kFloat32, 1000 + i);
    for (int i = 0; i < 3; ++i) {
      bufs[i].Fill(rank, i, 5);
      auto h = kv->PushPullAsync(absl::StrCat("unwaited", i), bufs[i].view(), bufs[i].view());
      ASSERT_OK(h);
      handles.push_back(*h);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (const Handle& h : handles) {
      ASSERT_TRUE(PollUntilDone(h, deadline)) << "an operation nobody waited on never completed";
      ASSERT_OK(h.Wait());  // done: returns its status at once
    }
    for (int i = 0; i < 3; ++i) {
      for (size_t k = 0; k < bufs[i].count; ++k) {
        ASSERT_EQ(bufs[i].at(k), Value(k, 0, i, 5) + Value(k, 1, i, 5)) << "element " << k;
      }
    }
  });
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(PsOf(cluster->worker(w))->CallerTurns(), before[w])
        << "worker " << w << ": nobody waited";
  }
}

// Work that someone follows without waiting on it (a callback: MXNet's engine, GPU
// staging; a poll of Done()) runs through the I/O thread as soon as the turns are free,
// also right after a waiting thread held them: not after the idle hand-back (made an hour
// here, so that only the watched hint gets it done in time).
TEST(PsTurnsTest, OperationsFollowedWithoutAWaitDoNotWaitForTheIdleHandBack) {
  for (bool by_callback : {false, true}) {
    SCOPED_TRACE(by_callback ? "followed by a callback" : "followed by polling Done()");
    auto cluster = StartPs(2, 1);
    ASSERT_NE(cluster, nullptr);
    for (int w = 0; w < 2; ++w) {
      PsOf(cluster->worker(w))->SetIdleHandBackForTesting(absl::Hours(1));
    }
    cluster->RunOnWorkers([&](int rank, KVStore* kv) {
      auto unwaited = [&](const std::string& name, int round) {
        Buffer b(DType::kFloat32, 1000);
        b.Fill(rank, round, 7);
        auto h = kv->PushPullAsync(name, b.view(), b.view());
        ASSERT_OK(h);
        // On a failure below, the operation still writes into b: wait for it first.
        auto finish = absl::MakeCleanup([&h] { (void)h->Wait(); });
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        if (by_callback) {
          auto done = std::make_shared<absl::Notification>();
          h->OnComplete([done](const absl::Status&) { done->Notify(); });
          ASSERT_TRUE(done->WaitForNotificationWithDeadline(deadline))
              << name << " round " << round << ": the I/O thread did not take the turns";
        } else {
          ASSERT_TRUE(PollUntilDone(*h, deadline))
              << name << " round " << round << ": the I/O thread did not take the turns";
        }
        ASSERT_OK(h->Wait());  // done: its status at once
        for (size_t k = 0; k < b.count; k += 11) {
          ASSERT_EQ(b.at(k), Value(k, 0, round, 7) + Value(k, 1, round, 7)) << name;
        }
      };
      // Large, so that its waiting thread holds the turns well past the grace.
      Buffer big(DType::kFloat32, 4 << 20);
      for (int round = 0; round < 4; ++round) {
        unwaited("before", round);  // the I/O thread has the turns now
        if (::testing::Test::HasFatalFailure()) return;
        ASSERT_OK(kv->PushPull("big", big.view(), big.view()));  // a waiting thread takes them
        unwaited("after", round);
        if (::testing::Test::HasFatalFailure()) return;
      }
    });
  }
}

// The hint comes while the I/O thread has the turns (which ignores it: it runs the work
// anyway); then a waiting thread takes them and lets them go with the watched operation
// still in flight: the I/O thread takes them back at once. Worker 1 submits the watched
// operation's other half only 50 ms after the waited one, so that it is still in flight
// when worker 0's waiting thread lets the turns go.
TEST(PsTurnsTest, WatchedWorkLeftByAWaitingThreadGoesBackToTheIoThread) {
  auto cluster = StartPs(2, 1);
  ASSERT_NE(cluster, nullptr);
  for (int w = 0; w < 2; ++w) {
    PsOf(cluster->worker(w))->SetIdleHandBackForTesting(absl::Hours(1));
  }
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    Buffer watched(DType::kFloat32, 1000), waited(DType::kFloat32, 1000);
    watched.Fill(rank, 0, 8);
    waited.Fill(rank, 0, 9);
    if (rank == 0) {
      auto h = kv->PushPullAsync("watched", watched.view(), watched.view());
      ASSERT_OK(h);
      auto finish = absl::MakeCleanup([&h] { (void)h->Wait(); });
      auto done = std::make_shared<absl::Notification>();
      h->OnComplete([done](const absl::Status&) { done->Notify(); });  // the I/O thread's
      ASSERT_OK(kv->PushPull("waited", waited.view(), waited.view()));  // turns taken, let go
      ASSERT_TRUE(done->WaitForNotificationWithDeadline(absl::Now() + absl::Seconds(30)))
          << "the I/O thread did not take the turns back for the watched operation";
    } else {
      ASSERT_OK(kv->PushPull("waited", waited.view(), waited.view()));
      absl::SleepFor(absl::Milliseconds(50));
      ASSERT_OK(kv->PushPull("watched", watched.view(), watched.view()));
    }
    for (size_t k = 0; k < watched.count; k += 11) {
      ASSERT_EQ(watched.at(k), Value(k, 0, 0, 8) + Value(k, 1, 0, 8)) << "element " << k;
    }
  });
}

// Several threads per worker submit and wait at once, each on names of its own: they take
// the turns from each other and from the I/O thread, and every sum is exact.
TEST(PsTurnsTest, ManyThreadsWaitingAtOnceAllComplete) {
  auto cluster = StartPs(3, 1, 1, "tcp");
  ASSERT_NE(cluster, nullptr);
  constexpr int kThreads = 3;
  constexpr int kOps = 40;
  const int n = cluster->num_workers();
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kOps; ++i) {
          Buffer b(DType::kFloat32, (t + 1) * 3000 + i);
          b.Fill(rank, i, 10 + t);
          ASSERT_OK(kv->PushPull(absl::StrCat("t", t), b.view(), b.view()));
          for (size_t k = 0; k < b.count; k += 11) {
            double want = 0;
            for (int r = 0; r < n; ++r) want += Value(k, r, i, 10 + t);
            ASSERT_EQ(b.at(k), want) << "thread " << t << " op " << i << " element " << k;
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
  });
  for (int w = 0; w < n; ++w) {
    EXPECT_GT(PsOf(cluster->worker(w))->CallerTurns(), 0u) << "worker " << w;
  }
}

// Barriers, RunOnIo's functions and the shutdown are the I/O thread's: while a thread
// waits on its push_pulls (and runs the turns) they still run there, in their order, and
// the push_pulls go on.
TEST(PsTurnsTest, CommandsOtherThanOperationsRunOnTheIoThreadWhileThreadsWait) {
  auto cluster = StartPs(2, 1);
  ASSERT_NE(cluster, nullptr);
  const int n = cluster->num_workers();
  cluster->RunOnWorkers([&](int rank, KVStore* kv) {
    // The waiter's push_pulls: as many on every worker (each needs the others').
    constexpr int kOps = 300;
    std::atomic<int> done{0};
    std::atomic<bool> waiter_ended{false};
    std::thread waiter([&] {
      for (int i = 0; i < kOps; ++i) {
        Buffer b(DType::kFloat32, 2000);
        b.Fill(rank, i, 6);
        const absl::Status s = kv->PushPull("busy", b.view(), b.view());
        EXPECT_OK(s) << "op " << i;
        if (!s.ok()) break;
        bool exact = true;
        for (size_t k = 0; k < b.count && exact; k += 13) {
          double want = 0;
          for (int r = 0; r < n; ++r) want += Value(k, r, i, 6);
          exact = b.at(k) == want;
          EXPECT_EQ(b.at(k), want) << "op " << i << " element " << k;
        }
        if (!exact) break;
        done.store(i + 1);
      }
      waiter_ended.store(true);
    });
    auto join = absl::MakeCleanup([&waiter] { waiter.join(); });
    struct Ran {  // shared with the function, which may outlive a failed wait
      absl::Notification notification;
      std::string name;
    };
    std::vector<std::string> where;
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    for (int i = 0; i < 20; ++i) {
      // Command i once the waiter is i * 10 push_pulls in: while it waits on them.
      while (done.load() < i * 10 && !waiter_ended.load() && absl::Now() < deadline) {
        absl::SleepFor(absl::Microseconds(100));
      }
      auto ran = std::make_shared<Ran>();
      ASSERT_OK(PsOf(kv)->RunOnIo([ran] {
        char buf[32] = {};
        pthread_getname_np(pthread_self(), buf, sizeof(buf));
        ran->name = buf;
        ran->notification.Notify();
      }));
      ASSERT_TRUE(ran->notification.WaitForNotificationWithDeadline(deadline))
          << "RunOnIo " << i;
      where.push_back(ran->name);
      if (i % 4 == 0) {
        ASSERT_OK(kv->Barrier());
      }
    }
    std::move(join).Invoke();
    EXPECT_EQ(done.load(), kOps);
    for (size_t i = 0; i < where.size(); ++i) {
      EXPECT_EQ(where[i], "hps-worker-io") << "worker " << rank << " RunOnIo " << i;
    }
  });
}

// On a node of several local ranks the ranks reduce through their I/O turns: those stay
// on the I/O thread (a rank's turns must not wait for its user while the others wait).
TEST(PsTurnsTest, NodesOfSeveralLocalRanksKeepTheirIoOnTheIoThread) {
  auto cluster = StartPs(4, 1, /*local_size=*/2);
  ASSERT_NE(cluster, nullptr);
  PushPullInTurn(*cluster, 20, 50000);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(PsOf(cluster->worker(w))->CallerTurns(), 0u) << "worker " << w;
  }
}

}  // namespace
}  // namespace hybridps::testing
