// The host cache: publish and read across attachments and processes, the
// sequence lock's answers, and the checks at Open.
#include "client/core/host_cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace zshard {
namespace {

std::string TestName(const std::string& what) {
  return absl::StrCat("/zshard-test-", getpid(), "-", what);
}

bool Exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(HostCacheTest, ReadsWhatAnotherAttachmentPublished) {
  const std::string name = TestName("publish");
  auto a = HostCache::Open(name, {400, 40}, 2, 2, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(Exists(name));
  auto b = HostCache::Open(name, {400, 40}, 2, 2, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  // Both members are in: the name is gone, the memory stays.
  EXPECT_FALSE(Exists(name));
  std::vector<float> slice(50);
  std::iota(slice.begin(), slice.end(), 1.0f);
  EXPECT_FALSE((*b)->Has(0, 1, 7));
  (*a)->Publish(0, 1, 7, 200, slice.data(), 200);
  EXPECT_TRUE((*b)->Has(0, 1, 7));
  EXPECT_FALSE((*b)->Has(0, 0, 7));
  EXPECT_FALSE((*b)->Has(0, 1, 8));
  std::vector<float> got(50);
  ASSERT_TRUE(
      (*b)->Read(0, 1, 7, 200, got.data(), 200, absl::Now() + absl::Seconds(5))
          .ok());
  EXPECT_EQ(got, slice);
  // An older version than the one there: replaced (fetch it elsewhere).
  EXPECT_EQ(
      (*b)->Read(0, 1, 6, 200, got.data(), 200, absl::Now() + absl::Seconds(5))
          .code(),
      absl::StatusCode::kAborted);
  // One not there yet: waits until the deadline, naming the slice.
  const absl::Time start = absl::Now();
  const absl::Status late =
      (*b)->Read(1, 0, 7, 0, got.data(), 20, start + absl::Milliseconds(200));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.message().find("group 1 shard 0"), std::string::npos) << late;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// A member alone: the last to close removes the name.
TEST(HostCacheTest, TheLastToCloseRemovesTheName) {
  const std::string name = TestName("close");
  auto a = HostCache::Open(name, {64}, 1, 3, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = HostCache::Open(name, {64}, 1, 3, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  a->reset();
  EXPECT_TRUE(Exists(name));
  b->reset();
  EXPECT_FALSE(Exists(name));
}

TEST(HostCacheTest, AWaitingReadEndsWhenThePeerPublishes) {
  const std::string name = TestName("wait");
  auto a = HostCache::Open(name, {4096}, 1, 1, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<char> out(4096), in(4096, 'x');
  absl::Status st;
  std::thread reader([&] {
    st = (*a)->Read(0, 0, 3, 0, out.data(), out.size(),
                    absl::Now() + absl::Seconds(20));
  });
  absl::SleepFor(absl::Milliseconds(50));
  (*a)->Publish(0, 0, 2, 0, in.data(), in.size());  // not the one waited for
  absl::SleepFor(absl::Milliseconds(50));
  in.assign(4096, 'y');
  (*a)->Publish(0, 0, 3, 0, in.data(), in.size());
  reader.join();
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(out, in);
}

// Reads group 0 of `shard` at version 1 (`bytes` at byte `offset`) on a
// thread, runs `meanwhile` 50 ms into the wait, and returns the read's
// answer.
absl::Status ReadWhile(HostCache& cache, uint32_t shard, size_t offset,
                       size_t bytes, const std::function<void()>& meanwhile,
                       const std::atomic<bool>* cancelled = nullptr) {
  std::vector<char> out(bytes);
  absl::Status st;
  std::thread reader([&] {
    st = cache.Read(0, shard, 1, offset, out.data(), bytes,
                    absl::Now() + absl::Seconds(20), cancelled);
  });
  absl::SleepFor(absl::Milliseconds(50));
  meanwhile();
  reader.join();
  return st;
}

// Forks a process that attaches to `name` (a 1 MiB group in 2 slices) as
// member 1 of 2 and then runs `then` with its cache; returns once it is
// attached.
pid_t ForkMember(const std::string& name,
                 const std::function<void(std::unique_ptr<HostCache>)>& then) {
  int attached[2];
  if (pipe(attached) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    auto b = HostCache::Open(name, {1 << 20}, 2, 2, 1);
    if (!b.ok() || write(attached[1], "a", 1) != 1) _exit(2);
    then(std::move(*b));
    _exit(0);
  }
  char byte;
  if (child < 0 || read(attached[0], &byte, 1) != 1) {
    close(attached[0]);
    close(attached[1]);
    return -1;
  }
  close(attached[0]);
  close(attached[1]);
  return child;
}

TEST(HostCacheTest, CancelledReadsReturnAtWakeAll) {
  auto a = HostCache::Open(TestName("cancel"), {64}, 1, 1, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  std::atomic<bool> cancelled{false};
  const absl::Time start = absl::Now();
  const absl::Status st = ReadWhile(
      **a, 0, 0, 64,
      [&] {
        cancelled = true;
        (*a)->WakeAll();
      },
      &cancelled);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A slice whose publisher is not attached, or leaves while a reader waits
// for it, is UNAVAILABLE at once (the reader fetches it itself).
TEST(HostCacheTest, ReadersAreToldWhenThePublisherIsNotThere) {
  const std::string name = TestName("left");
  auto a = HostCache::Open(name, {256}, 2, 2, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  char out[128];
  const absl::Time start = absl::Now();
  EXPECT_EQ(
      (*a)->Read(0, 1, 1, 128, out, 128, start + absl::Seconds(20)).code(),
      absl::StatusCode::kUnavailable);
  auto b = HostCache::Open(name, {256}, 2, 2, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  const absl::Status st = ReadWhile(**a, 1, 128, 128, [&] { b->reset(); });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("shard 1"), std::string::npos) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A publisher killed without detaching: a reader waiting for its slice is
// told within seconds (its process is looked at every second).
TEST(HostCacheTest, AKilledPublisherIsNotWaitedFor) {
  const std::string name = TestName("killed");
  auto a = HostCache::Open(name, {1 << 20}, 2, 2, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  const pid_t child = ForkMember(name, [](std::unique_ptr<HostCache>) {
    pause();  // until killed: never detaches
  });
  ASSERT_GT(child, 0);
  const absl::Time start = absl::Now();
  const absl::Status st = ReadWhile(**a, 1, 1 << 19, 128, [&] {
    kill(child, SIGKILL);
    int wstatus = 0;
    waitpid(child, &wstatus, 0);  // reaped: gone
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("process ended"), std::string::npos) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Another process publishes (its own mapping): the futex wakes this one.
TEST(HostCacheTest, AnotherProcessPublishes) {
  const std::string name = TestName("fork");
  auto a = HostCache::Open(name, {1 << 20}, 2, 2, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  const pid_t child = ForkMember(name, [](std::unique_ptr<HostCache> b) {
    std::vector<char> values(1 << 19, 'z');
    usleep(100000);
    b->Publish(0, 1, 5, 1 << 19, values.data(), values.size());
    b.reset();  // detaches, so the parent's close removes the segment
  });
  ASSERT_GT(child, 0);
  std::vector<char> got(1 << 19);
  const absl::Status st = (*a)->Read(0, 1, 5, 1 << 19, got.data(), got.size(),
                                     absl::Now() + absl::Seconds(20));
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(got, std::vector<char>(1 << 19, 'z'));
  a->reset();
  EXPECT_FALSE(Exists(name));
}

TEST(HostCacheTest, OpenRefusesBadNamesAndOtherLayouts) {
  for (const std::string bad : {"", "/", "noslash", "/a/b", "/a b"}) {
    auto c = HostCache::Open(bad, {64}, 1, 1, 0);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(HostCache::Open(TestName("empty"), {}, 1, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostCache::Open(TestName("member"), {64}, 1, 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string name = TestName("layout");
  auto a = HostCache::Open(name, {64, 64}, 2, 2, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  // Another size, and the same size (512 bytes) laid out otherwise.
  for (auto groups : {std::vector<uint64_t>{64}, std::vector<uint64_t>{192}}) {
    auto b = HostCache::Open(name, groups, groups[0] == 64 ? 2 : 3, 2, 1);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition)
        << b.status();
  }
  auto again = HostCache::Open(name, {64, 64}, 2, 2, 1);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(HostCacheTest, NamesDifferByJobAndHost) {
  const std::vector<std::string> ep = {"127.0.0.1:1", "127.0.0.1:2"};
  const std::string n = HostCacheName(ep, {"a", "b"}, 42, 0);
  EXPECT_EQ(n, HostCacheName(ep, {"a", "b"}, 42, 0));
  EXPECT_NE(n, HostCacheName(ep, {"a", "b"}, 42, 1));
  EXPECT_NE(n, HostCacheName(ep, {"a", "c"}, 42, 0));
  EXPECT_NE(n, HostCacheName(ep, {"a", "b"}, 43, 0));
  EXPECT_NE(n,
            HostCacheName({"127.0.0.1:3", "127.0.0.1:2"}, {"a", "b"}, 42, 0));
}

}  // namespace
}  // namespace zshard
