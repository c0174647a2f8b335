#include "common/base/thread_times.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/base/thread_name.h"
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

TEST(ThreadTimesTest, TotalsByNameCountEachNamedThreadsCpuAndSwitches) {
  // Two threads of one name: each spins 0.1 s, then sleeps twice (blocks),
  // and stays alive until the totals are read.
  absl::Notification spun[2], read;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      NameCurrentThread("zs-times-test");
      volatile unsigned sink = Spin(0.1);
      (void)sink;
      for (int k = 0; k < 2; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      spun[i].Notify();
      read.WaitForNotification();
    });
  }
  for (auto& s : spun) s.WaitForNotification();
  const auto totals = ThreadTotalsByName();
  read.Notify();
  for (auto& t : threads) t.join();
  if (totals.empty()) GTEST_SKIP() << "no /proc/self/task here";
  const auto it = totals.find("zs-times-test");
  ASSERT_NE(it, totals.end());
  EXPECT_EQ(it->second.threads, 2u);
  if (CurrentThreadTimes().has_runqueue) {
    // 0.2 s of spinning between them, less what waited for a CPU.
    EXPECT_GT(it->second.cpu_seconds, 0.05);
    EXPECT_LT(it->second.cpu_seconds, 5.0);
  }
  // Each slept at least twice, and waited for the notification.
  EXPECT_GE(it->second.voluntary_switches, 4u);
  // The test's own thread is counted under its own name.
  EXPECT_NE(totals.find(CurrentThreadName()), totals.end());
  // Ended threads are not.
  EXPECT_EQ(ThreadTotalsByName().count("zs-times-test"), 0u);
}

}  // namespace
}  // namespace zshard
