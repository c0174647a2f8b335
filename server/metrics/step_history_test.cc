#include "server/metrics/step_history.h"

#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(StepHistoryTest, AveragesRanksOncePerRankAndKeepsTheSlowestAndBusiest) {
  StepHistory h;
  const absl::Time t0 = absl::UnixEpoch();
  h.Add(1, 0, 4.0, 8, 0.5, 30, t0);
  h.Add(1, 1, 2.0, 8, 0.7, 40, t0 + absl::Seconds(1));
  h.Add(1, 1, 100.0, 8, 9.0, 99, t0 + absl::Seconds(2));  // a repeat: ignored
  h.Add(2, 0, 1.0, 8, 0.4, 20, t0 + absl::Seconds(3));
  const std::vector<StepPoint> p = h.Points();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].step, 1u);
  EXPECT_DOUBLE_EQ(p[0].loss, 3.0);
  EXPECT_EQ(p[0].samples, 16u);
  EXPECT_DOUBLE_EQ(p[0].step_seconds, 0.7);
  EXPECT_EQ(p[0].ranks, 2u);
  EXPECT_EQ(p[0].rpcs, 40u);  // the busiest rank's
  EXPECT_EQ(p[0].time, t0 + absl::Seconds(1));
  EXPECT_EQ(p[1].ranks, 1u);
  EXPECT_EQ(h.reports(), 3u);
  EXPECT_EQ(h.last_step(), 2u);
}

TEST(StepHistoryTest, StaysBoundedAndKeepsTheWholeCurve) {
  StepHistory h;
  for (uint64_t s = 1; s <= 20000; ++s) {
    h.Add(s, 0, 1.0 / static_cast<double>(s), 1, 0.1, 10, absl::UnixEpoch());
  }
  const std::vector<StepPoint> p = h.Points();
  EXPECT_LE(p.size(), StepHistory::kMaxSteps);
  EXPECT_GT(p.size(), StepHistory::kMaxSteps / 2);
  EXPECT_EQ(p.front().step, 1u);  // the start of the run is kept
  EXPECT_EQ(p.back().step, 20000u);
  for (size_t i = 1; i < p.size(); ++i) EXPECT_LT(p[i - 1].step, p[i].step);
  EXPECT_EQ(h.reports(), 20000u);
}

}  // namespace
}  // namespace zshard
