// The CUDA runtime and NCCL, loaded when first called instead of linked: the functions
// below have the names and signatures of the ones the worker calls, and each forwards
// to the library's own, which it finds with dlopen/dlsym on first use. A build with CUDA
// therefore runs on a host without CUDA (a CPU-only host of the same wheel): there every
// call returns an error whose text says which library could not be loaded and why, and
// GPU tensors are refused with it. Which libraries: $HYBRIDPS_CUDART_LIBRARY and
// $HYBRIDPS_NCCL_LIBRARY (a path or a name for dlopen) when set, else the sonames of the
// versions built against (libcudart.so.13, libnccl.so.2) on the loader's path, else the
// files the build found (HYBRIDPS_CUDART_FILE, HYBRIDPS_NCCL_FILE: what linking them
// used to put on the binaries' run path). A process that has already loaded a library of
// the same soname gets that copy. The definitions are hidden: they bind our own calls
// only, never another library's in the same process.
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#pragma GCC visibility push(hidden)
#include <cuda_runtime_api.h>
#include <nccl.h>
#pragma GCC visibility pop

namespace {

class Library {
 public:
  // Tries `$env` when set, else `soname`, then `built`; `what` names the library in errors.
  Library(const char* what, const char* env, const std::string& soname, const char* built) {
    const char* chosen = std::getenv(env);
    std::vector<std::string> tries;
    if (chosen != nullptr && *chosen != '\0') {
      tries.push_back(chosen);
    } else {
      tries.push_back(soname);
      if (*built != '\0' && soname != built) tries.push_back(built);
    }
    std::string why;
    for (const std::string& name : tries) {
      handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle_ != nullptr) return;
      const std::string reason = dlerror() ?: "no reason given";  // it often names the file
      why += (why.empty() ? "" : "; ") +
             (reason.rfind(name, 0) == 0 ? reason : name + ": " + reason);
    }
    error_ = "hybridps could not load the " + std::string(what) + " (" + why +
             "): this host has no usable " + what + "; install it, or set " + env +
             " to its path";
  }
  void* Symbol(const char* symbol) const {
    return handle_ == nullptr ? nullptr : dlsym(handle_, symbol);
  }
  bool loaded() const { return handle_ != nullptr; }
  const char* error() const { return error_.c_str(); }

 private:
  void* handle_ = nullptr;
  std::string error_;
};

// Never destroyed: a thread or a destructor may still ask for an error text at exit.
const Library& Cudart() {
  static const Library& lib = *new Library(
      "CUDA runtime", "HYBRIDPS_CUDART_LIBRARY",
      "libcudart.so." + std::to_string(CUDART_VERSION / 1000) +
          (CUDART_VERSION >= 12000 ? "" : ".0"),
      HYBRIDPS_CUDART_FILE);
  return lib;
}

const Library& Nccl() {
  static const Library& lib = *new Library("NCCL", "HYBRIDPS_NCCL_LIBRARY",
                                           "libnccl.so." + std::to_string(NCCL_MAJOR),
                                           HYBRIDPS_NCCL_FILE);
  return lib;
}

// What a forwarded call returns when its library or symbol is missing.
constexpr cudaError_t kCudartMissing = cudaErrorSharedObjectInitFailed;
constexpr ncclResult_t kNcclMissing = ncclSystemError;

}  // namespace

// The body of a forwarding function of type `type`: the library's own `name`, looked up
// once.
#define HPS_FORWARD_AS(type, lib, missing, name, ...)                \
  static const auto real = reinterpret_cast<type>(lib().Symbol(#name)); \
  if (real == nullptr) return missing;                                 \
  return real(__VA_ARGS__)
#define HPS_FORWARD(lib, missing, name, ...) \
  HPS_FORWARD_AS(decltype(&::name), lib, missing, name, __VA_ARGS__)
#define HPS_CUDART(name, ...) HPS_FORWARD(Cudart, kCudartMissing, name, __VA_ARGS__)
#define HPS_NCCL(name, ...) HPS_FORWARD(Nccl, kNcclMissing, name, __VA_ARGS__)

extern "C" {

// ---- CUDA runtime -----------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) { HPS_CUDART(cudaGetDeviceCount, count); }
cudaError_t cudaSetDevice(int device) { HPS_CUDART(cudaSetDevice, device); }
cudaError_t cudaGetDevice(int* device) { HPS_CUDART(cudaGetDevice, device); }
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  HPS_CUDART(cudaDeviceGetPCIBusId, id, len, device);
}
cudaError_t cudaDeviceSynchronize(void) { HPS_CUDART(cudaDeviceSynchronize); }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  HPS_CUDART(cudaPointerGetAttributes, attributes, ptr);
}
// cudaMalloc and cudaHostAlloc have C++ template overloads too (cuda_runtime.h).
cudaError_t cudaMalloc(void** ptr, size_t size) {
  HPS_FORWARD_AS(cudaError_t (*)(void**, size_t), Cudart, kCudartMissing, cudaMalloc, ptr, size);
}
cudaError_t cudaFree(void* ptr) { HPS_CUDART(cudaFree, ptr); }
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  HPS_FORWARD_AS(cudaError_t (*)(void**, size_t, unsigned int), Cudart, kCudartMissing,
                 cudaHostAlloc, ptr, size, flags);
}
cudaError_t cudaFreeHost(void* ptr) { HPS_CUDART(cudaFreeHost, ptr); }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  HPS_CUDART(cudaMemcpy, dst, src, count, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  HPS_CUDART(cudaMemcpyAsync, dst, src, count, kind, stream);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  HPS_CUDART(cudaStreamCreateWithFlags, stream, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) { HPS_CUDART(cudaStreamDestroy, stream); }
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  HPS_CUDART(cudaStreamSynchronize, stream);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  HPS_CUDART(cudaEventCreateWithFlags, event, flags);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) { HPS_CUDART(cudaEventDestroy, event); }
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  HPS_CUDART(cudaEventRecord, event, stream);
}
cudaError_t cudaEventQuery(cudaEvent_t event) { HPS_CUDART(cudaEventQuery, event); }

const char* cudaGetErrorString(cudaError_t error) {
  if (!Cudart().loaded()) return Cudart().error();
  HPS_FORWARD(Cudart, "cudaGetErrorString missing from the CUDA runtime", cudaGetErrorString,
              error);
}
const char* cudaGetErrorName(cudaError_t error) {
  if (!Cudart().loaded()) return "cudaErrorSharedObjectInitFailed";
  HPS_FORWARD(Cudart, "cudaGetErrorName missing from the CUDA runtime", cudaGetErrorName,
              error);
}

// ---- NCCL -------------------------------------------------------------------------------
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { HPS_NCCL(ncclGetUniqueId, id); }
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  HPS_NCCL(ncclCommInitRankConfig, comm, nranks, id, rank, config);
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) { HPS_NCCL(ncclCommFinalize, comm); }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { HPS_NCCL(ncclCommDestroy, comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { HPS_NCCL(ncclCommAbort, comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* result) {
  HPS_NCCL(ncclCommGetAsyncError, comm, result);
}
ncclResult_t ncclGroupStart(void) { HPS_NCCL(ncclGroupStart); }
ncclResult_t ncclGroupEnd(void) { HPS_NCCL(ncclGroupEnd); }
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  HPS_NCCL(ncclAllReduce, send, recv, count, type, op, comm, stream);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  HPS_NCCL(ncclReduce, send, recv, count, type, op, root, comm, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  HPS_NCCL(ncclBroadcast, send, recv, count, type, root, comm, stream);
}
const char* ncclGetErrorString(ncclResult_t result) {
  if (!Nccl().loaded()) return Nccl().error();
  HPS_FORWARD(Nccl, "ncclGetErrorString missing from NCCL", ncclGetErrorString, result);
}
const char* ncclGetLastError(ncclComm_t comm) {
  if (!Nccl().loaded()) return Nccl().error();
  HPS_FORWARD(Nccl, "ncclGetLastError missing from NCCL", ncclGetLastError, comm);
}

}  // extern "C"
