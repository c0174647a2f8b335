#include "server/rpc/wait_threads.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(WaitThreadsTest, EveryWaitRunsAtOnceOnAThreadOfItsOwn) {
  WaitThreads waits(8);
  absl::Notification release;
  std::atomic<int> started{0}, finished{0};
  // Five waits that all block until released: none queues behind another.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(waits
                    .Run([&](const std::function<bool()>&) {
                      ++started;
                      release.WaitForNotificationWithTimeout(absl::Seconds(20));
                      ++finished;
                    })
                    .ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (started.load() < 5 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(started.load(), 5);
  EXPECT_EQ(waits.threads(), 5u);
  release.Notify();
  while (finished.load() < 5 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(finished.load(), 5);
  // Idle threads are reused.
  absl::Notification done;
  ASSERT_TRUE(
      waits.Run([&](const std::function<bool()>&) { done.Notify(); }).ok());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(waits.threads(), 5u);
}

TEST(WaitThreadsTest, BeyondTheBoundAWaitIsRefusedAndStopCancels) {
  WaitThreads waits(2);
  std::atomic<int> cancelled_seen{0};
  auto wait_until_cancelled = [&](const std::function<bool()>& cancelled) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!cancelled() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (cancelled()) ++cancelled_seen;
  };
  ASSERT_TRUE(waits.Run(wait_until_cancelled).ok());
  ASSERT_TRUE(waits.Run(wait_until_cancelled).ok());
  absl::Status third = waits.Run(wait_until_cancelled);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_NE(third.message().find("2 transport calls"), std::string::npos)
      << third;
  const absl::Time before = absl::Now();
  waits.Stop();
  EXPECT_LT(absl::Now() - before, absl::Seconds(10));
  EXPECT_EQ(cancelled_seen.load(), 2);
  EXPECT_EQ(waits.Run(wait_until_cancelled).code(),
            absl::StatusCode::kUnavailable);
  waits.Stop();  // idempotent
}

}  // namespace
}  // namespace zshard
