// hybridps-scheduler: configured by HYBRIDPS_* environment variables (docs/configuration.md).
// `hybridps-scheduler --build-info` prints which engines this build has (what
// `hybridrun --check-build` shows) and exits; `--version` prints the version.
#include <csignal>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "common/options.h"
#include "common/transport.h"
#include "common/version.h"
#include "scheduler/scheduler.h"

namespace {
hybridps::Scheduler* g_scheduler = nullptr;
void OnSignal(int) {
  if (g_scheduler) g_scheduler->Stop();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--build-info") == 0) {
    // Set by scheduler/CMakeLists.txt from the top-level feature detection.
    std::printf("CUDA: %s\nNCCL: %s\nGloo: %s\n", HYBRIDPS_BUILT_CUDA ? "yes" : "no",
                HYBRIDPS_BUILT_NCCL ? "yes" : "no", HYBRIDPS_BUILT_GLOO ? "yes" : "no");
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("hybridps-scheduler %s\n", hybridps::Version());
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr,
                 "usage: hybridps-scheduler [--build-info | --version]\n"
                 "(configured by HYBRIDPS_* environment variables; see docs/configuration.md)\n");
    return 2;
  }
  auto options = hybridps::OptionsFromEnvironment(hybridps::Role::kScheduler);
  if (!options.ok()) {
    std::fprintf(stderr, "hybridps-scheduler: %s\n", options.status().ToString().c_str());
    return 2;
  }
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
