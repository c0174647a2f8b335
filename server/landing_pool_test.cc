// LandingPool: slots are handed out at most once, admission keeps what it is
// asked to keep free, credits leave two slots to reservations and belong to one
// trainer, and waiters wake on every change.
#include "server/landing_pool.h"

#include <set>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zshard {
namespace {

std::unique_ptr<LandingPool> Make(uint32_t slots) {
  LandingPoolOptions o;
  o.slots = slots;
  o.slot_bytes = 64;
  auto p = LandingPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

TEST(LandingPoolTest, SlotsAreTakenOnceAndAdmissionKeepsSlotsFree) {
  auto pool = Make(3);
  EXPECT_EQ(pool->bytes(), 3u * 64);
  std::set<uint32_t> taken;
  for (int i = 0; i < 2; ++i) taken.insert(*pool->TryTake(1));
  EXPECT_FALSE(pool->TryTake(1).has_value());  // the last one is kept
  taken.insert(*pool->TryTake(0));
  EXPECT_EQ(taken, (std::set<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(pool->TryTake(0).has_value());
  EXPECT_EQ(pool->stats().in_use, 3u);
  EXPECT_EQ(pool->stats().peak_in_use, 3u);
  // Slots are distinct memory.
  EXPECT_EQ(pool->slot_data(1) - pool->slot_data(0), 64);
  pool->Give(1);
  EXPECT_EQ(*pool->TryTake(0), 1u);
  EXPECT_EQ(LandingPool::Create(LandingPoolOptions{0, 0, 64, nullptr})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LandingPoolTest, CreditsLeaveTwoSlotsAndBelongToOneTrainer) {
  auto pool = Make(4);
  auto c0 = pool->GrantCredit(0);
  ASSERT_TRUE(c0.has_value());
  EXPECT_FALSE(pool->GrantCredit(0).has_value());  // one per trainer
  auto c1 = pool->GrantCredit(1);
  ASSERT_TRUE(c1.has_value());
  EXPECT_FALSE(pool->GrantCredit(2).has_value());  // at most 4 - 2 out
  EXPECT_EQ(pool->stats().credits, 2u);
  EXPECT_FALSE(pool->RedeemCredit(*c0, 1));  // not rank 1's
  EXPECT_TRUE(pool->RedeemCredit(*c0, 0));
  EXPECT_FALSE(pool->RedeemCredit(*c0, 0));  // used already
  EXPECT_EQ(pool->stats().in_use, 2u);       // the slot is the caller's now
  pool->ForgetCredit(1);                     // rank 1 joined again
  EXPECT_FALSE(pool->RedeemCredit(*c1, 1));
  EXPECT_EQ(pool->stats().in_use, 1u);
  EXPECT_EQ(pool->stats().credits, 0u);
}

TEST(LandingPoolTest, AwaitChangeWakesOnGiveAndHonoursItsDeadline) {
  auto pool = Make(1);
  const uint32_t s = *pool->TryTake(0);
  const uint64_t seen = pool->epoch();
  const absl::Time start = absl::Now();
  EXPECT_FALSE(pool->AwaitChange(seen, start + absl::Milliseconds(100)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  std::thread giver([&] {
    absl::SleepFor(absl::Milliseconds(20));
    pool->Give(s);
  });
  EXPECT_TRUE(pool->AwaitChange(seen, absl::Now() + absl::Seconds(10)));
  giver.join();
  EXPECT_TRUE(pool->TryTake(0).has_value());
}

}  // namespace
}  // namespace zshard
