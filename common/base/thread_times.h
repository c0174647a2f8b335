// The calling thread's time as the kernel accounts it: on a CPU, and
// runnable but waiting for one (preempted, or queued behind other threads).
// A step's wall time less both is the time the thread slept (blocked).
#ifndef ZSHARD_COMMON_BASE_THREAD_TIMES_H_
#define ZSHARD_COMMON_BASE_THREAD_TIMES_H_

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

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_THREAD_TIMES_H_
