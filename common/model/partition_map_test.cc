#include "common/model/partition_map.h"

#include <vector>

#include "gtest/gtest.h"

namespace zshard {
namespace {

v1::ModelSpec SpecWithSizes(const std::vector<std::vector<int64_t>>& groups) {
  v1::ModelSpec spec;
  spec.set_name("m");
  int t = 0;
  for (const auto& sizes : groups) {
    auto* g = spec.add_groups();
    g->set_name("g" + std::to_string(spec.groups_size()));
    for (int64_t n : sizes) {
      auto* tensor = g->add_tensors();
      tensor->set_name("t" + std::to_string(t++));
      tensor->add_shape(n);
      tensor->set_dtype(v1::FLOAT32);
      tensor->set_trainable(true);
    }
  }
  return spec;
}

TEST(PartitionMapTest, EveryElementOwnedOnceAndBalanced) {
  const auto spec = SpecWithSizes(
      {{1}, {7, 13}, {4097}, {1000, 3, 5}, {65536}, {63}, {64}, {129, 1}});
  for (uint64_t alignment : {1, 8, 64, 100}) {
    for (uint32_t shards = 1; shards <= 16; ++shards) {
      auto map = PartitionMap::Create(spec, shards, alignment, 0);
      ASSERT_TRUE(map.ok()) << map.status();
      uint64_t total = 0;
      for (size_t g = 0; g < map->num_groups(); ++g) {
        const uint64_t n = map->group_numel(g);
        std::vector<int> owners(n, 0);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint32_t s = 0; s < shards; ++s) {
          const Slice& slice = map->slice(g, s);
          ASSERT_LE(slice.begin, slice.end);
          ASSERT_LE(slice.end, n);
          // Contiguous and in shard order.
          if (s > 0) {
            ASSERT_EQ(map->slice(g, s - 1).end, slice.begin);
          }
          if (slice.begin < n) {
            ASSERT_EQ(slice.begin % alignment, 0u);
          }
          for (uint64_t i = slice.begin; i < slice.end; ++i) ++owners[i];
          lo = std::min(lo, slice.size());
          hi = std::max(hi, slice.size());
        }
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_EQ(owners[i], 1) << "group " << g << " element " << i;
        }
        EXPECT_LE(hi - lo, alignment)
            << "group " << g << " shards " << shards << " align " << alignment;
        total += n;
      }
      EXPECT_EQ(total, map->total_numel());
      uint64_t by_shard = 0;
      for (uint32_t s = 0; s < shards; ++s) by_shard += map->shard_numel(s);
      EXPECT_EQ(by_shard, total);
    }
  }
}

TEST(PartitionMapTest, PersistenceThresholdAndTensorOffsets) {
  const auto spec = SpecWithSizes({{10, 20}, {5000}});
  auto map = PartitionMap::Create(spec, 3, 4, 100);
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(map->persistent(0));
  EXPECT_FALSE(map->persistent(1));
  EXPECT_EQ(map->tensor_offset(0, 0), 0u);
  EXPECT_EQ(map->tensor_offset(0, 1), 10u);
  EXPECT_EQ(map->group_numel(0), 30u);
}

TEST(PartitionMapTest, RejectsBadArguments) {
  const auto spec = SpecWithSizes({{10}});
  EXPECT_EQ(PartitionMap::Create(spec, 0, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionMap::Create(spec, 2, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionMap::Create(v1::ModelSpec(), 2, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PartitionMapTest, SliceContainsRejectsOverflow) {
  Slice s{10, 20};
  EXPECT_TRUE(s.Contains(10, 10));
  EXPECT_TRUE(s.Contains(15, 0));
  EXPECT_FALSE(s.Contains(9, 1));
  EXPECT_FALSE(s.Contains(15, 6));
  EXPECT_FALSE(s.Contains(UINT64_MAX - 2, 4));
  EXPECT_FALSE(s.Contains(12, UINT64_MAX));
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

// Frozen tensors are left out of the compact gradient; each slice's
// trainable elements are one run of it, the runs in shard order.
TEST(PartitionMapTest, CompactSlicesCoverTheTrainableElements) {
  v1::ModelSpec spec = SpecWithSizes({{10, 30, 20, 4}, {8}});
  spec.mutable_groups(0)->mutable_tensors(1)->set_trainable(false);
  spec.mutable_groups(1)->mutable_tensors(0)->set_trainable(false);
  auto map = PartitionMap::Create(spec, 3, 1, 0);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->trainable_ranges(0),
            (PartitionMap::Ranges{{0, 10}, {40, 64}}));
  EXPECT_EQ(map->trainable_numel(0), 34u);
  EXPECT_EQ(map->trainable_numel(1), 0u);
  uint64_t next = 0;
  for (uint32_t s = 0; s < 3; ++s) {
    const Slice c = map->compact_slice(0, s);
    EXPECT_EQ(c.begin, next) << s;
    uint64_t inside = 0;
    for (const auto& [lo, hi] : map->slice_trainable_ranges(0, s)) {
      EXPECT_LT(lo, hi);
      EXPECT_LE(hi, map->slice(0, s).size());
      inside += hi - lo;
    }
    EXPECT_EQ(c.size(), inside) << s;
    next = c.end;
    EXPECT_EQ(map->compact_slice(1, s).size(), 0u);
  }
  EXPECT_EQ(next, 34u);
  // Slices [0,21), [21,42), [42,64): 10, 2 ([40,42)) and 22 trainable.
  EXPECT_EQ(map->compact_slice(0, 0).size(), 10u);
  EXPECT_EQ(map->compact_slice(0, 1).size(), 2u);
  EXPECT_EQ(map->compact_slice(0, 2).size(), 22u);
  EXPECT_EQ(map->slice_trainable_ranges(0, 1),
            (PartitionMap::Ranges{{19, 21}}));
}

}  // namespace
}  // namespace zshard
