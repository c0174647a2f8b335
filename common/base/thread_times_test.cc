#include "common/base/thread_times.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zshard {
namespace {

// Spins for `seconds` of wall time; returns a value so it is not elided.
unsigned Spin(double seconds) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  unsigned x = 1;
  while (std::chrono::steady_clock::now() < end) x = x * 1664525u + 1u;
  return x;
}

TEST(ThreadTimesTest, CpuGrowsWhileTheThreadComputesNotWhileItSleeps) {
  const ThreadTimes a = CurrentThreadTimes();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const ThreadTimes b = CurrentThreadTimes();
  EXPECT_LT(b.cpu_seconds - a.cpu_seconds, 0.05);
  volatile unsigned sink = Spin(0.2);
  (void)sink;
  const ThreadTimes c = CurrentThreadTimes();
  // Spinning 0.2 s of wall time is on a CPU or waiting for one.
  const double busy = (c.cpu_seconds - b.cpu_seconds) +
                      (c.runqueue_seconds - b.runqueue_seconds);
  EXPECT_GT(busy, 0.15);
  EXPECT_GE(c.cpu_seconds, b.cpu_seconds);
  EXPECT_GE(c.runqueue_seconds, b.runqueue_seconds);
}

TEST(ThreadTimesTest, ThreadsQueuedBehindEachOtherWaitOnTheRunQueue) {
  if (!CurrentThreadTimes().has_runqueue) {
    GTEST_SKIP() << "this kernel keeps no /proc/thread-self/schedstat";
  }
  // More spinning threads than CPUs: together they wait at least as long as
  // the spins that could not run at once.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const unsigned n = 2 * cpus;
  std::vector<double> waits(n);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n; ++i) {
    threads.emplace_back([i, &waits] {
      const ThreadTimes a = CurrentThreadTimes();
      volatile unsigned sink = Spin(0.3);
      (void)sink;
      waits[i] = CurrentThreadTimes().runqueue_seconds - a.runqueue_seconds;
    });
  }
  for (auto& t : threads) t.join();
  double total = 0;
  for (double w : waits) total += w;
  // n threads x 0.3 s on `cpus` CPUs: about (n - cpus) x 0.3 s of waiting.
  EXPECT_GT(total, 0.3 * (n - cpus) * 0.5);
}

}  // namespace
}  // namespace zshard
