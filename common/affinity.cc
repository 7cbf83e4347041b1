#include "common/affinity.h"

#include <dirent.h>
#include <sched.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hybridps {

std::vector<int> CpuShare(const std::vector<int>& allowed, int local_rank, int local_size) {
  if (allowed.empty() || local_size < 1 || local_rank < 0 || local_rank >= local_size) {
    return {};
  }
  const size_t n = allowed.size();
  const size_t per_rank = std::max<size_t>(1, n / static_cast<size_t>(local_size));
  const size_t first = static_cast<size_t>(local_rank) * per_rank % n;
  std::vector<int> share;
  for (size_t i = 0; i < per_rank; ++i) share.push_back(allowed[(first + i) % n]);
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
  absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  if (!allowed.ok()) return allowed.status();
  const std::vector<int> share = CpuShare(*allowed, local_rank, local_size);
  if (share.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot bind local rank ", local_rank, " of ", local_size, " to the CPUs ",
        CpuList(*allowed)));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : share) CPU_SET(c, &set);
  // sched_setaffinity binds one thread: every thread the process has now (a thread that
  // ends meanwhile is skipped); threads started later inherit their creator's binding.
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) {
    return absl::InternalError(absl::StrCat("/proc/self/task: ", std::strerror(errno)));
  }
  absl::Status status;
  while (dirent* e = readdir(dir)) {
    int tid = 0;
    if (!absl::SimpleAtoi(e->d_name, &tid)) continue;
    if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH && status.ok()) {
      status = absl::InternalError(absl::StrCat("binding thread ", tid, " to CPUs ",
                                                CpuList(share), ": ", std::strerror(errno)));
    }
  }
  closedir(dir);
  if (!status.ok()) return status;
  return share;
}

}  // namespace hybridps
