#include "common/config/loss_scaler.h"

#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(LossScalerTest, HysteresisThenHalvingThenGrowth) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = 4;  // 16
  c.hysteresis = 2;
  c.loss_scale_window = 3;
  c.min_loss_scale = 4;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 16);
  s.Update(true);  // iter 0: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 16);
  s.Update(true);  // iter 1: no hysteresis left: halve
  EXPECT_EQ(s.scale(), 8);
  s.Update(true);  // iter 2: halve again (hysteresis stays used up)
  EXPECT_EQ(s.scale(), 4);
  s.Update(true);  // not below min_loss_scale
  EXPECT_EQ(s.scale(), 4);
  s.Update(false);  // iter 4: 1 step since overflow
  s.Update(false);  // iter 5: 2
  EXPECT_EQ(s.scale(), 4);
  s.Update(false);  // iter 6: 3 steps: window reached, double
  EXPECT_EQ(s.scale(), 8);
  s.Update(true);  // hysteresis was restored at the doubling: no halving
  EXPECT_EQ(s.scale(), 8);
}

TEST(LossScalerTest, StaticAndDisabled) {
  Fp16Config c;
  LossScaler off(c);
  off.Update(true);
  EXPECT_EQ(off.scale(), 1);
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler fixed(c);
  fixed.Update(true);
  fixed.Update(false);
  EXPECT_EQ(fixed.scale(), 128);
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

TEST(LossScalerTest, SavedStateResumesIdentically) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = 8;
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  LossScaler a(c);
  const bool outcomes[] = {false, true,  false, true, true,
                           false, false, false, false};
  for (int i = 0; i < 4; ++i) a.Update(outcomes[i]);
  LossScaler b(c);
  ASSERT_TRUE(b.Load(a.Save()).ok());
  for (int i = 4; i < 9; ++i) {
    a.Update(outcomes[i]);
    b.Update(outcomes[i]);
    EXPECT_EQ(a.scale(), b.scale()) << i;
  }
  EXPECT_EQ(a.Save(), b.Save());
  EXPECT_EQ(b.Load("scale=x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Load(a.Save() + " extra").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zshard
