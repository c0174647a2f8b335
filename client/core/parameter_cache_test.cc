// ParameterCache and GradientPusher on their own, against real shard servers
// in process over the inline data plane (no TrainerClient): the cache hands
// out exactly the published values, prefetches within its window and never
// holds more than its bound; the pusher's contributions of two trainers
// become the next version, and a push to a wrong step fails naming it.
#include "client/core/parameter_cache.h"

#include <cstring>

#include "client/core/cluster.h"
#include "client/core/data_plane.h"
#include "client/core/gradient_pusher.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/in_process_shards.h"
#include "tests/test_models.h"

namespace zshard {
namespace {

using testing::InitValue;
using testing::MakeSpec;

constexpr uint32_t kShards = 2;

class CacheAndPusherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = MakeSpec({{2000}, {3000}, {1000, 500}, {4000}, {100}});
    ShardServerOptions o;
    o.service.store.alignment = 8;
    o.service.store.persistence_threshold = 200;
    o.service.store.world_size = 2;
    o.service.wait_timeout = absl::Seconds(20);
    o.transport = "inline";
    auto servers = testing::StartShards(o, kShards);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
    for (int rank = 0; rank < 2; ++rank) {
      ClusterOptions co;
      co.coordinator = servers_[0]->endpoint();
      co.requested_rank = rank;
      co.connect_timeout = absl::Seconds(20);
      auto c = Cluster::Connect(co);
      ASSERT_TRUE(c.ok()) << c.status();
      auto map = (*c)->RegisterOrVerify(
          spec_,
          [this](size_t g, float* out) {
            for (uint64_t i = 0; i < map_numel(g); ++i)
              out[i] = InitValue(g, i);
            return absl::OkStatus();
          },
          absl::Seconds(20));
      ASSERT_TRUE(map.ok()) << map.status();
      maps_.push_back(std::make_unique<PartitionMap>(std::move(*map)));
      auto dp = DataPlane::Create(c->get());
      ASSERT_TRUE(dp.ok()) << dp.status();
      clusters_.push_back(std::move(*c));
      planes_.push_back(std::move(*dp));
    }
  }
  uint64_t map_numel(size_t g) const {
    uint64_t n = 0;
    for (const auto& t : spec_.groups(static_cast<int>(g)).tensors())
      n += t.shape(0);
    return n;
  }
  ParameterCacheOptions CacheOptions(int rank) const {
    ParameterCacheOptions o;
    o.prefetch_bytes = 3500 * sizeof(float);
    o.rpc_timeout = absl::Seconds(20);
    o.data_plane = planes_[rank].get();
    return o;
  }

  v1::ModelSpec spec_;
  std::vector<std::unique_ptr<ShardServer>> servers_;
  std::vector<std::unique_ptr<Cluster>> clusters_;
  std::vector<std::unique_ptr<PartitionMap>> maps_;
  std::vector<std::unique_ptr<DataPlane>> planes_;
};

TEST_F(CacheAndPusherTest, CacheHandsOutPublishedValuesWithinItsBound) {
  ParameterCache cache(clusters_[0].get(), maps_[0].get(), CacheOptions(0));
  cache.BeginStep(0);
  const PartitionMap& map = *maps_[0];
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t g = 0; g < map.num_groups(); ++g) {
      auto p = cache.Acquire(g);
      ASSERT_TRUE(p.ok()) << p.status();
      const float* v = static_cast<const float*>(*p);
      for (uint64_t i = 0; i < map.group_numel(g); ++i) {
        ASSERT_EQ(v[i], InitValue(g, i)) << "group " << g << " element " << i;
      }
      ASSERT_TRUE(cache.Release(g).ok());
    }
  }
  const ParameterCacheStats s = cache.stats();
  EXPECT_GT(s.prefetch_hits, 0u);  // the second pass follows the first's order
  EXPECT_LE(s.peak_resident_bytes, cache.ResidentBound());
  EXPECT_EQ(cache.Acquire(99).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CacheAndPusherTest,
       PushedContributionsOfTwoTrainersBecomeTheNextVersion) {
  const PartitionMap& map = *maps_[0];
  std::vector<std::unique_ptr<GradientPusher>> pushers;
  for (int rank = 0; rank < 2; ++rank) {
    GradientPusherOptions o;
    o.rpc_timeout = absl::Seconds(20);
    o.data_plane = planes_[rank].get();
    pushers.push_back(std::make_unique<GradientPusher>(clusters_[rank].get(),
                                                       maps_[rank].get(), o));
  }
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t g = map.num_groups(); g-- > 0;) {
      std::vector<float> grad(map.group_numel(g),
                              0.25f * static_cast<float>(rank + 1));
      ASSERT_TRUE(pushers[rank]
                      ->Push(g, grad.data(), /*step=*/0, /*micro_step=*/0)
                      .ok());
    }
  }
  for (auto& p : pushers) ASSERT_TRUE(p->Flush().ok());
  EXPECT_EQ(pushers[0]->stats().bytes_pushed,
            map.total_numel() * sizeof(float));
  // Version 1 differs from version 0 wherever the gradient was non-zero.
  // Flush returns once the contributions landed; the shards apply them
  // afterwards, and Acquire waits for each group's version 1.
  ParameterCache cache(clusters_[1].get(), maps_[1].get(), CacheOptions(1));
  cache.BeginStep(1);
  for (size_t g = 0; g < map.num_groups(); ++g) {
    auto p = cache.Acquire(g);
    ASSERT_TRUE(p.ok()) << "group " << g << ": " << p.status();
    EXPECT_NE(static_cast<const float*>(*p)[0], InitValue(g, 0))
        << "group " << g;
    ASSERT_TRUE(cache.Release(g).ok());
  }
  // Every group has been published at version 1, so the shards agree on it.
  auto version = clusters_[1]->AgreedVersion(absl::Seconds(20));
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);

  // A contribution for a step already applied fails, naming the step.
  std::vector<float> grad(map.group_numel(0), 1.0f);
  ASSERT_TRUE(pushers[0]->Push(0, grad.data(), 0, 0).ok());
  absl::Status late = pushers[0]->Flush();
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_NE(late.message().find("step 0"), std::string::npos) << late;
}

}  // namespace
}  // namespace zshard
