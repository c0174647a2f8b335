// In-memory snapshots, rollback and a replacement's restore on one shard
// store (issue 16): what the keeper sends is the state of its step; a
// rollback puts that state back and forgets the step in progress, refuses
// the trainers' contributions until they are admitted again, and redoing
// the step gives the bits of a store that never rolled back.
#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/shard_store.h"
#include "tests/test_models.h"

namespace zshard {
namespace {

using testing::MakeSpec;
using testing::ShardValues;

constexpr uint32_t kShard = 1, kShards = 2, kTrainers = 2;

// Collects what a store's keeper sends.
struct Sent {
  absl::Mutex mu;
  std::vector<Snapshot> snapshots ABSL_GUARDED_BY(mu);
  // What the send of a step answers (absent: OK).
  std::map<uint64_t, absl::Status> answers ABSL_GUARDED_BY(mu);
  // Blocks until a snapshot of `step` was sent (or 10 s).
  bool Await(uint64_t step) {
    absl::MutexLock lock(&mu);
    auto sent = [this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (const Snapshot& s : snapshots) {
        if (s.step() == step) return true;
      }
      return false;
    };
    return mu.AwaitWithTimeout(absl::Condition(&sent), absl::Seconds(10));
  }
  Snapshot Get(uint64_t step) {
    absl::MutexLock lock(&mu);
    for (const Snapshot& s : snapshots) {
      if (s.step() == step) return s;
    }
    return {};
  }
};

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = MakeSpec({{10, 7}, {33}});
    auto map = PartitionMap::Create(spec_, kShards, 4, 0);
    ASSERT_TRUE(map.ok());
    map_ = std::make_unique<PartitionMap>(*map);
  }
  std::unique_ptr<ShardStore> NewStore(Sent* sent, bool registered = true) {
    ShardStoreOptions o;
    o.shard_id = shard_;
    o.num_shards = kShards;
    o.alignment = 4;
    o.persistence_threshold = 0;
    o.world_size = kTrainers;
    o.adamw.lr = 0.01;
    o.snapshot_interval = 1;
    auto store = ShardStore::Create(o);
    EXPECT_TRUE(store.ok()) << store.status();
    if (sent) {
      (*store)->SetSnapshotSend(
          [sent](const Snapshot& s) {
            absl::MutexLock lock(&sent->mu);
            sent->snapshots.push_back(s);
            auto it = sent->answers.find(s.step());
            return it == sent->answers.end() ? absl::OkStatus() : it->second;
          },
          [](uint64_t) { return absl::OkStatus(); });
    }
    if (registered) {
      auto r = (*store)->Register(spec_, ShardValues(*map_, shard_));
      EXPECT_TRUE(r.ok()) << r.status();
    }
    return std::move(*store);
  }
  // Every rank's gradient of `step` for every group (values from the step,
  // rank and element), then waits for the new version.
  void Step(ShardStore& store, uint64_t step) {
    for (uint32_t g = 0; g < map_->num_groups(); ++g) {
      const Slice s = map_->slice(g, shard_);
      if (s.size() == 0) continue;
      for (uint32_t r = 0; r < kTrainers; ++r) {
        std::vector<float> grad = Gradient(step, r, s.size());
        ASSERT_TRUE(store
                        .AcceptGradient(g, step, 0, r, s.begin, grad.data(),
                                        grad.size())
                        .ok());
      }
    }
    for (uint32_t g = 0; g < map_->num_groups(); ++g) {
      if (map_->slice(g, shard_).size() != 0) Values(store, g, step + 1);
    }
  }
  static std::vector<float> Gradient(uint64_t step, uint32_t rank, size_t n) {
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) {
      out[i] = 0.01f * static_cast<float>(i) - 0.1f * static_cast<float>(rank) +
               0.03f * static_cast<float>(step);
    }
    return out;
  }
  std::vector<float> Values(ShardStore& store, uint32_t g, uint64_t version) {
    auto snap =
        store.ReadSlice(g, version, absl::Now() + absl::Seconds(10), {});
    EXPECT_TRUE(snap.ok()) << snap.status();
    if (!snap.ok()) return {};
    EXPECT_EQ(snap->version, version);
    return snap->values;
  }
  // Whether the keeper counts `step` complete within 10 s (its send
  // returned and it is free for the next).
  static bool Complete(ShardStore& store, uint64_t step) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (store.SnapshotStatistics().newest_complete != step) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }
  // Whether the keeper counts `n` failed sends within 10 s.
  static bool Failed(ShardStore& store, uint64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (store.SnapshotStatistics().failed != n) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }
  void Readmit(ShardStore& store, uint64_t step) {
    for (uint32_t r = 0; r < kTrainers; ++r) {
      auto from =
          store.PrepareAdmit(r, 0, "test", absl::Now() + absl::Seconds(5));
      ASSERT_TRUE(from.ok()) << from.status();
      EXPECT_EQ(*from, step);
      ASSERT_TRUE(store.Admit(r, *from).ok());
    }
  }

  v1::ModelSpec spec_;
  std::unique_ptr<PartitionMap> map_;
  uint32_t shard_ = kShard;  // the shard the stores serve
};

TEST_F(SnapshotTest, RollBackRestoresTheSnapshotAndRedoingGivesTheSameBits) {
  Sent sent;
  auto a = NewStore(&sent);
  auto b = NewStore(nullptr);
  for (uint64_t step = 0; step < 3; ++step) {
    Step(*a, step);
    Step(*b, step);
    // One at a time: a snapshot step that comes while the previous one is
    // still being sent is skipped.
    ASSERT_TRUE(sent.Await(step + 1));
    ASSERT_TRUE(Complete(*a, step + 1));
  }
  const std::vector<float> at3 = Values(*a, 1, 3);
  // Half of step 3 lands, then the cluster rolls back to 3.
  const Slice s = map_->slice(1, kShard);
  std::vector<float> grad = Gradient(3, 0, s.size());
  ASSERT_TRUE(
      a->AcceptGradient(1, 3, 0, 0, s.begin, grad.data(), grad.size()).ok());
  // A step it no longer keeps is refused, naming what it keeps.
  absl::Status old = a->RollBack(1, {0, 1}, "test");
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("keeps no snapshot of step 1"),
            std::string::npos)
      << old;
  ASSERT_TRUE(a->RollBack(3, {0, 1}, "shard 0 was replaced").ok());
  EXPECT_EQ(a->rollbacks(), 1u);
  for (const GroupProgress& p : a->Progress()) EXPECT_EQ(p.version, 3u);
  EXPECT_EQ(Values(*a, 1, 3), at3);
  // The trainers' old pushes are refused until they are admitted again.
  absl::Status stale =
      a->AcceptGradient(1, 3, 0, 1, s.begin, grad.data(), grad.size());
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("must join again"), std::string::npos)
      << stale;
  Readmit(*a, 3);
  Step(*a, 3);
  Step(*b, 3);
  for (uint32_t g = 0; g < map_->num_groups(); ++g) {
    EXPECT_EQ(Values(*a, g, 4), Values(*b, g, 4)) << "group " << g;
  }
}

TEST_F(SnapshotTest, AReplacementRestoresTheBuddysCopy) {
  Sent sent;
  auto a = NewStore(&sent);
  Step(*a, 0);
  ASSERT_TRUE(sent.Await(1));
  ASSERT_TRUE(Complete(*a, 1));
  Step(*a, 1);
  ASSERT_TRUE(sent.Await(2));
  const Snapshot copy = sent.Get(2);
  auto c = NewStore(nullptr, /*registered=*/false);
  // Another shard's copy, and an incomplete one, are refused.
  Snapshot other = copy;
  other.header.set_shard_id(0);
  EXPECT_EQ(c->RestoreSnapshot(spec_, other).code(),
            absl::StatusCode::kInvalidArgument);
  Snapshot partial = copy;
  partial.filled = 1;
  EXPECT_EQ(c->RestoreSnapshot(spec_, partial).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(c->registered());
  ASSERT_TRUE(c->RestoreSnapshot(spec_, copy).ok());
  for (uint32_t g = 0; g < map_->num_groups(); ++g) {
    EXPECT_EQ(Values(*c, g, 2), Values(*a, g, 2)) << "group " << g;
  }
  // Both go on to the same next step.
  Step(*a, 2);
  Step(*c, 2);
  for (uint32_t g = 0; g < map_->num_groups(); ++g) {
    EXPECT_EQ(Values(*c, g, 3), Values(*a, g, 3)) << "group " << g;
  }
  EXPECT_EQ(c->RestoreSnapshot(spec_, copy).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SnapshotTest, AGroupWithNothingOnTheShardDoesNotHoldTheSnapshotBack) {
  // A group of one alignment unit lies on shard 1; on shard 0 it is never
  // published, and shard 0's keeper must not wait for it.
  shard_ = 0;
  spec_ = MakeSpec({{10, 7}, {2}, {33}});
  auto map = PartitionMap::Create(spec_, kShards, 4, 0);
  ASSERT_TRUE(map.ok());
  map_ = std::make_unique<PartitionMap>(*map);
  bool empty_here = false;
  for (uint32_t g = 0; g < map_->num_groups(); ++g) {
    empty_here = empty_here || map_->slice(g, shard_).size() == 0;
  }
  ASSERT_TRUE(empty_here) << "the spec must leave a group off shard 0";
  Sent sent;
  auto a = NewStore(&sent);
  for (uint64_t step = 0; step < 3; ++step) {
    Step(*a, step);
    ASSERT_TRUE(sent.Await(step + 1)) << "step " << step + 1;
    ASSERT_TRUE(Complete(*a, step + 1)) << "step " << step + 1;
  }
  EXPECT_EQ(sent.Get(3).step(), 3u);
}

TEST_F(SnapshotTest, ACopyWhoseSendFailedUnansweredStaysUntilANewerIsComplete) {
  // Step 2's report got no answer (the coordinator died after counting it
  // complete, say): the others may roll back to 2, so it stays listed, and
  // a rollback to it works. Step 3 failed everywhere (ABORTED): not kept.
  Sent sent;
  {
    absl::MutexLock lock(&sent.mu);
    sent.answers[2] = absl::UnavailableError("Socket closed");
    sent.answers[3] = absl::AbortedError("shard 0 skipped the step");
  }
  auto a = NewStore(&sent);
  Step(*a, 0);
  ASSERT_TRUE(Complete(*a, 1));
  Step(*a, 1);
  ASSERT_TRUE(Failed(*a, 1));
  EXPECT_EQ(a->OwnSnapshotSteps(), (std::vector<uint64_t>{1, 2}));
  const std::vector<float> at2 = Values(*a, 1, 2);
  Step(*a, 2);
  ASSERT_TRUE(Failed(*a, 2));
  EXPECT_EQ(a->OwnSnapshotSteps(), (std::vector<uint64_t>{1, 2}));
  Step(*a, 3);
  ASSERT_TRUE(Complete(*a, 4));
  EXPECT_EQ(a->OwnSnapshotSteps(), (std::vector<uint64_t>{4}));

  auto b = NewStore(&sent);
  Step(*b, 0);
  ASSERT_TRUE(Complete(*b, 1));
  Step(*b, 1);
  ASSERT_TRUE(Failed(*b, 1));
  Step(*b, 2);
  ASSERT_TRUE(b->RollBack(2, {0, 1}, "shard 0 was replaced").ok());
  EXPECT_EQ(Values(*b, 1, 2), at2);
}

}  // namespace
}  // namespace zshard
