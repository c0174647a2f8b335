// StepBarrier: a step is handed to the engine exactly once, whichever of
// commits and reductions comes last and from whichever thread; decisions are
// answered again; waits end at their deadline naming the missing ranks.
#include "server/step_barrier.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(StepBarrierTest, ReadyExactlyOnceWhateverTheOrder) {
  for (int trial = 0; trial < 50; ++trial) {
    StepBarrier b(/*shard_id=*/0, /*world_size=*/4, /*groups=*/6, /*step=*/3);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        auto c = b.Commit(3, r, /*overflow=*/r == 2, 8.0);
        ASSERT_TRUE(c.ok()) << c.status();
        ready += c->ready ? 1 : 0;
      });
    }
    for (int g = 0; g < 6; ++g) {
      threads.emplace_back([&] { ready += b.GroupReduced() ? 1 : 0; });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(ready.load(), 1) << "trial " << trial;
    const StepBarrier::Pending p = b.pending();
    EXPECT_EQ(p.step, 3u);
    EXPECT_TRUE(p.overflow);
    EXPECT_EQ(p.loss_scale, 8.0);
  }
}

TEST(StepBarrierTest, DecisionIsAnsweredAgainAndTheNextStepCollected) {
  StepBarrier b(1, 2, 1, 0);
  ASSERT_TRUE(b.Commit(0, 0, false, 1.0).ok());
  EXPECT_EQ(b.Commit(0, 1, false, 2.0).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b.Commit(0, 1, false, 1.0).ok());
  std::thread waiter([&] {
    auto d = b.Await(0, absl::Now() + absl::Seconds(10), {});
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->grad_norm, 2.5);
  });
  ASSERT_TRUE(b.GroupReduced());
  b.Decided(0, StepDecision{false, 2.5});
  waiter.join();
  auto again = b.Commit(0, 0, false, 1.0);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->decided);
  EXPECT_EQ(again->decision.grad_norm, 2.5);
  EXPECT_EQ(b.Commit(2, 0, false, 1.0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(b.Commit(1, 0, false, 1.0)->ready);
}

TEST(StepBarrierTest, WaitsEndAtTheDeadlineAndFailuresReachEveryone) {
  StepBarrier b(2, 3, 1, 0);
  ASSERT_TRUE(b.Commit(0, 1, false, 1.0).ok());
  const absl::Time start = absl::Now();
  auto d = b.Await(0, start + absl::Milliseconds(150), {});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(d.status().message().find("trainer ranks 0,2 have not committed"), std::string::npos)
      << d.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(140));
  b.Failed(absl::DeadlineExceededError("step 0 could not be decided: shard 3 is gone"));
  EXPECT_EQ(b.Await(0, absl::Now() + absl::Seconds(1), {}).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(b.Commit(0, 0, false, 1.0).status().message().find("shard 3 is gone"),
            std::string::npos);
}

}  // namespace
}  // namespace zshard
