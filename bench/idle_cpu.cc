#include "bench/idle_cpu.h"

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace hybridps::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every process whose environment has our HYBRIDPS_SCHEDULER_PORT value: the workers and
// servers of this job. The scheduler itself was started with port 0 (it picks one and
// writes it to a file), so it is recognised by the job's token instead.
std::vector<JobProcess> FindJobProcesses(const std::string& port, const std::string& token) {
  std::vector<JobProcess> out;
  std::unique_ptr<DIR, int (*)(DIR*)> proc(opendir("/proc"), &closedir);
  if (!proc) return out;
  while (dirent* e = readdir(proc.get())) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    const std::string dir = absl::StrCat("/proc/", pid);
    std::string role, rank;
    bool same_port = false, same_token = false;
    for (absl::string_view var : absl::StrSplit(ReadFile(dir + "/environ"), '\0')) {
      auto [key, value] = std::pair<absl::string_view, absl::string_view>(
          absl::StrSplit(var, absl::MaxSplits('=', 1)));
      if (key == "HYBRIDPS_SCHEDULER_PORT") same_port = !port.empty() && value == port;
      if (key == "HYBRIDPS_JOB_TOKEN") same_token = !token.empty() && value == token;
      if (key == "HYBRIDPS_ROLE") role = std::string(value);
      if (key == "HYBRIDPS_RANK") rank = std::string(value);
    }
    if (!same_port && !(same_token && role == "scheduler")) continue;
    // argv[0]'s base name (comm is cut at 15 characters).
    std::string cmd = ReadFile(dir + "/cmdline");
    cmd = cmd.substr(0, cmd.find('\0'));
    std::string comm = cmd.substr(cmd.rfind('/') == std::string::npos ? 0 : cmd.rfind('/') + 1);
    std::string label = role.empty() ? "?" : role;
    if (role != "scheduler" && !rank.empty()) absl::StrAppend(&label, " ", rank);
    out.push_back(JobProcess{pid, absl::StrCat(label, " (", comm, ")")});
  }
  std::sort(out.begin(), out.end(),
            [](const JobProcess& a, const JobProcess& b) { return a.label < b.label; });
  return out;
}

struct CpuSample {
  bool ok = false;
  double stat_seconds = 0;  // utime + stime of /proc/PID/stat
  double run_seconds = 0;   // sum over threads of /proc/PID/task/*/schedstat (ns clock)
  int64_t switches = 0;     // context switches of every thread: wakeups
};

CpuSample SampleCpu(int pid) {
  CpuSample s;
  const std::string dir = absl::StrCat("/proc/", pid);
  const std::string stat = ReadFile(dir + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return s;
  // The fields after "(comm)" start at field 3 (state); utime and stime are 14 and 15.
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return s;
  }
  s.ok = true;
  s.stat_seconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::unique_ptr<DIR, int (*)(DIR*)> tasks(opendir((dir + "/task").c_str()), &closedir);
  while (dirent* e = tasks ? readdir(tasks.get()) : nullptr) {
    if (e->d_name[0] == '.') continue;
    const std::string t = absl::StrCat(dir, "/task/", e->d_name);
    int64_t run_ns = 0;
    std::vector<std::string> sched = absl::StrSplit(ReadFile(t + "/schedstat"), ' ');
    if (!sched.empty() && absl::SimpleAtoi(sched[0], &run_ns)) {
      s.run_seconds += static_cast<double>(run_ns) / 1e9;
    }
    for (absl::string_view line : absl::StrSplit(ReadFile(t + "/status"), '\n')) {
      if (!absl::StrContains(line, "ctxt_switches:")) continue;
      int64_t n = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)), &n)) {
        s.switches += n;
      }
    }
  }
  return s;
}


}  // namespace

std::vector<IdleFigure> MeasureIdle(double seconds, const std::string& port,
                                    const std::string& token) {
  std::vector<JobProcess> procs = FindJobProcesses(port, token);
  std::vector<CpuSample> before(procs.size());
  for (size_t i = 0; i < procs.size(); ++i) before[i] = SampleCpu(procs[i].pid);
  const Clock::time_point t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  std::vector<CpuSample> after(procs.size());
  for (size_t i = 0; i < procs.size(); ++i) after[i] = SampleCpu(procs[i].pid);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<IdleFigure> out;
  for (size_t i = 0; i < procs.size(); ++i) {
    if (!before[i].ok || !after[i].ok) continue;
    IdleFigure fig;
    fig.proc = procs[i];
    fig.cpu_pct = 100 * (after[i].stat_seconds - before[i].stat_seconds) / wall;
    fig.run_pct = 100 * (after[i].run_seconds - before[i].run_seconds) / wall;
    fig.wakeups_per_s = static_cast<double>(after[i].switches - before[i].switches) / wall;
    out.push_back(std::move(fig));
  }
  return out;
}

int64_t JobSwitches(const std::string& port, const std::string& token) {
  int64_t n = 0;
  for (const JobProcess& p : FindJobProcesses(port, token)) n += SampleCpu(p.pid).switches;
  return n;
}

int64_t ProcessSwitches(int pid) { return SampleCpu(pid).switches; }

}  // namespace hybridps::bench
