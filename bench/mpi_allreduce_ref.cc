// hybridps-mpi-ref: Open MPI's MPI_Allreduce as a reference for the dist_allreduce
// benchmarks, measured the way hybridps-gloo-ref (bench/gloo_allreduce_ref.cc) measures
// plain Gloo and ours with --order blocks, and printed in the same layout, so that one
// parser reads both. Not built by CMake (no project dependency but bench/models.h);
// bench/run_mpi_bench.sh compiles and runs it:
//
//   mpicxx -O2 -std=c++17 -I. bench/mpi_allreduce_ref.cc -o /tmp/hybridps-mpi-ref
//   mpirun -np 2 --mca pml ob1 --mca btl self,vader /tmp/hybridps-mpi-ref
//       --min-bytes 4K --max-bytes 64M --factor 4 --iters 30 --small-iters 200
//   mpirun -np 2 --mca pml ob1 --mca btl self,vader /tmp/hybridps-mpi-ref --model resnet50
//       --iters 10                                                (one command line each)
//
// Sweep: for each size S (float32, in place: MPI_IN_PLACE, MPI_SUM), --warmup untimed and
// then --iters timed iterations (at least --small-iters for S <= 1 MiB) back to back.
// Before each iteration the input is copied in (untimed): small integers, exact float32
// sums, alternating between two patterns (hybridps-gloo-ref's Contribution); one
// MPI_Allreduce is timed with std::chrono::steady_clock; the result is checked against
// the exact sum (untimed), warmup included, and a wrong element ends the job with
// status 1 ("MISMATCH"). Rank 0 prints its median and 10th percentile per size.
//
// --model resnet50: the 161 float32 parameter tensors of ResNet-50 (25,557,032
// parameters) per iteration, last layer first, one blocking MPI_Allreduce each (what an
// MPI user without fusion writes); then, separately, all of them packed in one buffer,
// one MPI_Allreduce (the ideal fusion; packing not timed). Medians over iterations.
// Open MPI's deprecated C++ bindings are not used (their header warns under -Wextra).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/allreduce_patterns.h"
#include "bench/models.h"

namespace {

using Clock = std::chrono::steady_clock;
using hybridps::bench::Median;
using hybridps::bench::Patterns;
using hybridps::bench::Quantile;

constexpr const char* kUsage =
    "usage: hybridps-mpi-ref [--min-bytes 4K] [--max-bytes 64M] [--factor 4] [--iters 30] "
    "[--small-iters 200] [--warmup 3] [--model resnet50]\n"
    "  (started by mpirun; sizes take a K, M or G suffix; sizes <= 1 MiB run "
    "max(iters, small-iters) iterations)\n";

struct Flags {
  size_t min_bytes = 4 << 10, max_bytes = 64 << 20, factor = 4;
  int iters = 30, warmup = 3;
  int small_iters = 200;  // sizes up to 1 MiB run at least this many iterations
  std::string model;      // "" or "resnet50"
};

bool ParseBytes(std::string s, size_t* out) {
  size_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'M' || s.back() == 'G')) {
    mult = s.back() == 'K' ? size_t{1} << 10 : s.back() == 'M' ? size_t{1} << 20 : size_t{1} << 30;
    s.pop_back();
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) {
    return false;
  }
  *out = std::strtoull(s.c_str(), nullptr, 10) * mult;
  return true;
}

bool ParseInt(const std::string& s, int min, int* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9) {
    return false;
  }
  const int v = std::atoi(s.c_str());
  if (v < min) return false;
  *out = v;
  return true;
}

// Returns "" on success, else what was wrong.
std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) return "flag " + k + " has no value (flags come in pairs)";
    const std::string v = argv[i + 1];
    int x = 0;
    bool ok = true;
    if (k == "--min-bytes") {
      ok = ParseBytes(v, &f->min_bytes);
    } else if (k == "--max-bytes") {
      ok = ParseBytes(v, &f->max_bytes);
    } else if (k == "--factor") {
      ok = ParseInt(v, 2, &x);
      f->factor = static_cast<size_t>(x);
    } else if (k == "--iters") {
      ok = ParseInt(v, 1, &f->iters);
    } else if (k == "--small-iters") {
      ok = ParseInt(v, 1, &f->small_iters);
    } else if (k == "--warmup") {
      ok = ParseInt(v, 0, &f->warmup);
    } else if (k == "--model") {
      f->model = v;
    } else {
      return "unknown flag " + k;
    }
    if (!ok) return "bad value for " + k + ": " + v;
  }
  if (!f->model.empty() && f->model != "resnet50") return "--model knows only resnet50";
  if (f->min_bytes < 4 || f->min_bytes > f->max_bytes) {
    return "bad sizes: need 4 <= --min-bytes <= --max-bytes";
  }
  if (f->max_bytes / 4 > static_cast<size_t>(INT_MAX)) {
    return "--max-bytes too large for one MPI_Allreduce (int count)";
  }
  return "";
}

int g_rank = 0;

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "hybridps-mpi-ref: rank %d: %s\n", g_rank, msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);  // not reached
}

void Check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  Fail(std::string(what) + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

// Ends the job when x[0, count) is not parity p's sum.
void CheckResult(const Patterns& pat, const float* x, size_t count, int p,
                 const std::string& what) {
  const size_t i = pat.FirstWrong(x, count, p);
  if (i == count) return;
  Fail("MISMATCH in " + what + " element " + std::to_string(i) + ": got " +
       std::to_string(x[i]) + ", expected " + std::to_string(pat.sum[p][i]));
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void Allreduce(float* x, size_t count) {
  Check(MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD),
        "MPI_Allreduce");
}

// warmup + iters timed operations on work[0, sum(sizes)): per iteration the input is
// loaded (untimed), the tensors are allreduced last first, one MPI_Allreduce each (one
// tensor: one allreduce), and the result is checked (untimed). Returns rank-local times.
std::vector<double> Time(const Flags& f, int iters, const std::vector<size_t>& sizes,
                         float* work, const Patterns& pat, const std::string& name) {
  std::vector<size_t> offset(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offset[i + 1] = offset[i] + sizes[i];
  const size_t count = offset.back();
  std::vector<double> us;
  for (int it = 0; it < f.warmup + iters; ++it) {
    const int p = it % 2;
    pat.Load(work, count, p);
    const Clock::time_point t0 = Clock::now();
    for (size_t i = sizes.size(); i-- > 0;) Allreduce(work + offset[i], sizes[i]);
    const double t = Micros(Clock::now() - t0);
    CheckResult(pat, work, count, p, name + " iteration " + std::to_string(it));
    if (it >= f.warmup) us.push_back(t);
  }
  return us;
}

std::string Transport() {
  const char* pml = std::getenv("OMPI_MCA_pml");
  const char* btl = std::getenv("OMPI_MCA_btl");
  return std::string("pml ") + (pml ? pml : "(default)") + ", btl " + (btl ? btl : "(default)");
}

void Sweep(const Flags& f, int rank, int n) {
  const double busf = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  std::vector<float> work(f.max_bytes / 4);
  const Patterns pat(work.size(), rank, n);
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string version(lib, static_cast<size_t>(len));
    version = version.substr(0, version.find_first_of(",\n"));
    std::printf(
        "# hybridps-mpi-ref: MPI_Allreduce (%s; %s), %d ranks, float32, in place "
        "(MPI_IN_PLACE, MPI_SUM)\n"
        "# time = rank 0's median of %d iterations (%d for sizes <= 1 MiB; %d warmup), back "
        "to back, input loaded and result checked untimed; p10 = 10th percentile\n"
        "# algbw = S / median time (GB/s, 1e9 B); busbw = algbw * 2(n-1)/n = algbw * %.3g\n#\n"
        "# %11s %10s | %10s %8s %8s %8s\n",
        version.c_str(), Transport().c_str(), n, f.iters, std::max(f.iters, f.small_iters),
        f.warmup, busf, "size(B)", "count", "mpi(us)", "p10", "algbw", "busbw");
    std::fflush(stdout);
  }
  for (size_t s = f.min_bytes; s <= f.max_bytes; s *= f.factor) {
    const int iters = s <= (1 << 20) ? std::max(f.iters, f.small_iters) : f.iters;
    const std::vector<double> us =
        Time(f, iters, {s / 4}, work.data(), pat, "sweep size " + std::to_string(s));
    const double m = Median(us), p10 = Quantile(us, 0.1);
    if (rank == 0) {
      std::printf("  %11zu %10zu | %10.2f %8.2f %8.3f %8.3f\n", s, s / 4, m, p10, s / m / 1e3,
                  s / m / 1e3 * busf);
      std::fflush(stdout);
    }
  }
}

void Model(const Flags& f, int rank, int n) {
  const std::vector<size_t> sizes = hybridps::bench::ResNet50();
  size_t total = 0;
  for (size_t c : sizes) total += c;
  std::vector<float> work(total);
  const Patterns pat(total, rank, n);
  const double per_tensor = Median(Time(f, f.iters, sizes, work.data(), pat, "resnet50 per tensor"));
  const double packed = Median(Time(f, f.iters, {total}, work.data(), pat, "resnet50 packed"));
  if (rank != 0) return;
  const double bytes = static_cast<double>(total) * 4;
  std::printf(
      "# model resnet50: %zu float32 tensors, %zu parameters (%.1f MB), last layer first; "
      "MPI_Allreduce (%s), %d ranks; rank 0's medians of %d iterations (%d warmup), each "
      "method back to back; every result checked\n",
      sizes.size(), total, bytes / 1e6, Transport().c_str(), n, f.iters, f.warmup);
  std::printf("  MPI, one allreduce per tensor               %10.1f ms  (%.3f GB/s algbw)\n",
              per_tensor / 1e3, bytes / per_tensor / 1e3);
  std::printf("  MPI, all packed in one buffer               %10.1f ms  (%.3f GB/s algbw)\n",
              packed / 1e3, bytes / packed / 1e3);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "hybridps-mpi-ref: MPI_Init failed\n");
    return 1;
  }
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  g_rank = rank;
  // Errors come back as codes (reported by Check) instead of MPI's default abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  if (argc == 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    if (rank == 0) std::fputs(kUsage, stdout);
    MPI_Finalize();
    return 0;
  }
  Flags f;
  const std::string err = ParseFlags(argc, argv, &f);
  if (!err.empty()) {
    if (rank == 0) std::fprintf(stderr, "hybridps-mpi-ref: %s\n%s", err.c_str(), kUsage);
    MPI_Finalize();
    return 2;
  }
  try {
    if (f.model.empty()) {
      Sweep(f, rank, n);
    } else {
      Model(f, rank, n);
    }
  } catch (const std::bad_alloc&) {
    Fail("out of memory");
  }
  Check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  MPI_Finalize();
  return 0;
}
