// The first main job: data-parallel logistic regression on generated data.
// Every worker generates the same data set (fixed seed), trains on its shard, and sums
// its gradients with every other worker's each step, through the job's store
// (HYBRIDPS_BACKEND: dist_hybrid or dist_allreduce); rank 0's initial weights are
// broadcast first. Exits non-zero unless the loss falls below --target.
//
//   hybridrun -np 2 --servers 2 -- build/examples/hybridps-train-logreg --steps 200
//   hybridrun -np 2 --backend dist_allreduce -- build/examples/hybridps-train-logreg
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/options.h"
#include "worker/kvstore.h"

namespace {

struct Flags {
  int samples = 8192;
  int dim = 64;
  int steps = 150;
  float lr = 0.5f;
  float target = 0.30f;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    double v = std::atof(argv[i + 1]);
    if (k == "--samples") f.samples = static_cast<int>(v);
    else if (k == "--dim") f.dim = static_cast<int>(v);
    else if (k == "--steps") f.steps = static_cast<int>(v);
    else if (k == "--lr") f.lr = static_cast<float>(v);
    else if (k == "--target") f.target = static_cast<float>(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return f;
}

hybridps::TensorView View(std::vector<float>& v) {
  return hybridps::TensorView{v.data(), v.size(), hybridps::DType::kFloat32};
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  auto options = hybridps::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", options.status().ToString().c_str());
    return 2;
  }
  auto kv = hybridps::KVStore::Create(options->backend, *options);
  if (!kv.ok()) {
    std::fprintf(stderr, "cannot join the job: %s\n", kv.status().ToString().c_str());
    return 1;
  }
  const int rank = (*kv)->rank(), size = (*kv)->num_workers();
  auto check = [&](const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", rank, s.ToString().c_str());
      std::exit(1);
    }
  };

  // The same data on every worker: x ~ N(0, 1), y = [x . w_true + noise > 0].
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int n = flags.samples, d = flags.dim;
  std::vector<float> w_true(d), x(static_cast<size_t>(n) * d), y(n);
  for (float& v : w_true) v = normal(gen);
  for (int i = 0; i < n; ++i) {
    float dot = 0;
    for (int j = 0; j < d; ++j) {
      x[static_cast<size_t>(i) * d + j] = normal(gen);
      dot += x[static_cast<size_t>(i) * d + j] * w_true[j];
    }
    y[i] = dot + 0.5f * normal(gen) > 0 ? 1.f : 0.f;
  }

  // Rank 0's random initial weights, broadcast to all.
  std::vector<float> w(d + 1, 0.f);  // last element: bias
  if (rank == 0) {
    std::mt19937 init(static_cast<unsigned>(absl::ToUnixNanos(absl::Now())));
    for (float& v : w) v = 0.1f * normal(init);
  }
  check((*kv)->Broadcast("weights", View(w), 0));

  std::vector<float> grad(d + 1), stats(2);
  const absl::Time start = absl::Now();
  float loss = 0;
  for (int step = 0; step < flags.steps; ++step) {
    std::fill(grad.begin(), grad.end(), 0.f);
    double loss_sum = 0;
    int count = 0;
    for (int i = rank; i < n; i += size) {  // this worker's shard
      const float* xi = &x[static_cast<size_t>(i) * d];
      float z = w[d];
      for (int j = 0; j < d; ++j) z += w[j] * xi[j];
      const float p = 1.f / (1.f + std::exp(-z));
      const float err = p - y[i];
      for (int j = 0; j < d; ++j) grad[j] += err * xi[j];
      grad[d] += err;
      loss_sum -= y[i] * std::log(p + 1e-7f) + (1 - y[i]) * std::log(1 - p + 1e-7f);
      ++count;
    }
    stats = {static_cast<float>(loss_sum), static_cast<float>(count)};
    // Two tensors in flight at once; the gradient first (higher priority).
    auto hg = (*kv)->PushPullAsync("grad", View(grad), View(grad), 1);
    auto hs = (*kv)->PushPullAsync("loss", View(stats), View(stats), 0);
    check(hg.status());
    check(hs.status());
    check(hg->Wait());
    check(hs->Wait());
    for (int j = 0; j <= d; ++j) w[j] -= flags.lr * grad[j] / static_cast<float>(n);
    loss = stats[0] / stats[1];
    if (rank == 0 && (step % 25 == 0 || step == flags.steps - 1)) {
      std::printf("step %4d  loss %.4f\n", step, loss);
      std::fflush(stdout);
    }
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  check((*kv)->Barrier());
  check((*kv)->Shutdown());
  if (rank == 0) {
    std::printf("final loss %.4f (target < %.2f) after %d steps, %.1f steps/s, %d workers\n",
                loss, flags.target, flags.steps, flags.steps / secs, size);
  }
  if (!(loss < flags.target)) {
    std::fprintf(stderr, "worker %d: loss %.4f did not fall below %.2f\n", rank, loss,
                 flags.target);
    return 1;
  }
  return 0;
}
