#include "common/base/thread_name.h"

#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/base/thread_pool.h"
#include "gtest/gtest.h"

namespace zshard {
namespace {

// The name a new thread reads back after naming itself `name`.
std::string NameInNewThread(const std::string& name) {
  std::string inside;
  std::thread t([&] {
    NameCurrentThread(name);
    inside = CurrentThreadName();
  });
  t.join();
  return inside;
}

TEST(ThreadNameTest, NamesTheCallingThreadOnly) {
  const std::string before = CurrentThreadName();
  EXPECT_EQ(NameInNewThread("zs-test"), "zs-test");
  EXPECT_EQ(CurrentThreadName(), before);
}

TEST(ThreadNameTest, LongNamesAreCutTo15Bytes) {
  EXPECT_EQ(NameInNewThread("zs-a-very-long-thread-name"), "zs-a-very-long-");
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
