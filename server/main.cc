// hybridps-server: configured by HYBRIDPS_* environment variables (docs/configuration.md).
// Servers never import or link MXNet. `hybridps-server --version` prints the version.
#include <csignal>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "common/options.h"
#include "common/transport.h"
#include "common/version.h"
#include "server/server.h"

namespace {
hybridps::Server* g_server = nullptr;
void OnSignal(int) {
  if (g_server) g_server->Stop();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("hybridps-server %s\n", hybridps::Version());
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr,
                 "usage: hybridps-server [--version]\n"
                 "(configured by HYBRIDPS_* environment variables; see docs/configuration.md)\n");
    return 2;
  }
  auto options = hybridps::OptionsFromEnvironment(hybridps::Role::kServer);
  if (!options.ok()) {
    std::fprintf(stderr, "hybridps-server: %s\n", options.status().ToString().c_str());
    return 2;
  }
  hybridps::SetLogLevel(options->log_level);
  hybridps::SetLogTag("server");
  hybridps::Context ctx;
  auto server = hybridps::Server::Create(ctx, *options);
  if (!server.ok()) {
    std::fprintf(stderr, "hybridps-server: %s\n", server.status().ToString().c_str());
    return 2;
  }
  g_server = server->get();
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  absl::Status s = (*server)->Run();
  g_server = nullptr;
  if (!s.ok()) {
    std::fprintf(stderr, "hybridps-server: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
