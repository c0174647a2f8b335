// InitialValues: chunks land in place, overlaps and ranges outside the slice
// are refused at once (changing nothing), gaps and short slices at the end.
#include "server/initial_values.h"

#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace zshard {
namespace {

TEST(InitialValuesTest, ChunksTileTheSlicesExactlyOrAreRefused) {
  auto spec = testing::MakeSpec({{40}, {24}});
  auto map = PartitionMap::Create(spec, 2, 4, 0);
  ASSERT_TRUE(map.ok());
  const Slice s0 = map->slice(0, 1), s1 = map->slice(1, 1);
  InitialValues v(*map, 1);
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  ASSERT_TRUE(v.Add(0, s0.begin + 4, x.data() + 4, s0.size() - 4).ok());
  // Overlapping what is there (from either side), outside, unknown group.
  EXPECT_EQ(v.Add(0, s0.begin, x.data(), 5).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.Add(0, s0.end - 1, x.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.Add(0, s0.end, x.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.Add(7, 0, x.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  // A gap at the start of group 0; group 1 has nothing.
  absl::Status gap = v.CheckComplete();
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gap.message().find("leave a gap at element"), std::string::npos);
  ASSERT_TRUE(v.Add(0, s0.begin, x.data(), 4).ok());
  EXPECT_EQ(v.CheckComplete().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(v.Add(1, s1.begin, x.data() + 40, s1.size()).ok());
  ASSERT_TRUE(v.CheckComplete().ok());
  const auto slices = v.Take();
  ASSERT_EQ(slices.size(), 2u);
  ASSERT_EQ(slices[0].size(), s0.size());
  for (size_t i = 0; i < s0.size(); ++i) EXPECT_EQ(slices[0][i], x[i]);
  EXPECT_EQ(slices[1][0], 40.0f);
}

}  // namespace
}  // namespace zshard
