#include "common/base/thread_times.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

namespace zshard {
namespace {

// The second of /proc/thread-self/schedstat's three numbers (run time, run
// queue wait, time slices; nanoseconds), or false.
bool ReadRunqueueNanos(unsigned long long* wait) {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  unsigned long long run = 0, slices = 0;
  return std::sscanf(buf, "%llu %llu %llu", &run, wait, &slices) == 3;
}

}  // namespace

ThreadTimes CurrentThreadTimes() {
  ThreadTimes t;
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  t.cpu_seconds =
      static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  unsigned long long wait = 0;
  t.has_runqueue = ReadRunqueueNanos(&wait);
  if (t.has_runqueue) t.runqueue_seconds = 1e-9 * static_cast<double>(wait);
  return t;
}

}  // namespace zshard
