#include <cmath>

#include "gtest/gtest.h"
#include "zshard/kernels/adamw.h"

namespace zshard {
namespace kernels {
namespace {

// Two steps worked by hand (in double) for one parameter.
TEST(AdamWReferenceTest, MatchesHandComputedSteps) {
  float p = 1.0f, m = 0.0f, v = 0.0f;
  AdamWStep hp;
  hp.lr = 0.1f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.99f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.5f;
  float g = 2.0f;
  hp.step = 1;
  ASSERT_TRUE(ReferenceAdamW(&p, &g, &m, &v, 1, hp).ok());
  // Step 1: p = 1*(1-0.05) = 0.95; m = 0.2; v = 0.04;
  // mhat = 0.2/0.1 = 2; vhat = 0.04/0.01 = 4; p -= 0.1 * 2/(2+1e-8).
  EXPECT_NEAR(m, 0.2, 1e-7);
  EXPECT_NEAR(v, 0.04, 1e-7);  // fp32 rounding of 1 - 0.99
  EXPECT_NEAR(p, 0.95 - 0.1 * 2.0 / (2.0 + 1e-8), 1e-6);
  const double p1 = p;
  g = -1.0f;
  hp.step = 2;
  ASSERT_TRUE(ReferenceAdamW(&p, &g, &m, &v, 1, hp).ok());
  // Step 2: m = 0.18 - 0.1 = 0.08; v = 0.0396 + 0.01 = 0.0496;
  // mhat = 0.08/0.19; vhat = 0.0496/0.0199.
  const double mhat = 0.08 / 0.19, vhat = 0.0496 / (1 - 0.99 * 0.99);
  const double expect = p1 * (1 - 0.05) - 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
  EXPECT_NEAR(m, 0.08, 1e-7);
  EXPECT_NEAR(v, 0.0496, 1e-7);
  EXPECT_NEAR(p, expect, 2e-6);
}

TEST(AdamWReferenceTest, GradScaleAndBadArguments) {
  float p1 = 1, m1 = 0, v1 = 0, g1 = 4;
  float p2 = 1, m2 = 0, v2 = 0, g2 = 2;
  AdamWStep hp;
  hp.grad_scale = 0.5f;
  ASSERT_TRUE(ReferenceAdamW(&p1, &g1, &m1, &v1, 1, hp).ok());
  hp.grad_scale = 1.0f;
  ASSERT_TRUE(ReferenceAdamW(&p2, &g2, &m2, &v2, 1, hp).ok());
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  hp.step = 0;
  EXPECT_EQ(ReferenceAdamW(&p1, &g1, &m1, &v1, 1, hp).code(),
            absl::StatusCode::kInvalidArgument);
  hp.step = 1;
  EXPECT_EQ(ReferenceAdamW(nullptr, &g1, &m1, &v1, 1, hp).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ReferenceAdamW(nullptr, nullptr, nullptr, nullptr, 0, hp).ok());
}

}  // namespace
}  // namespace kernels
}  // namespace zshard
