// Optimizer: frozen elements have no AdamW moments and get no gradient, and
// the trainable ones update exactly as if the group had no frozen tensors.
#include "server/optimizer.h"

#include <vector>

#include "gtest/gtest.h"

namespace zshard {
namespace {

GroupShape Shape(uint64_t size,
                 std::vector<std::pair<uint64_t, uint64_t>> trainable) {
  GroupShape s;
  s.slice = Slice{100, 100 + size};
  s.trainable = std::move(trainable);
  return s;
}

TEST(OptimizerTest, FrozenElementsHaveNoMoments) {
  auto opt = Optimizer::Create(OptimizerOptions(),
                               {Shape(40, {{0, 8}, {30, 34}}), Shape(16, {})});
  ASSERT_TRUE(opt.ok()) << opt.status();
  (*opt)->Read(0, [](const Optimizer::State& s) {
    EXPECT_EQ(s.master.size(), 40u);
    EXPECT_EQ(s.m.size(), 12u);
    EXPECT_EQ(s.v.size(), 12u);
  });
  (*opt)->Read(1, [](const Optimizer::State& s) {
    EXPECT_EQ(s.master.size(), 16u);
    EXPECT_EQ(s.m.size(), 0u);
    EXPECT_EQ(s.v.size(), 0u);
  });
}

TEST(OptimizerTest, TrainableRangesUpdateAsAlone) {
  // Group 0: 8 trainable, 22 frozen, 4 trainable, 6 frozen. Group 1: the
  // same 12 trainable values with nothing frozen.
  auto opt =
      Optimizer::Create(OptimizerOptions(),
                        {Shape(40, {{0, 8}, {30, 34}}), Shape(12, {{0, 12}})});
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> init(40);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * i - 0.1f;
  std::vector<float> alone;
  for (size_t i = 0; i < 8; ++i) alone.push_back(init[i]);
  for (size_t i = 30; i < 34; ++i) alone.push_back(init[i]);
  (*opt)->Write(0, [&](Optimizer::State& s) { s.master = init; });
  (*opt)->Write(1, [&](Optimizer::State& s) { s.master = alone; });
  for (int step = 0; step < 3; ++step) {
    // Both take the compact gradient: the trainable elements only.
    std::vector<float> grad;
    for (size_t i = 0; i < 12; ++i) grad.push_back(0.3f - 0.02f * i * step);
    std::vector<float> grad_alone = grad;
    (*opt)->Update(0, grad.data(), 0.5f, false, nullptr, nullptr);
    (*opt)->Update(1, grad_alone.data(), 0.5f, false, nullptr, nullptr);
  }
  std::vector<float> got, want;
  (*opt)->Read(0, [&](const Optimizer::State& s) { got = s.master; });
  (*opt)->Read(1, [&](const Optimizer::State& s) { want = s.master; });
  for (size_t i = 0; i < 40; ++i) {
    if (i < 8) {
      EXPECT_EQ(got[i], want[i]) << i;
    } else if (i >= 30 && i < 34) {
      EXPECT_EQ(got[i], want[i - 22]) << i;
    } else {
      EXPECT_EQ(got[i], init[i]) << i;  // frozen
    }
  }
}

TEST(OptimizerTest, MomentsExpandAndCompact) {
  const GroupShape shape = Shape(10, {{1, 3}, {6, 7}});
  const std::vector<float> compact = {1, 2, 3};
  std::vector<float> full(10, -1);
  ExpandMoments(shape, compact.data(), full.data());
  EXPECT_EQ(full, (std::vector<float>{0, 1, 2, 0, 0, 0, 3, 0, 0, 0}));
  std::vector<float> back(3);
  CompactMoments(shape, full.data(), back.data());
  EXPECT_EQ(back, compact);
}

}  // namespace
}  // namespace zshard
