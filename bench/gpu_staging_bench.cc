// hybridps-bench --gpu 1: GPU tensors through dist_hybrid's host staging (issue 5),
// against its two ceilings measured in the same run: the pinned cudaMemcpy bandwidth both
// ways and the push_pull of a CPU tensor of the same size (their iterations taking turns).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_sweep.h"
#include "bench/zmq_echo.h"
#include "common/status.h"
#if HYBRIDPS_WITH_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/cuda_util.h"
#endif

namespace hybridps::bench {

#if HYBRIDPS_WITH_CUDA
namespace {

// The device and pinned host memory of the benchmark, and its stream.
struct GpuResources {
  void* device = nullptr;
  void* pinned = nullptr;
  cudaStream_t stream = nullptr;
  ~GpuResources() {
    if (device != nullptr) cudaFree(device);
    if (pinned != nullptr) cudaFreeHost(pinned);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

// Pinned cudaMemcpyAsync of `bytes` one way, waited for: median over the iterations.
absl::StatusOr<Timing> MeasureCopy(const Flags& f, void* dst, const void* src, size_t bytes,
                                   cudaMemcpyKind kind, cudaStream_t stream) {
  std::vector<double> us;
  for (int i = 0; i < f.warmup + f.iters; ++i) {
    const Clock::time_point t0 = Clock::now();
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    const Clock::time_point t1 = Clock::now();
    if (i >= f.warmup) us.push_back(Micros(t1 - t0));
  }
  return Summarize(std::move(us));
}

// push_pull of one GPU tensor of `bytes`, in place; every result copied back and checked.
// `samples` and `first_it` as for MeasurePushPull.
absl::StatusOr<Timing> MeasureGpuPushPull(const Flags& f, KVStore& kv, size_t bytes,
                                          const Patterns& pat, void* device, int device_id,
                                          Buffer& work, std::vector<double>* samples = nullptr,
                                          int first_it = 0) {
  const size_t es = DTypeSize(f.dtype), count = bytes / es;
  const std::string name = absl::StrCat("gpubench/", bytes);
  std::vector<double> us;
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    const int parity = (first_it + it) % 2;
    // Ready when submitted: cudaMemcpy from pageable memory may return before the data
    // has landed, and the store's stream does not wait for the default stream.
    RETURN_IF_ERROR(CudaStatus(cudaMemcpy(device, pat.input[parity]->get(), bytes,
                                    cudaMemcpyHostToDevice), "cudaMemcpy"));
    RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    const Clock::time_point t0 = Clock::now();
    ASSIGN_OR_RETURN(Handle h, kv.PushPullAsync(name, TensorView{device, count, f.dtype,
                                                                 Device::kGPU, device_id},
                                                TensorView{device, count, f.dtype,
                                                           Device::kGPU, device_id}));
    RETURN_IF_ERROR(h.Wait());
    const Clock::time_point t1 = Clock::now();
    if (it >= f.warmup) us.push_back(Micros(t1 - t0));
    RETURN_IF_ERROR(CudaStatus(cudaMemcpy(work.get(), device, bytes, cudaMemcpyDeviceToHost),
                         "cudaMemcpy"));
    if (std::memcmp(work.get(), pat.expected[parity]->get(), bytes) != 0) {
      return absl::DataLossError(absl::StrCat("MISMATCH in the GPU push_pull of ", bytes,
                                              " bytes, iteration ", it));
    }
  }
  if (samples != nullptr) samples->insert(samples->end(), us.begin(), us.end());
  return Summarize(std::move(us));
}

}  // namespace

absl::Status RunGpu(const Flags& f, KVStore& kv) {
  const int rank = kv.rank(), n = kv.num_workers();
  int devices = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"));
  if (devices == 0) return absl::FailedPreconditionError("--gpu: no CUDA device");
  const int device = kv.local_rank() % devices;
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  const std::vector<size_t> sizes = Sizes(f);
  if (sizes.empty()) return absl::InvalidArgumentError("no size to measure");
  const size_t max_bytes = sizes.back();
  const Patterns pat = MakePatterns(f.dtype, max_bytes / DTypeSize(f.dtype), rank, n);
  Buffer work(max_bytes);
  GpuResources gpu;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&gpu.device, max_bytes), "cudaMalloc"));
  RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&gpu.pinned, max_bytes, cudaHostAllocDefault),
                       "cudaHostAlloc"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&gpu.stream, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags"));
  if (rank == 0) {
    std::printf(
        "# hybridps-bench --gpu: dist_hybrid push_pull of GPU tensors (staged through pinned "
        "host memory) against its ceilings, %d workers, dtype %s, in place, GPU %d\n"
        "# per size: d2h/h2d = pinned cudaMemcpyAsync bandwidth (rank 0); cpu = push_pull of "
        "a CPU tensor; gpu = push_pull of a GPU tensor (every result checked exactly); the cpu "
        "and gpu iterations take turns\n"
        "# median of %d iterations after %d warmup; bandwidths S / time in GB/s (1e9 B)\n"
        "# %%ref = gpu bandwidth / min(d2h, h2d, cpu) (issue 5's target: >= 80%%)\n"
        "# %11s %9s %9s %10s %10s %8s %8s %8s %6s\n",
        n, std::string(DTypeName(f.dtype)).c_str(), device, f.iters, f.warmup, "size(B)",
        "d2h", "h2d", "cpu(us)", "gpu(us)", "cpu_bw", "gpu_bw", "ref_bw", "%ref");
    std::fflush(stdout);
  }
  double worst = -1;
  for (size_t bytes : sizes) {
    Timing d2h, h2d;
    if (rank == 0) {
      ASSIGN_OR_RETURN(d2h, MeasureCopy(f, gpu.pinned, gpu.device, bytes,
                                        cudaMemcpyDeviceToHost, gpu.stream));
      ASSIGN_OR_RETURN(h2d, MeasureCopy(f, gpu.device, gpu.pinned, bytes,
                                        cudaMemcpyHostToDevice, gpu.stream));
    }
    RETURN_IF_ERROR(kv.Barrier());
    // The CPU and the GPU push_pull take turns, one iteration each (after the warmup of
    // both), so that the two meet the same moments of a shared, noisy machine.
    Flags warm = f;
    warm.small_max_bytes = 0;  // f.warmup and f.iters at every size
    warm.iters = 0;
    Flags one = warm;
    one.warmup = 0;
    one.iters = 1;
    RETURN_IF_ERROR(MeasurePushPull(warm, kv, bytes, pat, work).status());
    RETURN_IF_ERROR(MeasureGpuPushPull(warm, kv, bytes, pat, gpu.device, device, work).status());
    std::vector<double> cpu_us, gpu_us;
    for (int it = 0; it < f.iters; ++it) {
      RETURN_IF_ERROR(MeasurePushPull(one, kv, bytes, pat, work, &cpu_us, it).status());
      RETURN_IF_ERROR(MeasureGpuPushPull(one, kv, bytes, pat, gpu.device, device, work,
                                         &gpu_us, it).status());
    }
    const Timing cpu = Summarize(std::move(cpu_us)), on_gpu = Summarize(std::move(gpu_us));
    if (rank == 0) {
      const double ref = std::min({GBps(bytes, d2h.median_us), GBps(bytes, h2d.median_us),
                                   GBps(bytes, cpu.median_us)});
      const double pct = 100 * GBps(bytes, on_gpu.median_us) / ref;
      worst = worst < 0 ? pct : std::min(worst, pct);
      std::printf("  %11zu %9.2f %9.2f %10.1f %10.1f %8.3f %8.3f %8.3f %6.1f\n", bytes,
                  GBps(bytes, d2h.median_us), GBps(bytes, h2d.median_us), cpu.median_us,
                  on_gpu.median_us, GBps(bytes, cpu.median_us), GBps(bytes, on_gpu.median_us),
                  ref, pct);
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    std::printf("# SUMMARY: GPU push_pull at worst %.1f%% of the slower reference (target >= "
                "80%%: %s)\n", worst, worst >= 80 ? "met" : "NOT MET");
    std::fflush(stdout);
  }
  return kv.Barrier();
}
#else
absl::Status RunGpu(const Flags&, KVStore&) {
  return absl::UnimplementedError("--gpu: this build has no CUDA");
}
#endif

}  // namespace hybridps::bench
