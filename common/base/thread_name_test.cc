#include "common/base/thread_name.h"

#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/base/thread_pool.h"
#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(ThreadNameTest, NamesTheCallingThreadOnly) {
  const std::string before = CurrentThreadName();
  std::string inside;
  std::thread t([&] {
    NameCurrentThread("zs-test");
    inside = CurrentThreadName();
  });
  t.join();
  EXPECT_EQ(inside, "zs-test");
  EXPECT_EQ(CurrentThreadName(), before);
}

TEST(ThreadNameTest, LongNamesAreCutTo15Bytes) {
  std::string inside;
  std::thread t([&] {
    NameCurrentThread("zs-a-very-long-thread-name");
    inside = CurrentThreadName();
  });
  t.join();
  EXPECT_EQ(inside, "zs-a-very-long-");
}

TEST(ThreadNameTest, PoolWorkersCarryThePoolsName) {
  std::string inside;
  absl::Notification done;
  {
    ThreadPool pool(2, "zs-test-pool");
    pool.Schedule([&] {
      inside = CurrentThreadName();
      done.Notify();
    });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  EXPECT_EQ(inside, "zs-test-pool");
}

}  // namespace
}  // namespace zshard
