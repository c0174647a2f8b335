// Roster and what the step stages make of it: a dropped trainer's landed
// contribution counts and its missing ones are excused (the average divides
// by what was summed; a slot it only reserved is quarantined until its rank
// joins again); a step with no member waits; admission holds a step; the
// barrier stops waiting for a dropped trainer's commit.
#include "server/roster.h"

#include <cstring>

#include "common/transport/inline/inline_transport.h"
#include "gtest/gtest.h"
#include "server/contribution_buffer.h"
#include "server/step_barrier.h"

namespace zshard {
namespace {

TEST(RosterTest, MembershipDecidesWhatAStepWaitsFor) {
  Roster r(/*max_ranks=*/3, /*initial=*/2, /*start_step=*/4);
  EXPECT_TRUE(r.Expected(0, 4));
  EXPECT_TRUE(r.Expected(1, 9));
  EXPECT_FALSE(r.Expected(2, 4));
  EXPECT_FALSE(r.Expected(0, 3));
  EXPECT_TRUE(absl::IsInvalidArgument(r.CheckContributor(3, 4)));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.CheckContributor(2, 4)));

  r.Drop(1, "no heartbeat for 10.0 s");
  EXPECT_FALSE(r.Expected(1, 9));
  const absl::Status refused = r.CheckContributor(1, 9);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused));
  EXPECT_NE(refused.message().find("no heartbeat"), absl::string_view::npos)
      << refused;

  // Admission: prepared from 6, then admitted from 7.
  ASSERT_TRUE(r.Prepare(2, 6, "host:1").ok());
  EXPECT_TRUE(r.Expected(2, 6));
  ASSERT_TRUE(r.Admit(2, 7).ok());
  EXPECT_FALSE(r.Expected(2, 6));
  EXPECT_TRUE(r.Expected(2, 7));
  EXPECT_EQ(r.Identity(2), "host:1");
  EXPECT_TRUE(absl::IsFailedPrecondition(r.Admit(1, 7)));  // not prepared
  ASSERT_EQ(r.Members().size(), 2u);
  EXPECT_TRUE(r.Quorate());
  r.Drop(0, "left");
  r.Drop(2, "left");
  EXPECT_FALSE(r.Quorate());
}

TEST(RosterTest, AQuorumOfMinMembers) {
  Roster r(/*max_ranks=*/4, /*initial=*/2, /*start_step=*/0,
           /*min_members=*/2);
  EXPECT_TRUE(r.Quorate());
  EXPECT_FALSE(r.Expected(3, 0));  // beyond the initial ranks: free
  r.Drop(1, "gone");
  EXPECT_FALSE(r.Quorate());  // one left of two required
  ASSERT_TRUE(r.Prepare(3, 9, "host:2").ok());
  EXPECT_TRUE(r.Quorate());
}

class RosterBufferTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kElements = 8;
  void SetUp() override {
    transport_ = std::make_unique<InlineTransport>("roster_test");
    LandingPoolOptions o;
    o.slots = 4;
    o.slot_bytes = kElements * sizeof(float);
    o.transport = transport_.get();
    o.quarantine = absl::Milliseconds(200);
    auto p = LandingPool::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(*p);
    ContributionBufferOptions bo;
    bo.slice = Slice{0, kElements};
    bo.world_size = 3;
    bo.pool = pool_.get();
    bo.roster = &roster_;
    auto b = ContributionBuffer::Create(bo, 0);
    ASSERT_TRUE(b.ok()) << b.status();
    buffer_ = std::move(*b);
  }
  // Reserves a slot for `rank`, fills it with `value`, optionally lands it.
  uint32_t Put(uint32_t rank, float value, bool land) {
    auto slot = pool_->TryTake(0);
    EXPECT_TRUE(slot.has_value());
    EXPECT_TRUE(buffer_->Reserve(0, 0, rank, *slot).ok());
    float* dst = reinterpret_cast<float*>(pool_->slot_data(*slot));
    for (uint64_t i = 0; i < kElements; ++i) dst[i] = value;
    if (land) {
      EXPECT_TRUE(buffer_->Land(0, 0, rank).ok());
    }
    return *slot;
  }

  std::unique_ptr<InlineTransport> transport_;
  std::unique_ptr<LandingPool> pool_;
  Roster roster_{3, 3, 0};
  std::unique_ptr<ContributionBuffer> buffer_;
};

TEST_F(RosterBufferTest, ADroppedTrainersLandedPartCountsAndTheRestIsExcused) {
  Put(0, 1.0f, /*land=*/true);
  Put(2, 4.0f, /*land=*/false);  // rank 2 reserved, never lands
  EXPECT_FALSE(buffer_->Fold().complete);
  roster_.Drop(2, "gone");
  EXPECT_FALSE(buffer_->Fold().complete);  // rank 1 is still expected
  // The dropped rank is refused from now on.
  EXPECT_TRUE(absl::IsFailedPrecondition(buffer_->Land(0, 0, 2).status()));
  Put(1, 2.0f, /*land=*/true);
  const ContributionBuffer::Folded f = buffer_->Fold();
  ASSERT_TRUE(f.complete);
  EXPECT_EQ(f.summed, 2u);  // ranks 0 and 1: the divisor
  for (uint64_t i = 0; i < kElements; ++i) EXPECT_EQ(buffer_->sum()[i], 3.0f);
  // Rank 2's reserved slot stays out of use until its rank joins again.
  EXPECT_EQ(pool_->stats().quarantined, 1u);
  EXPECT_EQ(pool_->stats().in_use, 1u);
  pool_->ForgetCredit(2);
  EXPECT_EQ(pool_->stats().in_use, 0u);
  EXPECT_EQ(pool_->stats().quarantined, 0u);
}

TEST_F(RosterBufferTest, QuarantinedSlotsAndCreditsComeBackAfterTheirTime) {
  auto credit = pool_->GrantCredit(2);
  ASSERT_TRUE(credit.has_value());
  Put(0, 1.0f, /*land=*/true);
  Put(1, 1.0f, /*land=*/true);
  Put(2, 4.0f, /*land=*/false);
  roster_.Drop(2, "gone");
  pool_->DropRank(2);  // its credit too
  EXPECT_TRUE(buffer_->Fold().complete);
  EXPECT_EQ(pool_->stats().quarantined, 2u);
  EXPECT_EQ(pool_->stats().credits, 0u);
  absl::SleepFor(absl::Milliseconds(250));
  // The survivors are never left without slots for good.
  EXPECT_EQ(pool_->stats().quarantined, 0u);
  EXPECT_EQ(pool_->stats().in_use, 0u);
}

TEST_F(RosterBufferTest, ADroppedRankDoesNotMakeLaterRanksOutOfOrder) {
  // Rank 0 is gone before the step starts: rank 1's contribution is next
  // in the fold order (so it may take the slot kept for in-order ones).
  roster_.Drop(0, "gone");
  auto in_order = buffer_->InOrder(0, 0, 1);
  ASSERT_TRUE(in_order.ok()) << in_order.status();
  EXPECT_TRUE(*in_order);
  EXPECT_FALSE(*buffer_->InOrder(0, 0, 2));
}

TEST_F(RosterBufferTest, PassingOverAbsentRanksLeavesAStepQuiet) {
  // Rank 0 left with ranks 1 and 2 still members: its position is passed
  // over, but nothing of the step has arrived (a checkpoint may be taken).
  roster_.Drop(0, "left");
  buffer_->Fold();
  EXPECT_TRUE(buffer_->Quiet());
  Put(1, 1.0f, /*land=*/false);
  EXPECT_FALSE(buffer_->Quiet());
}

TEST_F(RosterBufferTest, ALandingAfterADroppedRanksPositionAsksForAFold) {
  // Rank 0 dropped before the step: nothing has passed over its position
  // yet, but rank 1's landing is what the engine must fold next.
  roster_.Drop(0, "gone");
  roster_.Drop(2, "gone");
  auto slot = pool_->TryTake(0);
  ASSERT_TRUE(slot.has_value());
  ASSERT_TRUE(buffer_->Reserve(0, 0, 1, *slot).ok());
  auto arrival = buffer_->Land(0, 0, 1);
  ASSERT_TRUE(arrival.ok()) << arrival.status();
  EXPECT_TRUE(arrival->fold);
  EXPECT_TRUE(buffer_->Fold().complete);
}

TEST_F(RosterBufferTest, AStepWithNoMemberWaitsForTheNextOne) {
  for (uint32_t r = 0; r < 3; ++r) roster_.Drop(r, "gone");
  EXPECT_FALSE(buffer_->Fold().complete);
  EXPECT_FALSE(buffer_->RankTouched(1));
  // A trainer admitted at this step contributes to it.
  ASSERT_TRUE(roster_.Prepare(1, 0, "new").ok());
  EXPECT_FALSE(buffer_->Fold().complete);
  Put(1, 5.0f, /*land=*/true);
  const ContributionBuffer::Folded f = buffer_->Fold();
  ASSERT_TRUE(f.complete);
  EXPECT_EQ(f.summed, 1u);
  EXPECT_EQ(buffer_->sum()[0], 5.0f);
  EXPECT_TRUE(buffer_->RankTouched(1));
}

TEST_F(RosterBufferTest, AStepNobodyContributedToIsSkippedOnceATrainerIsLater) {
  for (uint32_t r = 0; r < 3; ++r) roster_.Drop(r, "gone");
  ASSERT_TRUE(roster_.Prepare(0, 1, "new").ok());  // from the next step
  const ContributionBuffer::Folded f = buffer_->Fold();
  ASSERT_TRUE(f.complete);
  EXPECT_EQ(f.summed, 0u);  // the engine skips the group's step
}

TEST(RosterBarrierTest, ADroppedTrainersCommitIsNotAwaited) {
  Roster roster(2, 2, 0);
  StepBarrier b(0, 2, /*groups=*/1, /*step=*/0, &roster);
  EXPECT_FALSE(b.GroupReduced());
  auto c = b.Commit(0, 0, false, 1.0);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->ready);
  roster.Drop(1, "gone");
  EXPECT_TRUE(b.RosterChanged());
  EXPECT_TRUE(absl::IsFailedPrecondition(b.Commit(0, 1, false, 1.0).status()));
}

}  // namespace
}  // namespace zshard
