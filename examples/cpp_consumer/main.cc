// The smallest hybridps program: every worker broadcasts rank 0's weights, then sums a
// gradient over all workers and checks the sum. Built against an installed hybridps
// (CMakeLists.txt beside this file); run it under hybridrun, with either store:
//   hybridrun -np 2 --servers 1 -- ./hybridps-consumer
//   hybridrun -np 2 --backend dist_allreduce -- ./hybridps-consumer
#include <cstdio>
#include <vector>

#include "worker/kvstore.h"

int main() {
  auto options = hybridps::OptionsFromEnvironment();  // HYBRIDPS_* set by hybridrun
  if (!options.ok()) {
    std::fprintf(stderr, "hybridps-consumer: %s\n", options.status().ToString().c_str());
    return 2;
  }
  auto kv = hybridps::KVStore::Create(options->backend, *options);
  if (!kv.ok()) {
    std::fprintf(stderr, "hybridps-consumer: %s\n", kv.status().ToString().c_str());
    return 1;
  }
  const int rank = (*kv)->rank(), n = (*kv)->num_workers();
  std::vector<float> w(1000, static_cast<float>(rank)), g(1000, static_cast<float>(rank + 1));
  hybridps::TensorView wv{w.data(), w.size(), hybridps::DType::kFloat32};
  hybridps::TensorView gv{g.data(), g.size(), hybridps::DType::kFloat32};
  absl::Status s = (*kv)->Broadcast("weights", wv, /*root_rank=*/0);
  if (s.ok()) s = (*kv)->PushPull("grad", gv, gv);
  if (!s.ok()) {
    std::fprintf(stderr, "hybridps-consumer: %s\n", s.ToString().c_str());
    return 1;
  }
  const float want = static_cast<float>(n * (n + 1) / 2);  // 1 + 2 + ... + n
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] != 0.0f || g[i] != want) {
      std::fprintf(stderr, "hybridps-consumer: element %zu: w %g (want 0), g %g (want %g)\n",
                   i, w[i], g[i], want);
      return 1;
    }
  }
  std::printf("hybridps-consumer: worker %d of %d: broadcast and sum exact\n", rank, n);
  (*kv)->Shutdown();
  return 0;
}
