#include "client/core/peer_wait.h"

#include <vector>

#include "gtest/gtest.h"

namespace zshard {
namespace {

// A call that takes `wait` and answers `answer`.
struct Scripted {
  std::vector<absl::Status> answers;
  absl::Duration wait;
  int calls = 0;
  absl::Status operator()(absl::Time) {
    absl::SleepFor(wait);
    const absl::Status st =
        answers[std::min<size_t>(calls, answers.size() - 1)];
    ++calls;
    return st;
  }
};

TEST(PeerWaitTest, AShardThatWaitedIsAskedAgainUntilItAnswers) {
  Scripted s{{absl::DeadlineExceededError("waiting for trainer ranks 1"),
              absl::DeadlineExceededError("waiting for trainer ranks 1"),
              absl::OkStatus()},
             absl::Milliseconds(60)};
  absl::Time last;
  EXPECT_TRUE(CallWhilePeersAreLate(absl::Milliseconds(100), absl::Seconds(10),
                                    std::ref(s), &last)
                  .ok());
  EXPECT_EQ(s.calls, 3);
  EXPECT_GT(last, absl::Now());
}

TEST(PeerWaitTest, ACallThatRanOutItsDeadlineIsNotMadeAgain) {
  Scripted s{{absl::DeadlineExceededError("Deadline Exceeded")},
             absl::Milliseconds(120)};
  absl::Status st = CallWhilePeersAreLate(absl::Milliseconds(100),
                                          absl::Seconds(10), std::ref(s));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_EQ(s.calls, 1);
}

TEST(PeerWaitTest, OtherErrorsAndAnswersAtOnceAreNotMadeAgain) {
  Scripted unavailable{{absl::UnavailableError("gone")},
                       absl::Milliseconds(60)};
  EXPECT_TRUE(absl::IsUnavailable(CallWhilePeersAreLate(
      absl::Milliseconds(100), absl::Seconds(10), std::ref(unavailable))));
  EXPECT_EQ(unavailable.calls, 1);
  // A shard that did not wait (its own cap): no tight loop.
  Scripted at_once{{absl::DeadlineExceededError("cap")}, absl::ZeroDuration()};
  EXPECT_TRUE(absl::IsDeadlineExceeded(CallWhilePeersAreLate(
      absl::Milliseconds(100), absl::Seconds(10), std::ref(at_once))));
  EXPECT_EQ(at_once.calls, 1);
}

TEST(PeerWaitTest, PatienceEndsTheWaitWithTheShardsLastAnswer) {
  Scripted s{{absl::DeadlineExceededError("waiting for trainer ranks 1")},
             absl::Milliseconds(60)};
  const absl::Time start = absl::Now();
  absl::Status st = CallWhilePeersAreLate(absl::Milliseconds(100),
                                          absl::Milliseconds(300), std::ref(s));
  EXPECT_EQ(st.message(), "waiting for trainer ranks 1");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_GE(s.calls, 5);
}

}  // namespace
}  // namespace zshard
