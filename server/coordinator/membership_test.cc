// Membership after a takeover (a replacement of shard 0): the ranks the
// shards expect are held for their trainers, a join of such a rank takes it,
// one nobody takes is dropped everywhere, and the predecessor's history is
// kept; a dropped process is refused when it joins again. Also
// CoordinatorChannel, which fences an older coordinator's calls.
#include "server/coordinator/membership.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_channel.h"

namespace zshard {
namespace {

// Every shard in memory: what it was told.
class RecordingFanout : public ShardFanout {
 public:
  absl::StatusOr<uint64_t> PrepareAdmit(uint32_t rank, uint64_t min_step,
                                        const std::string&,
                                        absl::Time) override {
    absl::MutexLock lock(&mu_);
    prepared_.push_back(rank);
    return std::max(min_step, step_);
  }
  absl::Status Admit(uint32_t rank, uint64_t, absl::Time) override {
    absl::MutexLock lock(&mu_);
    admitted_.push_back(rank);
    return absl::OkStatus();
  }
  absl::Status Drop(uint32_t rank, const std::string& reason,
                    absl::Time) override {
    absl::MutexLock lock(&mu_);
    dropped_.push_back(rank);
    reasons_.push_back(reason);
    return absl::OkStatus();
  }
  uint64_t CurrentStep() override {
    absl::MutexLock lock(&mu_);
    return step_;
  }

  std::vector<uint32_t> dropped() {
    absl::MutexLock lock(&mu_);
    return dropped_;
  }
  std::vector<uint32_t> admitted() {
    absl::MutexLock lock(&mu_);
    return admitted_;
  }

 private:
  absl::Mutex mu_;
  uint64_t step_ = 40;
  std::vector<uint32_t> prepared_, admitted_, dropped_;
  std::vector<std::string> reasons_;
};

TrainerIdentity Who(uint64_t instance) {
  return TrainerIdentity{"host", static_cast<uint32_t>(instance), instance};
}

TEST(MembershipTakeoverTest, AnAdoptedRankIsTakenByTheJoinAskingForIt) {
  RecordingFanout fanout;
  MembershipOptions o;
  o.ranks = 3;
  o.trainer_timeout = absl::Seconds(5);
  Membership m(o, &fanout);
  m.Adopt({0, 2}, 40, "shard 0 was replaced");
  // Rank 1 is free; ranks 0 and 2 are held for their trainers.
  auto any = m.Join(-1, Who(7));
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(*any, 1u);
  auto mine = m.Join(2, Who(9));
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*mine, 2u);
  // Taken: no longer a placeholder, so another process is refused.
  EXPECT_EQ(m.Join(2, Who(11)).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto start = m.Admit(2, 9, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(fanout.admitted(), std::vector<uint32_t>{2});
  EXPECT_TRUE(fanout.dropped().empty());
}

TEST(MembershipTakeoverTest, AnAdoptedRankNobodyTakesIsDroppedEverywhere) {
  RecordingFanout fanout;
  MembershipOptions o;
  o.ranks = 2;
  o.trainer_timeout = absl::Milliseconds(200);
  Membership m(o, &fanout);
  const absl::Time adopted = absl::Now();
  m.Adopt({1}, 40, "shard 0 was replaced");
  // Held for twice the timeout, then dropped on every shard.
  for (int i = 0; i < 200 && fanout.dropped().empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(fanout.dropped(), std::vector<uint32_t>{1});
  EXPECT_GE(absl::Now() - adopted, absl::Milliseconds(380));
}

TEST(MembershipTakeoverTest, TheHistoryContinuesFromThePredecessors) {
  RecordingFanout fanout;
  MembershipOptions o;
  o.ranks = 2;
  Membership m(o, &fanout);
  v1::MembershipEvent old;
  old.set_kind(v1::MembershipEvent::DROPPED);
  old.set_rank(1);
  old.set_step(12);
  m.RestoreHistory({old});
  m.Adopt({0}, 40, "shard 0 was replaced");
  const std::vector<v1::MembershipEvent> h = m.History();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].kind(), v1::MembershipEvent::DROPPED);
  EXPECT_EQ(h[0].step(), 12u);
  EXPECT_EQ(h[1].kind(), v1::MembershipEvent::ROLLED_BACK);
  EXPECT_EQ(h[1].step(), 40u);
}

TEST(MembershipTest, ADroppedProcessDoesNotJoinAgainButANewOneDoes) {
  RecordingFanout fanout;
  MembershipOptions o;
  o.ranks = 2;
  o.trainer_timeout = absl::Milliseconds(200);
  Membership m(o, &fanout);
  auto rank = m.Join(0, Who(5));
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE(m.Admit(0, 5, absl::Now() + absl::Seconds(1)).ok());
  // No heartbeats: dropped after the timeout.
  for (int i = 0; i < 200 && fanout.dropped().empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(fanout.dropped(), std::vector<uint32_t>{0});
  // The stopped process comes back: refused, holding nothing.
  absl::StatusOr<uint32_t> again = m.Join(0, Who(5));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("does not join again"),
            std::string::npos)
      << again.status();
  auto fresh = m.Join(0, Who(6));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(*fresh, 0u);
}

TEST(CoordinatorChannelTest, AnOlderCoordinatorsCallsAreRefused) {
  CoordinatorChannel channel(RpcCredentials::Plaintext(), "127.0.0.1:1");
  EXPECT_TRUE(channel.CheckCaller(0, "DropTrainer").ok());
  channel.Advance(2, "127.0.0.1:2");
  EXPECT_EQ(channel.endpoint(), "127.0.0.1:2");
  EXPECT_TRUE(channel.CheckCaller(2, "DropTrainer").ok());
  absl::Status stale = channel.CheckCaller(1, "DropTrainer");
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("127.0.0.1:2"), std::string::npos) << stale;
  channel.Advance(1);  // never back
  EXPECT_EQ(channel.epoch(), 2u);
  EXPECT_NE(channel.stub(), nullptr);
}

}  // namespace
}  // namespace zshard
