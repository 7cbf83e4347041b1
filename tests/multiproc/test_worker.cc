// hybridps-test-worker: the worker of the multi-process tests (test_multiproc.py), started
// by hybridrun or by the test itself with the usual HYBRIDPS_* variables. Each round it
// push_pulls a few tensors at once (with a small HYBRIDPS_PARTITION_BYTES the larger ones
// span several partitions and every server), checks every element of every sum exactly,
// and prints "round K ok". The store is HYBRIDPS_BACKEND's (dist_hybrid by default).
//
//   --rounds N                   rounds to run (default 5)
//   --sleep-ms MS                pause after each round (default 0)
//   --die-rank R --die-round K   worker R kills itself with SIGKILL at the start of
//                                round K, before pushing anything
//   --leave-rank R --leave-round K  worker R leaves at the start of round K: shuts its
//                                store down and exits 0 (a script that ran fewer steps)
//   --hang-rank R --hang-round K worker R stops at the start of round K (sleeps, alive,
//                                heartbeating) until it is killed
//   --slow-rank R --slow-ms M    worker R sleeps M ms more than the others each round,
//                                before it pushes (a straggler)
//   --expect-failure             an operation is expected to fail (a peer is killed)
//   --gpu                        the tensors live on GPU `rank % devices` (dist_allreduce
//                                with NCCL, or dist_hybrid staging them through host
//                                memory); copied there before and back after each round
//   --same-gpu                   with --gpu: every rank on GPU 0
//   --name-prefix P              the tensors' names start with P (a test can look for it)
//   --count-gpus                 prints "gpus N" (CUDA's device count; 0 without a GPU
//                                or without CUDA in the build) and exits
//   --shared-gpu                 several NCCL ranks on one GPU (tests on a one-GPU
//                                machine): gives this process its own NCCL_HOSTID, so that
//                                NCCL takes each rank for a host of its own (its check
//                                refuses two ranks of one host on one GPU) and connects the
//                                ranks over its socket transport on loopback. Test use only:
//                                the ranks' kernels then share the GPU by time slices.
//
// Exit status: 0 when every round was right; 3 when an operation failed and
// --expect-failure was given, 1 when it was not (the error is printed on one line,
// "hybridps-test-worker: error: MESSAGE"); 1 for a wrong sum; 2 for bad flags.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/options.h"
#include "worker/kvstore.h"
#if HYBRIDPS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr char kProgram[] = "hybridps-test-worker";

struct Flags {
  int rounds = 5;
  int sleep_ms = 0;
  int die_rank = -1;
  int die_round = -1;
  int leave_rank = -1;
  int hang_rank = -1;
  int hang_round = -1;
  int slow_rank = -1;
  int slow_ms = 0;
  int leave_round = -1;
  bool expect_failure = false;
  bool gpu = false;
  bool count_gpus = false;
  bool shared_gpu = false;
  bool same_gpu = false;
  std::string name_prefix;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    bool* toggle = k == "--expect-failure" ? &f->expect_failure
                   : k == "--gpu"            ? &f->gpu
                   : k == "--count-gpus"     ? &f->count_gpus
                   : k == "--shared-gpu"     ? &f->shared_gpu
                   : k == "--same-gpu"       ? &f->same_gpu
                                             : nullptr;
    if (toggle != nullptr) {
      *toggle = true;
      continue;
    }
    if (k == "--name-prefix" && i + 1 < argc) {
      f->name_prefix = argv[++i];
      continue;
    }
    int* target = k == "--rounds"      ? &f->rounds
                  : k == "--sleep-ms"  ? &f->sleep_ms
                  : k == "--die-rank"  ? &f->die_rank
                  : k == "--die-round" ? &f->die_round
                  : k == "--leave-rank" ? &f->leave_rank
                  : k == "--hang-rank" ? &f->hang_rank
                  : k == "--hang-round" ? &f->hang_round
                  : k == "--slow-rank" ? &f->slow_rank
                  : k == "--slow-ms" ? &f->slow_ms
                  : k == "--leave-round" ? &f->leave_round
                                       : nullptr;
    if (target == nullptr || i + 1 >= argc || !absl::SimpleAtoi(argv[i + 1], target)) {
      std::fprintf(stderr, "%s: bad flag %s\n", kProgram, k.c_str());
      return false;
    }
    ++i;
  }
  return true;
}

// Worker `rank`'s element i of tensor `salt` in round `round`: a small integer, so the
// sum over the workers is exact in every dtype.
int64_t Value(size_t i, int rank, int round, int salt) {
  return static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 3 +
                               static_cast<size_t>(round) * 5 + static_cast<size_t>(salt)) %
                              13);
}

struct Tensor {
  std::string name;
  hybridps::DType dtype;
  size_t count;
  std::vector<char> bytes;

  void* device_data = nullptr;  // --gpu: the tensor on the GPU (bytes: its host copy)
  int device = 0;

  hybridps::TensorView view() {
    if (device_data == nullptr) return hybridps::TensorView{bytes.data(), count, dtype};
    return hybridps::TensorView{device_data, count, dtype, hybridps::Device::kGPU, device};
  }
  void Set(size_t i, int64_t v) {
    switch (dtype) {
      case hybridps::DType::kFloat32:
        reinterpret_cast<float*>(bytes.data())[i] = static_cast<float>(v);
        break;
      case hybridps::DType::kInt64:
        reinterpret_cast<int64_t*>(bytes.data())[i] = v;
        break;
      default:
        std::abort();  // only the dtypes made below
    }
  }
  int64_t Get(size_t i) const {
    switch (dtype) {
      case hybridps::DType::kFloat32:
        return static_cast<int64_t>(reinterpret_cast<const float*>(bytes.data())[i]);
      case hybridps::DType::kInt64:
        return reinterpret_cast<const int64_t*>(bytes.data())[i];
      default:
        std::abort();
    }
  }
};

Tensor MakeTensor(std::string name, hybridps::DType dtype, size_t count) {
  return Tensor{std::move(name), dtype, count,
                std::vector<char>(count * hybridps::DTypeSize(dtype))};
}

// Prints `status` as the one error line the tests look for; returns the exit status.
int Fail(const Flags& flags, const absl::Status& status) {
  const std::string one_line = absl::StrReplaceAll(status.ToString(), {{"\r", " "}, {"\n", " "}});
  std::fprintf(stderr, "%s: error: %s\n", kProgram, one_line.c_str());
  std::fflush(stderr);
  return flags.expect_failure ? 3 : 1;
}

int CountGpus() {
  int n = 0;
#if HYBRIDPS_WITH_CUDA
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
#endif
  std::printf("gpus %d\n", n);
  return 0;
}

#if HYBRIDPS_WITH_CUDA
absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
#endif

// --gpu: allocates the tensors' GPU copies on the GPU of `rank`, or copies them one way.
enum class Copy { kAllocate, kToDevice, kToHost };
// `rank`: the tensors go to GPU rank % devices.
absl::Status OnGpu(std::vector<Tensor>& tensors, int rank, Copy copy) {
#if HYBRIDPS_WITH_CUDA
  int devices = 0;
  if (absl::Status s = Cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"); !s.ok()) {
    return s;
  }
  const int device = rank % devices;
  if (absl::Status s = Cuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  for (Tensor& t : tensors) {
    absl::Status s;
    if (copy == Copy::kAllocate) {
      t.device = device;
      s = Cuda(cudaMalloc(&t.device_data, t.bytes.size() + 1), "cudaMalloc");
    } else if (copy == Copy::kToDevice) {
      s = Cuda(cudaMemcpy(t.device_data, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice),
               "cudaMemcpy");
    } else {
      s = Cuda(cudaMemcpy(t.bytes.data(), t.device_data, t.bytes.size(), cudaMemcpyDeviceToHost),
               "cudaMemcpy");
    }
    if (!s.ok()) return s;
  }
  // The store's stream does not wait for ours: the data must have landed.
  return Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  return absl::UnimplementedError("--gpu: this build has no CUDA");
#endif
}

int Run(const Flags& flags) {
  auto options = hybridps::OptionsFromEnvironment();
  if (!options.ok()) return Fail(flags, options.status());
  // Declared before the store, so they outlive any operation its destructor finishes.
  std::vector<Tensor> tensors;
  tensors.push_back(MakeTensor(flags.name_prefix + "t.small", hybridps::DType::kFloat32, 7));
  tensors.push_back(MakeTensor(flags.name_prefix + "t.multi", hybridps::DType::kFloat32, 10000));
  tensors.push_back(MakeTensor(flags.name_prefix + "t.int64", hybridps::DType::kInt64, 3001));
  tensors.push_back(MakeTensor(flags.name_prefix + "t.empty", hybridps::DType::kFloat32, 0));
  // Over dist_allreduce's eager limits: reduced by a collective (Gloo's ring, or shared
  // memory on one node) even when the ranks are in step.
  tensors.push_back(MakeTensor(flags.name_prefix + "t.large", hybridps::DType::kFloat32, 300001));

  auto created = hybridps::KVStore::Create(options->backend, *options);
  if (!created.ok()) return Fail(flags, created.status());
  std::unique_ptr<hybridps::KVStore> kv = std::move(*created);
  const int rank = kv->rank();
  const int size = kv->num_workers();
  const int gpu_rank = flags.same_gpu ? 0 : rank;
  if (flags.gpu) {
    if (absl::Status s = OnGpu(tensors, gpu_rank, Copy::kAllocate); !s.ok()) {
      return Fail(flags, s);
    }
  }

  for (int round = 0; round < flags.rounds; ++round) {
    if (rank == flags.die_rank && round == flags.die_round) {
      std::printf("worker %d: dying at round %d\n", rank, round);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (rank == flags.hang_rank && round == flags.hang_round) {
      std::printf("worker %d: hanging at round %d\n", rank, round);
      std::fflush(stdout);
      absl::SleepFor(absl::Hours(1));
    }
    if (rank == flags.slow_rank) absl::SleepFor(absl::Milliseconds(flags.slow_ms));
    if (rank == flags.leave_rank && round == flags.leave_round) {
      std::printf("worker %d: leaving at round %d\n", rank, round);
      std::fflush(stdout);
      if (absl::Status s = kv->Shutdown(); !s.ok()) return Fail(flags, s);
      return 0;
    }
    std::vector<hybridps::Handle> handles;
    for (size_t t = 0; t < tensors.size(); ++t) {
      Tensor& x = tensors[t];
      for (size_t i = 0; i < x.count; ++i) x.Set(i, Value(i, rank, round, static_cast<int>(t)));
    }
    if (flags.gpu) {
      if (absl::Status s = OnGpu(tensors, gpu_rank, Copy::kToDevice); !s.ok()) {
        return Fail(flags, s);
      }
    }
    for (size_t t = 0; t < tensors.size(); ++t) {
      Tensor& x = tensors[t];
      auto h = kv->PushPullAsync(x.name, x.view(), x.view(), static_cast<int>(t % 2));
      if (!h.ok()) return Fail(flags, h.status());
      handles.push_back(*h);
    }
    absl::Status first_error;
    for (auto& h : handles) {
      absl::Status s = h.Wait();
      if (!s.ok() && first_error.ok()) first_error = s;
    }
    if (!first_error.ok()) return Fail(flags, first_error);
    if (flags.gpu) {
      if (absl::Status s = OnGpu(tensors, gpu_rank, Copy::kToHost); !s.ok()) {
        return Fail(flags, s);
      }
    }
    for (size_t t = 0; t < tensors.size(); ++t) {
      const Tensor& x = tensors[t];
      for (size_t i = 0; i < x.count; ++i) {
        int64_t want = 0;
        for (int r = 0; r < size; ++r) want += Value(i, r, round, static_cast<int>(t));
        if (x.Get(i) != want) {
          std::fprintf(stderr,
                       "%s: wrong result: '%s' element %zu in round %d is %lld, "
                       "expected %lld\n",
                       kProgram, x.name.c_str(), i, round, static_cast<long long>(x.Get(i)),
                       static_cast<long long>(want));
          return 1;
        }
      }
    }
    std::printf("round %d ok\n", round);
    std::fflush(stdout);
    if (flags.sleep_ms > 0) absl::SleepFor(absl::Milliseconds(flags.sleep_ms));
  }
  if (absl::Status s = kv->Barrier(); !s.ok()) return Fail(flags, s);
  if (absl::Status s = kv->Shutdown(); !s.ok()) return Fail(flags, s);
  std::printf("worker %d: all %d rounds ok\n", rank, flags.rounds);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  if (flags.count_gpus) return CountGpus();
  if (flags.shared_gpu) {  // before anything can initialise NCCL
    const std::string host = absl::StrCat("hybridps-test-pid-", getpid());
    setenv("NCCL_HOSTID", host.c_str(), 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  }
  return Run(flags);
}
