#include "common/base/thread_times.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

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

// The whole of a small procfs file (empty when it cannot be read).
std::string ReadSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// The number after `key` in a /proc status text (0 when absent).
uint64_t StatusField(const std::string& status, const char* key) {
  const size_t at = status.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoull(status.c_str() + at + std::strlen(key), nullptr, 10);
}

// A thread's CPU seconds from its task directory: schedstat's run time, or
// stat's utime + stime (fields 14 and 15, after the parenthesized name).
double TaskCpuSeconds(const std::string& dir) {
  unsigned long long run = 0, wait = 0, slices = 0;
  const std::string sched = ReadSmallFile(dir + "/schedstat");
  if (std::sscanf(sched.c_str(), "%llu %llu %llu", &run, &wait, &slices) == 3) {
    return 1e-9 * static_cast<double>(run);
  }
  const std::string stat = ReadSmallFile(dir + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  unsigned long long utime = 0, stime = 0;
  // State, then fields 4-13, then utime and stime.
  if (std::sscanf(stat.c_str() + close + 1,
                  " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                  &utime, &stime) != 2) {
    return 0;
  }
  return static_cast<double>(utime + stime) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

std::map<std::string, NamedThreadTotals> ThreadTotalsByName() {
  std::map<std::string, NamedThreadTotals> totals;
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return totals;
  while (const dirent* e = ::readdir(tasks)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::string name = ReadSmallFile(dir + "/comm");
    if (name.empty()) continue;  // ended meanwhile
    if (name.back() == '\n') name.pop_back();
    const std::string status = ReadSmallFile(dir + "/status");
    NamedThreadTotals& t = totals[name];
    ++t.threads;
    t.cpu_seconds += TaskCpuSeconds(dir);
    t.voluntary_switches += StatusField(status, "\nvoluntary_ctxt_switches:");
    t.involuntary_switches +=
        StatusField(status, "\nnonvoluntary_ctxt_switches:");
  }
  ::closedir(tasks);
  return totals;
}

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
