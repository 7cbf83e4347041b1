// KVStore::Create: the one place that knows every store. The stores below worker/ never
// include each other; only this file sees them all.
#include "absl/strings/str_cat.h"
#include "common/affinity.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/kvstore.h"
#include "worker/ps/ps_store.h"
#if HYBRIDPS_WITH_CUDA
#include "worker/ps/ps_gpu.h"
#endif
#if HYBRIDPS_HAVE_GLOO
#include "worker/allreduce/allreduce_store.h"
#endif

namespace hybridps {
namespace {

// The store of `type` (the stores below worker/ never include each other).
absl::StatusOr<std::unique_ptr<KVStore>> CreateStore(absl::string_view type,
                                                     const Options& options,
                                                     std::shared_ptr<Context> ctx) {
  if (type == "dist_hybrid") {
#if HYBRIDPS_WITH_CUDA  // GPU tensors staged through pinned host memory (ps_gpu.h)
    ASSIGN_OR_RETURN(auto store, PsGpuStore::Create(std::move(ctx), options, NewCudaCopier()));
#else
    ASSIGN_OR_RETURN(auto store, PsStore::Create(std::move(ctx), options));
#endif
    return std::unique_ptr<KVStore>(std::move(store));
  }
  if (type == "dist_allreduce") {
#if HYBRIDPS_HAVE_GLOO
    ASSIGN_OR_RETURN(auto store, AllreduceStore::Create(std::move(ctx), options));
    return std::unique_ptr<KVStore>(std::move(store));
#else
    return absl::UnimplementedError(
        "this build has no dist_allreduce store: it needs Gloo (install libgloo-dev and "
        "re-run cmake; HYBRIDPS_WITH_GLOO=ON makes its absence an error)");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KVStore type '", type, "' (known: dist_hybrid, dist_allreduce)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KVStore>> KVStore::Create(absl::string_view type,
                                                         const Options& options,
                                                         std::shared_ptr<Context> ctx) {
  if (!ctx) ctx = std::make_shared<Context>();
  SetLogLevel(options.log_level);  // HYBRIDPS_LOG_LEVEL, as the scheduler and servers do
  HandleState::SetWaitSpin(options.spin);
  if (options.bind_to == "core") {  // before the store starts its threads: they inherit it
    absl::StatusOr<std::vector<int>> cpus =
        BindLocalRank(options.local_rank, options.local_size);
    if (!cpus.ok()) {
      return absl::Status(cpus.status().code(), absl::StrCat("HYBRIDPS_BIND_TO=core: ",
                                                             cpus.status().message()));
    }
    HPS_LOG(INFO) << "local rank " << options.local_rank << " of " << options.local_size
                  << " bound to CPUs " << CpuList(*cpus) << " (HYBRIDPS_BIND_TO=core)";
  }
  absl::StatusOr<std::unique_ptr<KVStore>> store = CreateStore(type, options, std::move(ctx));
  if (!store.ok() && options.bind_to == "core") UndoBinding();  // as it was before
  return store;
}

}  // namespace hybridps
