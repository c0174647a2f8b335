// The calling thread's time as the kernel accounts it: on a CPU, and
// runnable but waiting for one (preempted, or queued behind other threads).
// A step's wall time less both is the time the thread slept (blocked).
#ifndef ZSHARD_COMMON_BASE_THREAD_TIMES_H_
#define ZSHARD_COMMON_BASE_THREAD_TIMES_H_

#include <cstdint>
#include <map>
#include <string>

namespace zshard {

struct ThreadTimes {
  // CPU time so far (CLOCK_THREAD_CPUTIME_ID).
  double cpu_seconds = 0;
  // Time spent runnable on a run queue so far (the second field of
  // /proc/thread-self/schedstat); 0 when has_runqueue is false.
  double runqueue_seconds = 0;
  // False where the kernel keeps no scheduler statistics (no
  // CONFIG_SCHED_INFO, or no /proc).
  bool has_runqueue = false;
};

// The calling thread's times. Reads a procfs file: a few microseconds; call
// it per step, not per operation. Never fails.
ThreadTimes CurrentThreadTimes();

// What the threads of one name (the kernel's comm, at most 15 characters)
// have used so far, summed over the live threads of that name.
struct NamedThreadTotals {
  uint32_t threads = 0;
  // On a CPU (the first field of each thread's schedstat; 0 where the
  // kernel keeps no scheduler statistics, as ThreadTimes::has_runqueue).
  double cpu_seconds = 0;
  uint64_t voluntary_switches = 0;    // the thread blocked
  uint64_t involuntary_switches = 0;  // it was preempted
};

// This process's live threads by name, from /proc/self/task (threads that
// ended are not counted). Reads a few procfs files per thread: call it once
// per run, not per step. Empty where there is no /proc; never fails.
std::map<std::string, NamedThreadTotals> ThreadTotalsByName();

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_THREAD_TIMES_H_
