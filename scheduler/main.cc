// hybridps-scheduler: configured by HYBRIDPS_* environment variables (see README).
#include <csignal>
#include <cstdio>

#include "common/log.h"
#include "common/options.h"
#include "common/transport.h"
#include "scheduler/scheduler.h"

namespace {
hybridps::Scheduler* g_scheduler = nullptr;
void OnSignal(int) {
  if (g_scheduler) g_scheduler->Stop();
}
}  // namespace

int main() {
  auto options = hybridps::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "hybridps-scheduler: %s\n", options.status().ToString().c_str());
    return 2;
  }
  options->role = hybridps::Role::kScheduler;
  hybridps::SetLogLevel(options->log_level);
  hybridps::Context ctx;
  auto scheduler = hybridps::Scheduler::Create(ctx, *options);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "hybridps-scheduler: %s\n", scheduler.status().ToString().c_str());
    return 2;
  }
  g_scheduler = scheduler->get();
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  absl::Status s = (*scheduler)->Run();
  g_scheduler = nullptr;
  return s.ok() ? 0 : 1;
}
