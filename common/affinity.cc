#include "common/affinity.h"

#include <dirent.h>
#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace hybridps {
namespace {

std::optional<int> ReadTopology(int cpu, const char* what) {
  std::ifstream in(absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/", what));
  int v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

cpu_set_t SetOf(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  return set;
}

// sched_setaffinity binds one thread: every thread the process has now (one that ends
// meanwhile is skipped); threads started later inherit their creator's mask.
absl::Status SetEveryThread(const cpu_set_t& set, absl::string_view what) {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) {
    return absl::InternalError(absl::StrCat("/proc/self/task: ", std::strerror(errno)));
  }
  absl::Status status;
  while (dirent* e = readdir(dir)) {
    int tid = 0;
    if (!absl::SimpleAtoi(e->d_name, &tid)) continue;
    if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH && status.ok()) {
      status = absl::InternalError(
          absl::StrCat("binding thread ", tid, " to ", what, ": ", std::strerror(errno)));
    }
  }
  closedir(dir);
  return status;
}

absl::Mutex binding_mu(absl::kConstInit);
// The process's mask before its first BindLocalRank.
std::optional<std::vector<int>> original ABSL_GUARDED_BY(binding_mu);
int bindings ABSL_GUARDED_BY(binding_mu) = 0;  // BindLocalRank calls not undone

}  // namespace

std::vector<Core> CoresOf(const std::vector<int>& cpus) {
  std::map<std::pair<int, int>, Core> by_id;  // (package, core) -> CPUs
  std::vector<Core> alone;
  for (int c : cpus) {
    const std::optional<int> package = ReadTopology(c, "physical_package_id");
    const std::optional<int> core = ReadTopology(c, "core_id");
    if (package && core) {
      by_id[{*package, *core}].push_back(c);
    } else {
      alone.push_back({c});
    }
  }
  std::vector<Core> cores = std::move(alone);
  for (auto& [id, core] : by_id) cores.push_back(std::move(core));
  std::sort(cores.begin(), cores.end());
  return cores;
}

std::vector<int> CpuShare(const std::vector<Core>& cores, int local_rank, int local_size) {
  if (cores.empty() || local_size < 1 || local_rank < 0 || local_rank >= local_size) return {};
  const size_t n = cores.size(), rank = static_cast<size_t>(local_rank);
  std::vector<int> share;
  if (n >= static_cast<size_t>(local_size)) {
    const size_t per_rank = n / static_cast<size_t>(local_size);
    for (size_t i = rank * per_rank; i < (rank + 1) * per_rank; ++i) {
      share.insert(share.end(), cores[i].begin(), cores[i].end());
    }
  } else {
    size_t widest = 0;
    for (const Core& c : cores) widest = std::max(widest, c.size());
    std::vector<int> all;  // every core's first hardware thread, then every second one, ...
    for (size_t t = 0; t < widest; ++t) {
      for (const Core& c : cores) {
        if (t < c.size()) all.push_back(c[t]);
      }
    }
    share.push_back(all[rank % all.size()]);
  }
  std::sort(share.begin(), share.end());
  return share;
}

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

absl::StatusOr<std::vector<int>> BindLocalRank(int local_rank, int local_size) {
  absl::MutexLock lock(&binding_mu);
  if (!original) {
    absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
    if (!allowed.ok()) return allowed.status();
    original = *std::move(allowed);
  }
  const std::vector<int> share = CpuShare(CoresOf(*original), local_rank, local_size);
  if (share.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot bind local rank ", local_rank,
                                                   " of ", local_size, " to the CPUs ",
                                                   CpuList(*original)));
  }
  if (absl::Status s = SetEveryThread(SetOf(share), absl::StrCat("CPUs ", CpuList(share)));
      !s.ok()) {
    SetEveryThread(SetOf(*original), "its earlier CPUs").IgnoreError();
    return s;
  }
  ++bindings;
  return AllowedCpus();
}

void UndoBinding() {
  absl::MutexLock lock(&binding_mu);
  if (bindings > 0 && --bindings == 0 && original) {
    SetEveryThread(SetOf(*original), "its earlier CPUs").IgnoreError();
  }
}

}  // namespace hybridps
