// The scheduler through its client: the rendezvous store, registration errors, the start
// timeout, barriers and orderly shutdown.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/control_client.h"
#include "common/transport.h"
#include "scheduler/scheduler.h"
#include "tests/status_matchers.h"

namespace hybridps {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  // A job of `workers` workers and no servers (the allreduce shape) over inproc.
  void StartScheduler(int workers, absl::Duration start_timeout = absl::Seconds(10)) {
    static int counter = 0;
    options_.backend = "dist_allreduce";
    options_.num_workers = workers;
    options_.num_servers = 0;
    options_.scheduler_endpoint = absl::StrCat("inproc://sched-test-", counter++);
    options_.start_timeout = start_timeout;
    options_.heartbeat_interval = absl::Milliseconds(50);
    options_.heartbeat_timeout = absl::Milliseconds(1000);
    options_.log_level = 1;
    Options so = options_;
    so.role = Role::kScheduler;
    auto s = Scheduler::Create(ctx_, so);
    ASSERT_OK(s);
    scheduler_ = std::move(*s);
    thread_ = std::thread([this] { run_status_ = scheduler_->Run(); });
  }
  void TearDown() override {
    if (scheduler_) scheduler_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  std::unique_ptr<ControlClient> Client(int rank) {
    Options o = options_;
    o.role = Role::kWorker;
    o.rank = rank;
    auto c = ControlClient::Connect(ctx_, o, {});
    EXPECT_OK(c);
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Sends a request and pumps the client until its reply (bounded).
  absl::StatusOr<wire::Envelope> Call(ControlClient* c, wire::Envelope env,
                                      absl::Duration deadline = absl::Seconds(5)) {
    std::optional<absl::StatusOr<wire::Envelope>> result;
    c->Request(std::move(env), absl::Now() + deadline,
               [&](absl::StatusOr<wire::Envelope> r) { result = std::move(r); });
    Poller poller;
    poller.Add(c->socket());
    const absl::Time stop = absl::Now() + deadline + absl::Seconds(2);
    while (!result && absl::Now() < stop) {
      (void)poller.Poll(absl::Milliseconds(10));
      c->OnReadable();
      c->Tick(absl::Now());
    }
    if (!result) return absl::InternalError("no callback");
    return *result;
  }

  Context ctx_;
  Options options_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread thread_;
  absl::Status run_status_;
};

TEST_F(SchedulerTest, RendezvousStoreSetGetWait) {
  StartScheduler(1);
  auto c = Client(0);
  auto welcome = c->Register("");
  ASSERT_OK(welcome);
  EXPECT_EQ(welcome->rank(), 0);

  wire::Envelope get;
  get.mutable_kv_get()->set_key("nccl-id");
  auto r = Call(c.get(), get);
  ASSERT_OK(r);
  EXPECT_FALSE(r->kv_reply().found());

  wire::Envelope set;
  set.mutable_kv_set()->set_key("nccl-id");
  set.mutable_kv_set()->set_value(std::string("\x00\x01\x02", 3));
  ASSERT_OK(Call(c.get(), set));
  r = Call(c.get(), get);
  ASSERT_OK(r);
  ASSERT_TRUE(r->kv_reply().found());
  EXPECT_EQ(r->kv_reply().values(0), std::string("\x00\x01\x02", 3));

  // Wait for a key that is never set: an error naming it, at its deadline.
  wire::Envelope wait;
  wait.mutable_kv_wait()->add_keys("nccl-id");
  wait.mutable_kv_wait()->add_keys("never");
  wait.mutable_kv_wait()->set_timeout_ms(300);
  const absl::Time t0 = absl::Now();
  r = Call(c.get(), wait);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("never"), absl::string_view::npos) << r.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
}

// The store holds rendezvous data: what would take it past 64 MiB is refused, naming the
// key, and replacing a value counts only the new one.
TEST_F(SchedulerTest, RendezvousStoreIsBounded) {
  StartScheduler(1);
  auto c = Client(0);
  ASSERT_OK(c->Register(""));
  wire::Envelope set;
  set.mutable_kv_set()->set_value(std::string(20 << 20, 'v'));
  for (int i = 0; i < 3; ++i) {
    set.mutable_kv_set()->set_key(absl::StrCat("big", i));
    ASSERT_OK(Call(c.get(), set));
  }
  set.mutable_kv_set()->set_key("big0");  // replaces 20 MiB: still 60 MiB
  ASSERT_OK(Call(c.get(), set));
  set.mutable_kv_set()->set_key("big3");
  auto r = Call(c.get(), set);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "'big3'")) << r.status();
  wire::Envelope get;
  get.mutable_kv_get()->set_key("big3");
  r = Call(c.get(), get);
  ASSERT_OK(r);
  EXPECT_FALSE(r->kv_reply().found());
}

TEST_F(SchedulerTest, WaitIsAnsweredWhenAnotherNodeSetsTheKey) {
  StartScheduler(2);
  auto a = Client(0), b = Client(1);
  std::thread tb([&] { ASSERT_OK(b->Register("")); });
  ASSERT_OK(a->Register(""));
  tb.join();
  wire::Envelope wait;
  wait.mutable_kv_wait()->add_keys("gloo/rank1");
  wait.mutable_kv_wait()->set_timeout_ms(5000);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    wire::Envelope set;
    set.mutable_kv_set()->set_key("gloo/rank1");
    set.mutable_kv_set()->set_value("addr");
    EXPECT_OK(Call(b.get(), set));
  });
  auto r = Call(a.get(), wait);
  setter.join();
  ASSERT_OK(r);
  EXPECT_EQ(r->kv_reply().values(0), "addr");
}

TEST_F(SchedulerTest, DuplicateAndOutOfRangeRanksAreRefused) {
  StartScheduler(2, absl::Seconds(2));
  auto a = Client(1);
  std::thread ta([&] { (void)a->Register(""); });  // waits for the job; ends at the timeout
  absl::SleepFor(absl::Milliseconds(100));
  auto dup = Client(1);
  auto r = dup->Register("");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank 1 is already taken"), absl::string_view::npos)
      << r.status();
  auto out = Client(5);
  r = out->Register("");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of range"), absl::string_view::npos) << r.status();
  ta.join();
}

// A process with another token (or none) fails the handshake at once: the scheduler does
// not prove the token this process holds, and the error says so; the refused ones take no
// place in the job.
TEST_F(SchedulerTest, NodesOfAnotherJobAreRefusedByTheirToken) {
  options_.job_token = "token-of-this-job";
  StartScheduler(1);
  for (const std::string token : {"token-of-another-job", ""}) {
    Options o = options_;
    o.role = Role::kWorker;
    o.rank = 0;
    o.job_token = token;
    auto stray = ControlClient::Connect(ctx_, o, {});
    ASSERT_OK(stray);
    auto r = (*stray)->Register("");
    ASSERT_FALSE(r.ok()) << "token '" << token << "' was let in";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "does not hold this job's token"))
        << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), scheduler_->endpoint())) << r.status();
  }
  auto own = Client(0);
  auto welcome = own->Register("");
  ASSERT_OK(welcome);
  EXPECT_EQ(welcome->rank(), 0);
}

TEST_F(SchedulerTest, ANodeWithATokenIsRefusedByASchedulerWithout) {
  StartScheduler(1);
  Options o = options_;
  o.role = Role::kWorker;
  o.job_token = "some-token";
  auto stray = ControlClient::Connect(ctx_, o, {});
  ASSERT_OK(stray);
  auto r = (*stray)->Register("");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "does not hold this job's token"))
      << r.status();
}

TEST_F(SchedulerTest, StartTimeoutSaysWhoIsMissing) {
  StartScheduler(2, absl::Milliseconds(500));
  auto a = Client(0);
  auto r = a->Register("");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 of 2 workers"), absl::string_view::npos)
      << r.status();
  thread_.join();
  EXPECT_EQ(run_status_.code(), absl::StatusCode::kDeadlineExceeded) << run_status_;
}

TEST_F(SchedulerTest, BarrierAndOrderlyShutdown) {
  StartScheduler(2);
  auto a = Client(0), b = Client(1);
  std::thread tb([&] { ASSERT_OK(b->Register("")); });
  ASSERT_OK(a->Register(""));
  tb.join();
  wire::Envelope barrier;
  barrier.mutable_barrier()->set_group(wire::GROUP_WORKERS);
  std::optional<absl::StatusOr<wire::Envelope>> ra;
  std::thread tbar([&] { ra = Call(a.get(), barrier); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(ra.has_value());  // a waits for b
  auto rb = Call(b.get(), barrier);
  tbar.join();
  ASSERT_OK(rb);
  ASSERT_TRUE(ra.has_value() && ra->ok());
  wire::Envelope fin;
  fin.mutable_finalize();
  ASSERT_OK(Call(a.get(), fin));
  ASSERT_OK(Call(b.get(), fin));
  thread_.join();  // Run ends by itself once every worker finished.
  EXPECT_OK(run_status_);
}

// A barrier that a live worker does not reach: after stall_warning the scheduler tells
// the waiting ones whom it waits for, and their deadline error names it.
TEST_F(SchedulerTest, AStalledBarrierNamesWhoIsMissing) {
  options_.stall_warning = absl::Milliseconds(200);
  StartScheduler(2);
  auto a = Client(0), b = Client(1);
  std::thread tb([&] { ASSERT_OK(b->Register("")); });
  ASSERT_OK(a->Register(""));
  tb.join();
  std::atomic<bool> stop{false};
  std::thread alive([&] {  // b heartbeats but never reaches the barrier
    Poller poller;
    poller.Add(b->socket());
    while (!stop.load()) {
      (void)poller.Poll(absl::Milliseconds(10));
      b->OnReadable();
      b->Tick(absl::Now());
    }
  });
  wire::Envelope barrier;
  barrier.mutable_barrier()->set_group(wire::GROUP_WORKERS);
  auto r = Call(a.get(), barrier, absl::Milliseconds(1500));
  stop.store(true);
  alive.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "the barrier has waited")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "for worker 1 (host ")) << r.status();
}

TEST_F(SchedulerTest, SilentWorkerIsDeclaredDeadAndOthersAreTold) {
  StartScheduler(2);
  auto a = Client(0), b = Client(1);
  std::thread tb([&] { ASSERT_OK(b->Register("")); });
  ASSERT_OK(a->Register(""));
  tb.join();
  b.reset();  // b goes silent
  // A barrier cannot complete without b: it fails, naming b, within the heartbeat timeout.
  const absl::Time stop = absl::Now() + absl::Seconds(5);
  wire::Envelope barrier;
  barrier.mutable_barrier()->set_group(wire::GROUP_WORKERS);
  auto r = Call(a.get(), barrier, absl::Seconds(4));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("worker 1"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("died"), absl::string_view::npos) << r.status();
  EXPECT_LT(absl::Now(), stop);
}

}  // namespace
}  // namespace hybridps
