// The floor under a small dist_allreduce push_pull on one host: two or more processes
// (forked here, each bound to a CPU of its own when there are enough) exchange a message
// of S bytes (float32) through ShmAllreduce's exchange areas and sum the payloads in rank
// order, as the eager path does, with nothing of the store around it; every sum checked.
// Prints rank 0's median and 10th percentile per operation (µs).
//
//   build/bench/shm-exchange-floor [--ranks N] [--bytes S] [--iters K]
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/reduce.h"
#include "worker/node/shm_allreduce.h"

namespace {

int Run(int rank, int ranks, size_t bytes, int iters, const std::string& name) {
  using hybridps::ShmAllreduce;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (ranks <= static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))) {
    CPU_SET(rank, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  auto shm = ShmAllreduce::Open(name, rank, ranks, 1 << 20,
                                absl::Now() + absl::Seconds(30));
  if (!shm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(shm.status().message()).c_str());
    return 1;
  }
  const size_t count = bytes / sizeof(float);
  std::vector<float> in(count), out(count);
  std::vector<absl::string_view> all;
  std::vector<double> us;
  us.reserve(iters);
  for (int i = -1000; i < iters; ++i) {
    for (size_t k = 0; k < count; ++k) in[k] = static_cast<float>(rank + k % 7);
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy((*shm)->NextMessage(), in.data(), bytes);
    if (absl::Status s = (*shm)->AllgatherWritten(bytes, absl::Seconds(30), &all); !s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(s.message()).c_str());
      return 1;
    }
    hybridps::Sum2(hybridps::DType::kFloat32, out.data(), all[0].data(), all[1].data(), count);
    for (int r = 2; r < ranks; ++r) {
      hybridps::SumInto(hybridps::DType::kFloat32, out.data(), all[r].data(), count);
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    float want = 0;  // element 3: every rank's rank + 3
    for (int r = 0; r < ranks; ++r) want += static_cast<float>(r + 3);
    if (count > 3 && out[3] != want) {
      std::fprintf(stderr, "rank %d: wrong sum %g, want %g\n", rank, out[3], want);
      return 1;
    }
  }
  if (rank == 0) {
    std::sort(us.begin(), us.end());
    std::printf("ranks %d, %zu bytes, %d operations: median %.2f us, p10 %.2f us\n", ranks,
                bytes, iters, us[us.size() / 2], us[us.size() / 10]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, iters = 200000;
  size_t bytes = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") ranks = std::atoi(argv[i + 1]);
    else if (flag == "--bytes") bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--iters") iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "shm-exchange-floor: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (ranks < 2 || iters < 10 || bytes < 16 || bytes % 4 != 0 || bytes > hybridps::ShmAllreduce::kMessageBytes) {
    std::fprintf(stderr, "shm-exchange-floor: bad --ranks, --bytes or --iters\n");
    return 2;
  }
  const std::string name = "/hps-floor-" + std::to_string(getpid());
  std::vector<pid_t> kids;
  for (int r = 1; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(Run(r, ranks, bytes, iters, name));
    kids.push_back(pid);
  }
  int rc = Run(0, ranks, bytes, iters, name);
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
