#include "common/options.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace hybridps {
namespace {

class OptionsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* v : {"HYBRIDPS_ROLE", "HYBRIDPS_NUM_WORKERS", "HYBRIDPS_NUM_SERVERS",
                          "HYBRIDPS_PARTITION_BYTES", "HYBRIDPS_TIMEOUT_MS", "HYBRIDPS_RANK",
                          "HYBRIDPS_BACKEND", "HYBRIDPS_SCHEDULER_PORT",
                          "HYBRIDPS_HEARTBEAT_TIMEOUT_MS", "HYBRIDPS_FUSION_BYTES",
                          "HYBRIDPS_CYCLE_TIME_MS", "HYBRIDPS_STALL_WARNING_MS"}) {
      unsetenv(v);
    }
  }
};

TEST_F(OptionsTest, DefaultsWhenNothingIsSet) {
  auto o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->partition_bytes, 4u << 20);
  EXPECT_EQ(o->backend, "dist_hybrid");
  EXPECT_EQ(o->rank, -1);
}

TEST_F(OptionsTest, ReadsVariables) {
  setenv("HYBRIDPS_ROLE", "server", 1);
  setenv("HYBRIDPS_NUM_WORKERS", "4", 1);
  setenv("HYBRIDPS_NUM_SERVERS", "3", 1);
  setenv("HYBRIDPS_PARTITION_BYTES", "1024", 1);
  setenv("HYBRIDPS_TIMEOUT_MS", "2500", 1);
  setenv("HYBRIDPS_RANK", "2", 1);
  setenv("HYBRIDPS_SCHEDULER_PORT", "9000", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->role, Role::kServer);
  EXPECT_EQ(o->num_workers, 4);
  EXPECT_EQ(o->num_servers, 3);
  EXPECT_EQ(o->partition_bytes, 1024u);
  EXPECT_EQ(o->op_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->SchedulerEndpoint(), "tcp://127.0.0.1:9000");
}

TEST_F(OptionsTest, BadValuesNameTheVariable) {
  setenv("HYBRIDPS_NUM_WORKERS", "two", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("HYBRIDPS_NUM_WORKERS"), absl::string_view::npos);
  unsetenv("HYBRIDPS_NUM_WORKERS");
  setenv("HYBRIDPS_ROLE", "boss", 1);
  o = OptionsFromEnvironment();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("boss"), absl::string_view::npos);
  unsetenv("HYBRIDPS_ROLE");
  setenv("HYBRIDPS_BACKEND", "dist_magic", 1);
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  unsetenv("HYBRIDPS_BACKEND");
  setenv("HYBRIDPS_HEARTBEAT_TIMEOUT_MS", "10", 1);  // below the interval
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  unsetenv("HYBRIDPS_HEARTBEAT_TIMEOUT_MS");
  setenv("HYBRIDPS_NUM_WORKERS", "2", 1);
  setenv("HYBRIDPS_RANK", "2", 1);  // out of range
  EXPECT_FALSE(OptionsFromEnvironment().ok());
}

TEST_F(OptionsTest, AllreduceBackendNeedsNoServers) {
  setenv("HYBRIDPS_BACKEND", "dist_allreduce", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->num_servers, 0);
}

TEST_F(OptionsTest, AllreduceFusionCycleAndStallSettings) {
  auto d = OptionsFromEnvironment();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->fusion_bytes, size_t{64} << 20);
  EXPECT_EQ(d->cycle_time, absl::Milliseconds(1));
  EXPECT_EQ(d->stall_warning, absl::Seconds(60));
  setenv("HYBRIDPS_FUSION_BYTES", "0", 1);
  setenv("HYBRIDPS_CYCLE_TIME_MS", "5", 1);
  setenv("HYBRIDPS_STALL_WARNING_MS", "2000", 1);
  auto o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->fusion_bytes, 0u);
  EXPECT_EQ(o->cycle_time, absl::Milliseconds(5));
  EXPECT_EQ(o->stall_warning, absl::Seconds(2));
  setenv("HYBRIDPS_STALL_WARNING_MS", "0", 1);
  EXPECT_FALSE(OptionsFromEnvironment().ok());
  setenv("HYBRIDPS_STALL_WARNING_MS", "x", 1);
  auto bad = OptionsFromEnvironment();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("HYBRIDPS_STALL_WARNING_MS"), absl::string_view::npos);
}

}  // namespace
}  // namespace hybridps
