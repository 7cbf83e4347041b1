// What hybridps-gloo-ref and hybridps-mpi-ref (bench/run_mpi_bench.sh) share so that they
// measure alike: the inputs (small integers, exact float32 sums) and the statistics.
// Standard C++ only: the MPI reference is compiled with mpicxx, outside the build.
#ifndef HYBRIDPS_BENCH_ALLREDUCE_PATTERNS_H_
#define HYBRIDPS_BENCH_ALLREDUCE_PATTERNS_H_

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace hybridps::bench {

// Rank r's value of element i on iterations of parity p: 1..8, exact in float32 sums.
inline float Contribution(int r, size_t i, int p) {
  return static_cast<float>(1 + (((i * 2654435761u) >> 7) + static_cast<size_t>(r)) % 4 + 4 * p);
}

// This rank's inputs and the exact sums for both parities, `count` elements each; an
// iteration copies its input in (untimed) and compares its result with the sum.
struct Patterns {
  std::vector<float> input[2], sum[2];
  Patterns(size_t count, int rank, int n) {
    for (int p = 0; p < 2; ++p) {
      input[p].resize(count);
      sum[p].assign(count, 0.f);
      for (size_t i = 0; i < count; ++i) {
        input[p][i] = Contribution(rank, i, p);
        for (int r = 0; r < n; ++r) sum[p][i] += Contribution(r, i, p);
      }
    }
  }
  void Load(float* x, size_t count, int p) const {
    std::memcpy(x, input[p].data(), count * sizeof(float));
  }
  // The first element of x[0, count) that is not parity p's sum; count when none.
  size_t FirstWrong(const float* x, size_t count, int p) const {
    if (std::memcmp(x, sum[p].data(), count * sizeof(float)) == 0) return count;
    size_t i = 0;
    while (x[i] == sum[p][i]) ++i;
    return i;
  }
};

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The q-quantile (nearest rank) of v.
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace hybridps::bench

#endif  // HYBRIDPS_BENCH_ALLREDUCE_PATTERNS_H_
