#include "server/shard_store.h"

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"
#include "zshard/kernels/adamw.h"

namespace zshard {
namespace {

using testing::MakeSpec;
using testing::ShardValues;

ShardStoreOptions Options(uint32_t shard, uint32_t shards, uint32_t trainers,
                          uint32_t accum) {
  ShardStoreOptions o;
  o.shard_id = shard;
  o.num_shards = shards;
  o.alignment = 4;
  o.persistence_threshold = 0;
  o.world_size = trainers;
  o.accumulation_steps = accum;
  o.adamw.lr = 0.01;
  return o;
}

std::vector<float> Read(ShardStore& store, uint32_t group) {
  auto snap = store.ReadSlice(group, 0, absl::Now() + absl::Seconds(1), {});
  EXPECT_TRUE(snap.ok()) << snap.status();
  return snap.ok() ? snap->values : std::vector<float>{};
}

class ShardStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = MakeSpec({{10, 7}, {33}});
    auto store = ShardStore::Create(Options(1, 2, 2, 1));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto map = PartitionMap::Create(spec_, 2, 4, 0);
    ASSERT_TRUE(map.ok());
    map_ = std::make_unique<PartitionMap>(*map);
    auto created = store_->Register(spec_, ShardValues(*map_, 1));
    ASSERT_TRUE(created.ok()) << created.status();
    ASSERT_TRUE(*created);
    before0_ = Read(*store_, 0);
    before1_ = Read(*store_, 1);
  }
  void ExpectUnchanged() {
    EXPECT_EQ(Read(*store_, 0), before0_);
    EXPECT_EQ(Read(*store_, 1), before1_);
    for (const auto& p : store_->Progress()) EXPECT_EQ(p.version, 0u);
  }
  const Slice& slice(uint32_t g) { return map_->slice(g, 1); }

  v1::ModelSpec spec_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<PartitionMap> map_;
  std::vector<float> before0_, before1_;
};

TEST_F(ShardStoreTest, IdenticalSpecIsIdempotentDifferentIsRefused) {
  auto again = store_->Register(spec_, {});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  auto other = MakeSpec({{10, 8}, {33}});
  auto st = store_->Register(other, ShardValues(*map_, 1));
  EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.status().message().find("tensor 't1' has shape [7] vs [8]"),
            absl::string_view::npos)
      << st.status();
  ExpectUnchanged();
}

TEST_F(ShardStoreTest, UnknownGroupIsNotFound) {
  auto snap = store_->ReadSlice(7, 0, absl::Now() + absl::Seconds(1), {});
  EXPECT_EQ(snap.status().code(), absl::StatusCode::kNotFound);
  std::vector<float> g(4, 1.0f);
  EXPECT_EQ(store_->AcceptGradient(7, 0, 0, 0, 0, g.data(), 4).code(),
            absl::StatusCode::kNotFound);
  ExpectUnchanged();
}

TEST_F(ShardStoreTest, BadGradientsChangeNothing) {
  const Slice s = slice(1);
  std::vector<float> g(s.size(), 1.0f);
  // Out-of-range offset, past the slice end, before it.
  EXPECT_EQ(store_->AcceptGradient(1, 0, 0, 0, s.end, g.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      store_->AcceptGradient(1, 0, 0, 0, s.begin, g.data(), s.size() + 1).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->AcceptGradient(1, 0, 0, 0, s.begin - 1, g.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  // Steps from the future and (after an update) the past.
  EXPECT_EQ(
      store_->AcceptGradient(1, 3, 0, 0, s.begin, g.data(), s.size()).code(),
      absl::StatusCode::kFailedPrecondition);
  // Rank and micro-step out of range.
  EXPECT_EQ(
      store_->AcceptGradient(1, 0, 0, 2, s.begin, g.data(), s.size()).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      store_->AcceptGradient(1, 0, 1, 0, s.begin, g.data(), s.size()).code(),
      absl::StatusCode::kInvalidArgument);
  ExpectUnchanged();
  // A partial contribution then aborted leaves nothing behind.
  ASSERT_TRUE(store_->AcceptGradient(1, 0, 0, 0, s.begin, g.data(), 2).ok());
  store_->AbortContribution(1, 0, 0, 0);
  EXPECT_TRUE(store_->Progress()[1].waiting_for_ranks.empty());
  ExpectUnchanged();
}

TEST_F(ShardStoreTest, UpdateWaitsForEveryTrainerThenAppliesAdamW) {
  const Slice s = slice(1);
  std::vector<float> g0(s.size()), g1(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    g0[i] = 0.1f * static_cast<float>(i);
    g1[i] = -0.05f * static_cast<float>(i) + 0.3f;
  }
  ASSERT_TRUE(store_->AcceptGradient(1, 0, 0, 1, s.begin, g1.data(), 5).ok());
  ASSERT_TRUE(store_
                  ->AcceptGradient(1, 0, 0, 1, s.begin + 5, g1.data() + 5,
                                   s.size() - 5)
                  .ok());
  auto progress = store_->Progress();
  EXPECT_EQ(progress[1].version, 0u);
  EXPECT_EQ(progress[1].waiting_for_ranks, std::vector<uint32_t>{0});
  // Duplicate push of a complete contribution is refused.
  EXPECT_EQ(
      store_->AcceptGradient(1, 0, 0, 1, s.begin, g1.data(), s.size()).code(),
      absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(
      store_->AcceptGradient(1, 0, 0, 0, s.begin, g0.data(), s.size()).ok());
  // The update engine applies it after the call returned.
  ASSERT_TRUE(store_->Drain(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(store_->Progress()[1].version, 1u);

  // Expected: reference AdamW on (g0 + g1) / 2.
  std::vector<float> p = before1_, m(s.size(), 0), v(s.size(), 0), sum(s.size());
  for (size_t i = 0; i < s.size(); ++i) sum[i] = g0[i] + g1[i];
  kernels::AdamWStep hp;
  hp.lr = 0.01f;
  hp.grad_scale = 0.5f;
  ASSERT_TRUE(kernels::ReferenceAdamW(p.data(), sum.data(), m.data(), v.data(),
                                      s.size(), hp)
                  .ok());
  EXPECT_EQ(Read(*store_, 1), p);
  EXPECT_EQ(Read(*store_, 0), before0_);  // group 0 untouched
  // The old step is now from the past.
  EXPECT_EQ(
      store_->AcceptGradient(1, 0, 0, 0, s.begin, g0.data(), s.size()).code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST_F(ShardStoreTest, FetchWaitsForVersionUntilDeadline) {
  const absl::Time start = absl::Now();
  auto snap = store_->ReadSlice(0, 1, start + absl::Milliseconds(200), {});
  EXPECT_EQ(snap.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  EXPECT_NE(snap.status().message().find("version 1"), absl::string_view::npos);
  EXPECT_NE(snap.status().message().find("trainer ranks 0, 1;"),
            absl::string_view::npos)
      << snap.status();
}

TEST(ShardStoreRegisterTest, ValuesMustTileTheSlice) {
  auto spec = MakeSpec({{40}});
  auto created = ShardStore::Create(Options(0, 2, 1, 1));
  ASSERT_TRUE(created.ok());
  ShardStore& store = **created;
  auto map = PartitionMap::Create(spec, 2, 4, 0);
  auto values = ShardValues(*map, 0);
  values[0].values.pop_back();
  EXPECT_EQ(store.Register(spec, values).status().code(),
            absl::StatusCode::kFailedPrecondition);
  values = ShardValues(*map, 1);  // the other shard's slice
  EXPECT_EQ(store.Register(spec, values).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Register(spec, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(store.registered());
  EXPECT_TRUE(store.Register(spec, ShardValues(*map, 0)).ok());
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

TEST(ShardStoreFrozenTest, FrozenTensorsKeepTheirValues) {
  auto spec = testing::MakeSpec({{12, 20, 8}});
  spec.mutable_groups(0)->mutable_tensors(1)->set_trainable(false);
  ShardStoreOptions o;
  o.num_shards = 1;
  o.alignment = 1;
  o.persistence_threshold = 0;
  auto created = ShardStore::Create(o);
  ASSERT_TRUE(created.ok());
  ShardStore& store = **created;
  auto map = PartitionMap::Create(spec, 1, 1, 0);
  ASSERT_TRUE(store.Register(spec, testing::ShardValues(*map, 0)).ok());
  const auto before = store.ReadSlice(0, 0, absl::Now() + absl::Seconds(1), {});
  std::vector<float> grad(40, 0.5f);
  ASSERT_TRUE(store.AcceptGradient(0, 0, 0, 0, 0, grad.data(), 40).ok());
  const auto after = store.ReadSlice(0, 1, absl::Now() + absl::Seconds(1), {});
  ASSERT_TRUE(after.ok());
  for (size_t i = 0; i < 40; ++i) {
    if (i >= 12 && i < 32) {
      EXPECT_EQ(after->values[i], before->values[i]) << i;
    } else {
      EXPECT_NE(after->values[i], before->values[i]) << i;
    }
  }
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

// The landing pool under pressure: more trainers than slots.
class ShardStorePoolTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kTrainers = 16;
  static constexpr uint32_t kMicro = 2;
  static constexpr size_t kElements = 300;

  // Stage 0 publishes the averaged gradient itself: the reduce's bits.
  void Make(uint32_t trainers, uint32_t micro, uint32_t slots) {
    spec_ = testing::MakeSpec({{kElements}});
    ShardStoreOptions o;
    o.num_shards = 1;
    o.alignment = 1;
    o.persistence_threshold = 0;
    o.world_size = trainers;
    o.accumulation_steps = micro;
    o.sum_only = true;
    o.landing_slots = slots;
    auto created = ShardStore::Create(o);
    ASSERT_TRUE(created.ok()) << created.status();
    store_ = std::move(*created);
    auto map = PartitionMap::Create(spec_, 1, 1, 0);
    ASSERT_TRUE(map.ok());
    ASSERT_TRUE(store_->Register(spec_, testing::ShardValues(*map, 0)).ok());
  }
  // Contribution values whose fp32 sum depends on the order of additions.
  static float Value(uint64_t step, uint32_t c, size_t i) {
    const float big = ((c + step) % 3 == 0) ? 1e7f : 1.0f;
    return big * static_cast<float>((c * 7919 + i * 104729 + step) % 1000) /
               997.0f -
           (c % 2 ? 3.3e6f : 0.0f);
  }
  // The reduce's definition: fp32, in (micro-step, rank) order, averaged.
  static std::vector<float> Expected(uint64_t step, uint32_t trainers,
                                     uint32_t micro) {
    std::vector<float> out(kElements);
    const float scale = 1.0f / static_cast<float>(trainers * micro);
    for (size_t i = 0; i < kElements; ++i) {
      float sum = Value(step, 0, i);
      for (uint32_t c = 1; c < trainers * micro; ++c) sum += Value(step, c, i);
      out[i] = sum * scale;
    }
    return out;
  }
  // Trainer `rank`'s contribution to (step, micro) in three chunks.
  absl::Status Push(uint64_t step, uint32_t micro, uint32_t rank,
                    uint32_t trainers, absl::Time deadline) {
    std::vector<float> g(kElements);
    for (size_t i = 0; i < kElements; ++i) {
      g[i] = Value(step, micro * trainers + rank, i);
    }
    for (size_t at = 0; at < kElements; at += 100) {
      absl::Status st = store_->AcceptGradient(
          0, step, micro, rank, at, g.data() + at, 100, false, deadline);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  v1::ModelSpec spec_;
  std::unique_ptr<ShardStore> store_;
};

TEST_F(ShardStorePoolTest, SixteenTrainersThroughTwoSlotsLandOnceInAnyOrder) {
  Make(kTrainers, kMicro, /*slots=*/2);
  for (uint64_t step = 0; step < 6; ++step) {
    std::vector<std::thread> trainers;
    std::vector<absl::Status> results(kTrainers);
    for (uint32_t r = 0; r < kTrainers; ++r) {
      trainers.emplace_back([this, step, r, &results] {
        std::mt19937 rng(static_cast<uint32_t>(step * 131 + r));
        for (uint32_t a = 0; a < kMicro && results[r].ok(); ++a) {
          absl::SleepFor(absl::Microseconds(rng() % 2000));
          results[r] =
              Push(step, a, r, kTrainers, absl::Now() + absl::Seconds(20));
        }
      });
    }
    for (auto& t : trainers) t.join();
    for (uint32_t r = 0; r < kTrainers; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    }
    auto snap =
        store_->ReadSlice(0, step + 1, absl::Now() + absl::Seconds(10), {});
    ASSERT_TRUE(snap.ok()) << snap.status();
    EXPECT_EQ(snap->version, step + 1);
    const std::vector<float> want = Expected(step, kTrainers, kMicro);
    ASSERT_EQ(std::memcmp(snap->values.data(), want.data(),
                          kElements * sizeof(float)),
              0)
        << "step " << step;
  }
  const StoreMemory m = store_->Memory();
  EXPECT_EQ(m.landing_slots, 2u);
  EXPECT_LE(m.landing_slots_peak, 2u);
  EXPECT_EQ(m.landing, 2 * kElements * sizeof(float));
  EXPECT_EQ(m.accumulators, kElements * sizeof(float));
  EXPECT_EQ(m.reduced_contributions, 6u * kTrainers * kMicro);
}

TEST_F(ShardStorePoolTest, AFullPoolFailsAtTheDeadlineNamingThePool) {
  Make(/*trainers=*/3, /*micro=*/1, /*slots=*/2);
  const absl::Time far = absl::Now() + absl::Seconds(10);
  // Rank 1 lands out of order and holds a slot; the last slot is kept for
  // rank 0 (in order), so rank 2 waits until its deadline.
  ASSERT_TRUE(Push(0, 0, 1, 3, far).ok());
  const absl::Time start = absl::Now();
  absl::Status st = Push(0, 0, 2, 3, start + absl::Milliseconds(300));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("landing pool (--landing_slots)"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("waits for ranks 0,2"), std::string::npos) << st;
  EXPECT_GE(waited, absl::Milliseconds(300));
  EXPECT_LT(waited, absl::Seconds(3));
  // Nothing of rank 2 was kept; the step completes once rank 0 lands.
  EXPECT_EQ(store_->Progress()[0].contributions_received, 1u);
  ASSERT_TRUE(Push(0, 0, 0, 3, far).ok());
  ASSERT_TRUE(Push(0, 0, 2, 3, far).ok());
  auto snap = store_->ReadSlice(0, 1, absl::Now() + absl::Seconds(10), {});
  ASSERT_TRUE(snap.ok()) << snap.status();
  const std::vector<float> want = Expected(0, 3, 1);
  EXPECT_EQ(
      std::memcmp(snap->values.data(), want.data(), kElements * sizeof(float)),
      0);
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

// Step barrier on one shard: an overflow reported by any trainer skips the
// step (values unchanged, version bumped); otherwise the update is applied.
TEST(ShardStoreBarrierTest, OverflowSkipsTheStepForEveryone) {
  auto spec = testing::MakeSpec({{40}, {24}});
  ShardStoreOptions o;
  o.num_shards = 1;
  o.alignment = 4;
  o.persistence_threshold = 0;
  o.world_size = 2;
  o.step_barrier = true;
  auto created = ShardStore::Create(o);
  ASSERT_TRUE(created.ok());
  ShardStore& store = **created;
  auto map = PartitionMap::Create(spec, 1, 4, 0);
  ASSERT_TRUE(store.Register(spec, testing::ShardValues(*map, 0)).ok());
  auto read = [&](uint32_t g, uint64_t v) {
    return store.ReadSlice(g, v, absl::Now() + absl::Seconds(2), {})->values;
  };
  const auto before = read(0, 0);
  auto push_all = [&](uint64_t step) {
    for (uint32_t g = 0; g < 2; ++g) {
      std::vector<float> grad(map->group_numel(g), 0.5f);
      for (uint32_t r = 0; r < 2; ++r) {
        ASSERT_TRUE(store.AcceptGradient(g, step, 0, r, 0, grad.data(), grad.size()).ok());
      }
    }
  };
  push_all(0);
  // Nothing is applied before every trainer has committed.
  EXPECT_EQ(store.Progress()[0].version, 0u);
  auto deadline = absl::Now() + absl::Seconds(5);
  absl::StatusOr<StepDecision> d0, d1;
  std::thread t0([&] { d0 = store.CommitStep(0, 0, false, 4.0, deadline, {}); });
  d1 = store.CommitStep(0, 1, true, 4.0, deadline, {});
  t0.join();
  ASSERT_TRUE(d0.ok() && d1.ok()) << d0.status() << d1.status();
  EXPECT_TRUE(d0->skipped);
  EXPECT_TRUE(d1->skipped);
  EXPECT_EQ(read(0, 1), before);  // skipped: unchanged, but version 1
  // A commit of the decided step is answered again; a past one is refused.
  EXPECT_TRUE(store.CommitStep(0, 0, false, 4.0, deadline, {})->skipped);
  EXPECT_EQ(store.CommitStep(5, 0, false, 4.0, deadline, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);

  push_all(1);
  // Rank 0 commits; its wait times out, but the commit stands.
  EXPECT_EQ(store.CommitStep(1, 0, false, 4.0, absl::Now() + absl::Milliseconds(100), {})
                .status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // A different loss scale from the other trainer is refused.
  EXPECT_EQ(store.CommitStep(1, 1, false, 8.0, deadline, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  d1 = store.CommitStep(1, 1, false, 4.0, deadline, {});
  d0 = store.CommitStep(1, 0, false, 4.0, deadline, {});  // decided: answered
  ASSERT_TRUE(d0.ok() && d1.ok()) << d0.status() << d1.status();
  EXPECT_EQ(d0->grad_norm, d1->grad_norm);
  EXPECT_FALSE(d1->skipped);
  // Averaged and unscaled gradient: 0.5 * 2 / (4 * 2) = 0.125 everywhere.
  EXPECT_NEAR(d1->grad_norm, 0.125 * std::sqrt(64.0), 1e-9);
  EXPECT_NE(read(0, 2), before);
}

TEST(ShardStoreBarrierTest, CommitTimesOutNamingTheMissingRanks) {
  auto spec = testing::MakeSpec({{8}});
  ShardStoreOptions o;
  o.num_shards = 1;
  o.alignment = 4;
  o.world_size = 3;
  o.step_barrier = true;
  auto created = ShardStore::Create(o);
  ASSERT_TRUE(created.ok());
  auto map = PartitionMap::Create(spec, 1, 4, 0);
  ASSERT_TRUE((*created)->Register(spec, testing::ShardValues(*map, 0)).ok());
  auto d = (*created)->CommitStep(0, 1, false, 1.0, absl::Now() + absl::Milliseconds(200), {});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(d.status().message().find("trainer ranks 0,2"), absl::string_view::npos)
      << d.status();
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

// A one-shard store with checkpoints into `root`, committing to nothing.
std::unique_ptr<ShardStore> CheckpointingStore(const std::string& root,
                                               const v1::ModelSpec& spec,
                                               std::vector<uint64_t>* committed) {
  ShardStoreOptions o = Options(0, 1, 2, 1);
  o.checkpoint.root = root;
  o.checkpoint.chunk_elements = 8;
  auto store = ShardStore::Create(o);
  EXPECT_TRUE(store.ok()) << store.status();
  (*store)->SetCheckpointCommit([committed](const ShardManifest& m, uint32_t) {
    committed->push_back(m.step);
    return absl::OkStatus();
  });
  auto map = PartitionMap::Create(spec, 1, 4, 0);
  EXPECT_TRUE((*store)->Register(spec, testing::ShardValues(*map, 0)).ok());
  return std::move(*store);
}

// A checkpointing store over a two-group model in a fresh directory,
// removed at the end of the test.
struct CheckpointingCase {
  CheckpointingCase()
      : root(MakeRoot()),
        spec(MakeSpec({{10, 7}, {33}})),
        map(*PartitionMap::Create(spec, 1, 4, 0)),
        store(CheckpointingStore(root, spec, &committed)) {}
  ~CheckpointingCase() {
    store.reset();
    std::system(("rm -rf " + root).c_str());
  }
  static std::string MakeRoot() {
    char tmpl[] = "/tmp/zshard_store_ckpt_XXXXXX";
    return ::mkdtemp(tmpl);
  }
  const std::string root;
  const v1::ModelSpec spec;
  PartitionMap map;
  std::vector<uint64_t> committed;
  std::unique_ptr<ShardStore> store;
};

// Both trainers' gradients for every group (or one rank's for one group).
void Step(ShardStore& store, const PartitionMap& map, uint64_t step, int only_group = -1,
          int only_rank = -1) {
  for (uint32_t g = 0; g < map.num_groups(); ++g) {
    for (uint32_t r = 0; r < 2; ++r) {
      if ((only_group >= 0 && g != static_cast<uint32_t>(only_group)) ||
          (only_rank >= 0 && r != static_cast<uint32_t>(only_rank))) {
        continue;
      }
      std::vector<float> grad(map.group_numel(g), 0.5f + r);
      ASSERT_TRUE(store.AcceptGradient(g, step, 0, r, 0, grad.data(), grad.size()).ok());
    }
  }
  // Updates (and staging) run on the store's engine, after the calls return.
  ASSERT_TRUE(store.Drain(absl::Now() + absl::Seconds(10)).ok());
}

TEST(ShardStoreCheckpointTest, ScheduledStepIsTakenWhenReachedNowWhenIdleNeverTwice) {
  CheckpointingCase c;
  const PartitionMap& map = c.map;
  std::vector<uint64_t>& committed = c.committed;
  ShardStore* store = c.store.get();
  ASSERT_TRUE(store->ScheduleCheckpoint(2).ok());
  Step(*store, map, 0);
  Step(*store, map, 1);  // reaches version 2: taken
  ASSERT_TRUE(store->checkpoint_writer()->WaitIdle(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(committed, std::vector<uint64_t>({2}));
  // Past steps are refused; the current one, with nothing in flight, is
  // taken at once, and only once.
  EXPECT_EQ(store->ScheduleCheckpoint(1).code(), absl::StatusCode::kAborted);  // retry later
  EXPECT_TRUE(store->ScheduleCheckpoint(2).ok());
  Step(*store, map, 2);
  ASSERT_TRUE(store->ScheduleCheckpoint(3).ok());
  ASSERT_TRUE(store->checkpoint_writer()->WaitIdle(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(committed, std::vector<uint64_t>({2, 3}));
  // Mid-step (one trainer's gradient of step 3 arrived for one group): the
  // next boundary, not now.
  Step(*store, map, 3, /*only_group=*/0, /*only_rank=*/0);
  EXPECT_EQ(store->ScheduleCheckpoint(3).code(), absl::StatusCode::kOk);  // taken already
  EXPECT_EQ(store->ScheduleCheckpoint(4).code(), absl::StatusCode::kOk);
  EXPECT_EQ(committed.size(), 2u);
  Step(*store, map, 3, 0, 1);
  Step(*store, map, 3, 1);
  ASSERT_TRUE(store->checkpoint_writer()->WaitIdle(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(committed, std::vector<uint64_t>({2, 3, 4}));
}

// Asked while the shard is still applying a step (one group at the new
// version, one not yet: what a trainer that ended its last step and asks
// for a checkpoint can see), the checkpoint is that step, not the next one
// (which may never come).
TEST(ShardStoreCheckpointTest, MidApplyTakesTheStepBeingApplied) {
  CheckpointingCase c;
  const PartitionMap& map = c.map;
  std::vector<uint64_t>& committed = c.committed;
  ShardStore* store = c.store.get();
  Step(*store, map, 0);
  Step(*store, map, 1, /*only_group=*/0);  // group 0 at 2, group 1 at 1
  EXPECT_TRUE(store->ScheduleCheckpoint(2).ok());
  EXPECT_TRUE(committed.empty());
  Step(*store, map, 1, /*only_group=*/1);  // group 1 reaches 2
  ASSERT_TRUE(store->checkpoint_writer()->WaitIdle(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(committed, std::vector<uint64_t>({2}));
}

// Asked once the next step has begun here (a trainer that ended step 2
// asks while another already pushes its step-3 gradient), the checkpoint is
// step 2, now: the next step waits for the trainer that asked.
TEST(ShardStoreCheckpointTest, NextStepBegunStillTakesTheCurrentStep) {
  CheckpointingCase c;
  const PartitionMap& map = c.map;
  std::vector<uint64_t>& committed = c.committed;
  ShardStore* store = c.store.get();
  Step(*store, map, 0);
  Step(*store, map, 1);  // every group at 2
  Step(*store, map, 2, /*only_group=*/0, /*only_rank=*/1);
  EXPECT_TRUE(store->ScheduleCheckpoint(2).ok());
  ASSERT_TRUE(store->checkpoint_writer()->WaitIdle(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(committed, std::vector<uint64_t>({2}));
  // The checkpoint holds step 2's state; step 3 then completes as usual.
  Step(*store, map, 2, 0, 0);
  Step(*store, map, 2, 1);
  EXPECT_EQ(store->ScheduleCheckpoint(2).code(), absl::StatusCode::kOk);  // taken already
  EXPECT_EQ(store->ScheduleCheckpoint(1).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(store->ScheduleCheckpoint(3).ok());
  ASSERT_TRUE(store->checkpoint_writer()->WaitIdle(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(committed, std::vector<uint64_t>({2, 3}));
}

TEST(ShardStoreCheckpointTest, OffWithoutADirectoryAndRefusedAtStageZero) {
  auto plain = ShardStore::Create(Options(0, 1, 1, 1));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->ScheduleCheckpoint(1).code(), absl::StatusCode::kFailedPrecondition);
  ShardStoreOptions o = Options(0, 1, 1, 1);
  o.sum_only = true;
  o.checkpoint.root = "/tmp/unused";
  EXPECT_EQ(ShardStore::Create(o).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace zshard
