// The idle-CPU probe of hybridps-bench: CPU time and wake-ups of every process of a job
// while nothing is sent (the check that an idle job does not busy-poll); and the
// wake-up counts around a block of operations (context switches per round trip).
#ifndef HYBRIDPS_BENCH_IDLE_CPU_H_
#define HYBRIDPS_BENCH_IDLE_CPU_H_

#include <cstdint>
#include <string>
#include <vector>

namespace hybridps::bench {

struct JobProcess {
  int pid = 0;
  std::string label;  // "worker 0 (hybridps-bench)"
};

struct IdleFigure {
  JobProcess proc;
  double cpu_pct = 0;  // from utime + stime (clock-tick resolution)
  double run_pct = 0;  // from schedstat (ns resolution)
  double wakeups_per_s = 0;
};

// Finds this job's processes in /proc (by its scheduler port, and the scheduler by the job
// token), samples them, sleeps `seconds`, samples again.
std::vector<IdleFigure> MeasureIdle(double seconds, const std::string& port,
                                    const std::string& token);

// Context switches (voluntary and involuntary, every thread) so far: of every process of
// this job (as MeasureIdle finds them), and of process `pid` alone.
int64_t JobSwitches(const std::string& port, const std::string& token);
int64_t ProcessSwitches(int pid);

}  // namespace hybridps::bench

#endif  // HYBRIDPS_BENCH_IDLE_CPU_H_
