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

// The whole of a small procfs file (empty when it cannot be read).
std::string ReadSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// A schedstat file's first two numbers (nanoseconds on a CPU, and runnable
// on a run queue), or false.
bool ReadSchedstat(const std::string& path, unsigned long long* run,
                   unsigned long long* wait) {
  unsigned long long slices = 0;
  return std::sscanf(ReadSmallFile(path).c_str(), "%llu %llu %llu", run, wait,
                     &slices) == 3;
}

// The number after `key` in a /proc status text (0 when absent).
uint64_t StatusField(const std::string& status, const char* key) {
  const size_t at = status.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoull(status.c_str() + at + std::strlen(key), nullptr, 10);
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
    unsigned long long run = 0, wait = 0;
    if (ReadSchedstat(dir + "/schedstat", &run, &wait)) {
      t.cpu_seconds += 1e-9 * static_cast<double>(run);
    }
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
  unsigned long long run = 0, wait = 0;
  t.has_runqueue = ReadSchedstat("/proc/thread-self/schedstat", &run, &wait);
  if (t.has_runqueue) t.runqueue_seconds = 1e-9 * static_cast<double>(wait);
  return t;
}

}  // namespace zshard
