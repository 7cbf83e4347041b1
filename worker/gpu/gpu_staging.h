// GPU tensors for dist_hybrid: host staging in front of the CPU parameter-server path.
//
// A GPU tensor's operation runs in three steps on the stager's own thread
// ("hps-gpu-stage"), or on a thread waiting on the operation's handle (below):
//   1. the tensor is copied into a pinned host staging buffer (cudaMemcpyAsync on the
//      stager's own non-blocking stream, an event polled with a deadline);
//   2. the ordinary CPU operation runs on the staging buffer (in place): partitioning,
//      wire chunks, the server optimizer and, on nodes of several local ranks, the
//      shared-memory reduction apply unchanged;
//   3. the result is copied back into the output tensor (a second stream, an event) and
//      only then is the user's handle completed.
// CPU tensors go straight to the CPU path, except when an operation on the same name is
// still waiting for its copy to the host: then they queue behind it, so that operations
// on one name reach the CPU path in the order they were issued. Operations are handed to
// the CPU path in issue order (FIFO); copies to the host are all enqueued at once, so a
// big tensor's copy overlaps the network transfer of the ones before it. Except on one
// name: a GPU operation whose name has an earlier GPU operation still in the stager is
// held (with everything of its name after it) until that one has copied its result back,
// so that it reads what the earlier one wrote (two push_pulls of a tensor in place in a
// row give n times the sum, as on the CPU path); other names pass it.
//
// Waiting threads help (`waiting_threads_help`, Options::caller_rounds): a thread that
// waits on a GPU operation's handle runs the stager's steps itself (for every operation,
// one thread at a time) until its own has completed, sleeping while there is nothing to
// do, instead of waking the stager's thread and being woken back; the stager's thread
// stays idle meanwhile. Then an isolated operation needs no hand-off on the way back (the
// backend's completion wakes the waiting thread, which copies back and returns), and on
// the way out the copy to the host starts on whichever of the two threads gets there
// first. The CUDA calls made there leave the calling thread's current device as it was.
//
// Readiness: the stager's streams do not wait for the caller's streams. A GPU tensor must
// be ready (its producing kernels finished, e.g. cudaStreamSynchronize) when it is
// submitted, and must not be touched until its handle completed; when the handle has
// completed, the output is on the GPU (the copy back has finished), visible to any stream.
//
// Device rules (checked at submission, on the caller's thread): the device of the first
// GPU tensor becomes the worker's; a GPU tensor on another device, a GPU-labelled pointer
// that is not memory of that device, and an input and output on different kinds of
// device are refused with an error naming the tensor.
//
// Failures: a failed CUDA call (or a copy that does not finish within Options::op_timeout)
// fails its operation with an error naming the operation, the tensor, the GPU and the
// call; the stager is then broken: every later operation fails (the workers' rounds of
// that tensor no longer match), as after a peer's death on the CPU path.
//
// The device is behind DeviceCopier: the CUDA runtime in CUDA builds (NewCudaCopier);
// tests run the same pipeline on machines without a GPU with a host-memory stand-in.
#ifndef HYBRIDPS_WORKER_GPU_GPU_STAGING_H_
#define HYBRIDPS_WORKER_GPU_GPU_STAGING_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/options.h"
#include "common/timeline.h"
#include "worker/handle.h"

namespace hybridps {

// What staging needs from the GPU. Threading: DeviceCount and CheckPointer run on user
// threads (possibly concurrently); the rest on one thread at a time (the stager's, or a
// thread waiting on a handle, see GpuStager), Bind first; each leaves the calling
// thread's current CUDA device as it found it.
class DeviceCopier {
 public:
  enum class Direction { kToHost, kToDevice };
  virtual ~DeviceCopier() = default;
  // How many devices this process sees; an error saying why when that cannot be told.
  virtual absl::StatusOr<int> DeviceCount() = 0;
  // OK when `data` is memory of `device`; else an error saying what it is.
  virtual absl::Status CheckPointer(const void* data, int device) = 0;
  // Makes `device` the one the copies use (and creates the streams).
  virtual absl::Status Bind(int device) = 0;
  // Pinned host memory of `bytes` (> 0) bytes; FreeHost releases it (any thread).
  virtual absl::StatusOr<void*> AllocHost(size_t bytes) = 0;
  virtual void FreeHost(void* data) = 0;
  // Enqueues an asynchronous copy of `bytes` (> 0) bytes; a ticket for Poll. Copies of
  // one direction complete in the order they were started.
  virtual absl::StatusOr<uint64_t> Start(Direction direction, void* dst, const void* src,
                                         size_t bytes) = 0;
  // true once the copy has completed, false while it runs, an error naming the CUDA call
  // when it failed. A ticket that returned true or an error is spent.
  virtual absl::StatusOr<bool> Poll(uint64_t ticket) = 0;
};

// The CUDA runtime's copier (gpu_staging_cuda.cc; CUDA builds only): pinned memory from
// cudaHostAlloc (portable), one non-blocking stream per direction, an event per copy.
std::unique_ptr<DeviceCopier> NewCudaCopier();

// Pinned staging buffers, cached per tensor name so that steady-state training allocates
// nothing: an operation takes a free buffer of its name at least as large as it needs,
// else allocates one (and frees the name's smaller free buffers, which a tensor that grew
// would never use again). One buffer per name in flight; not thread-safe (the stager's
// thread).
class StagingCache {
 public:
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  using Alloc = std::function<absl::StatusOr<void*>(size_t bytes)>;
  using Free = std::function<void(void* data)>;
  StagingCache(Alloc alloc, Free free) : alloc_(std::move(alloc)), free_(std::move(free)) {}
  ~StagingCache();  // frees every buffer it holds (not the abandoned ones)
  StagingCache(const StagingCache&) = delete;
  StagingCache& operator=(const StagingCache&) = delete;

  absl::StatusOr<Buffer> Acquire(const std::string& name, size_t bytes);
  void Release(const std::string& name, Buffer buffer);
  // A buffer that a copy which never finished may still write into: neither reused nor
  // freed (leaked on purpose; the stager is broken by then).
  void Abandon(Buffer buffer) { abandoned_bytes_ += buffer.bytes; }

  uint64_t allocations() const { return allocations_; }
  size_t cached_bytes() const { return cached_bytes_; }  // allocated and not freed
  size_t abandoned_bytes() const { return abandoned_bytes_; }

 private:
  Alloc alloc_;
  Free free_;
  absl::flat_hash_map<std::string, std::vector<Buffer>> free_list_;
  uint64_t allocations_ = 0;
  size_t cached_bytes_ = 0;
  size_t abandoned_bytes_ = 0;
};

// The staging layer: the KVStore operations with GPU tensors, over a CPU backend.
class GpuStager {
 public:
  // The CPU operations (the parameter-server store's own, for CPU tensors).
  struct Backend {
    std::function<absl::StatusOr<Handle>(absl::string_view name, TensorView in,
                                         TensorView out, int priority)>
        push_pull;
    std::function<absl::StatusOr<Handle>(absl::string_view name, TensorView tensor, int root,
                                         int priority)>
        broadcast;
  };
  struct Stats {
    uint64_t gpu_ops = 0;     // GPU operations handed to the backend
    uint64_t queued_cpu_ops = 0;  // CPU operations that waited behind one of their name
    uint64_t host_allocations = 0;  // staging buffers allocated
    size_t staging_bytes = 0;       // staging memory held
    uint64_t caller_turns = 0;      // turns of the stager's steps run by waiting threads
    uint64_t held_ops = 0;  // operations held behind an unfinished GPU one of their name
  };

  // `num_workers`: for the range check of broadcast roots; `op_timeout`: the bound of
  // each copy; `waiting_threads_help`: see the file comment; `wait_grace`: see
  // Options::wait_grace. Starts the stager's thread.
  // `timeline` (may be null; it must outlive the stager): each copy becomes a span on a
  // lane of its own.
  GpuStager(std::unique_ptr<DeviceCopier> copier, Backend backend, int num_workers,
            absl::Duration op_timeout, bool waiting_threads_help = true,
            absl::Duration wait_grace = Options{}.wait_grace, Timeline* timeline = nullptr);
  // Shutdown().
  ~GpuStager();
  GpuStager(const GpuStager&) = delete;
  GpuStager& operator=(const GpuStager&) = delete;

  absl::StatusOr<Handle> PushPullAsync(absl::string_view name, TensorView in, TensorView out,
                                       int priority);
  absl::StatusOr<Handle> BroadcastAsync(absl::string_view name, TensorView tensor, int root,
                                        int priority);
  // Finishes the operations it holds (each step bounded by its deadline) and stops its
  // thread; later operations fail. The backend must keep working until this returned.
  void Shutdown();
  Stats stats();

 private:
  struct Op;
  using OpPtr = std::shared_ptr<Op>;

  absl::StatusOr<Handle> Submit(OpPtr op);
  absl::Status CheckGpuTensor(absl::string_view name, const TensorView& t,
                              absl::string_view what);
  void Loop();
  // A thread waiting on `state` (a GPU operation's handle) runs the turns until it is done
  // or its handle's deadline has passed.
  void HelpWith(HandleState* state);
  // Waits until the calling thread may run a turn (the loop is free and there is work, or
  // copies to poll), then holds the loop (loop_busy_). False: stop instead. `helper`: a
  // waiting thread (false: the stager's thread); `state`: its operation (helpers only).
  bool AwaitTurn(bool helper, HandleState* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One turn of the steps below, as the loop holder; then lets the loop go.
  void Turn();
  // The loop holder: the steps of an operation. Accept takes a new one: holds it (see
  // the file comment) or stages it.
  void Accept(const OpPtr& op);
  // Starts op's copy to the host (GPU operations) and queues it for the backend.
  void Stage(const OpPtr& op);
  void SubmitReady();
  void SubmitToBackend(const OpPtr& op);
  void Returned(const OpPtr& op, const absl::Status& status);
  // Starts op's copy of op->bytes() from src to dst; its ticket and deadline go on op.
  absl::Status StartCopy(const OpPtr& op, DeviceCopier::Direction direction, void* dst,
                         const void* src);
  void PollCopiesBack();
  // Polls op's copy: true when it is done (or failed: then `op` was failed too).
  bool CopyDone(const OpPtr& op, absl::string_view what, bool* failed);
  void Finish(const OpPtr& op, absl::Status status);
  void Fail(const OpPtr& op, absl::Status status);  // finishes op, breaks the stager
  void Unpend(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stages the operations held behind name's GPU operations, in order, up to the next GPU
  // one while a GPU operation of the name is unfinished.
  void ReleaseHeld(const std::string& name);

  const std::unique_ptr<DeviceCopier> copier_;
  Timeline* const timeline_;  // null: off
  const int timeline_lane_;
  const Backend backend_;
  const int num_workers_;
  const absl::Duration op_timeout_;
  const absl::Duration wait_grace_;

  const bool waiting_threads_help_;

  // The loop holder only (loop_busy_: the stager's thread or a helping waiting thread).
  StagingCache cache_;
  bool bound_ = false;
  std::deque<OpPtr> to_submit_;  // issue order; GPU ones copying to the host
  std::vector<OpPtr> copying_back_;
  // Per name: GPU operations accepted and not finished; operations held behind them.
  absl::flat_hash_map<std::string, int> gpu_unfinished_;
  absl::flat_hash_map<std::string, std::deque<OpPtr>> held_;

  absl::Mutex mu_;
  int device_ ABSL_GUARDED_BY(mu_) = -1;  // the first GPU tensor's device
  std::deque<OpPtr> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<OpPtr, absl::Status>> returned_ ABSL_GUARDED_BY(mu_);
  // Operations per name not yet handed to the backend.
  absl::flat_hash_map<std::string, int> pending_ ABSL_GUARDED_BY(mu_);
  size_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // operations not yet finished
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool loop_busy_ ABSL_GUARDED_BY(mu_) = false;  // a thread runs a turn
  int helpers_ ABSL_GUARDED_BY(mu_) = 0;         // waiting threads in HelpWith
  size_t copies_ ABSL_GUARDED_BY(mu_) = 0;       // in flight after the last turn
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);  // of the turns
  // Handles' wait helpers reach the stager through this (closed when it is destroyed).
  std::shared_ptr<WaitHelperGate<GpuStager>> gate_ =
      std::make_shared<WaitHelperGate<GpuStager>>(&GpuStager::HelpWith);
  absl::Mutex join_mu_;
  std::thread thread_;  // joined under join_mu_
};

}  // namespace hybridps

#endif  // HYBRIDPS_WORKER_GPU_GPU_STAGING_H_
