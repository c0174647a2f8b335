// Writer, coordinator and reader of checkpoints together, on a real
// directory: round trips, deltas, re-sharded reads, corruption, GC.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/checkpoint/checkpoint_coordinator.h"
#include "common/checkpoint/checkpoint_reader.h"
#include "server/checkpoint/checkpoint_writer.h"
#include "common/checkpoint/durable_file.h"
#include "tests/test_models.h"

namespace zshard {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/zshard_ckpt_test_XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d;
}

// A model's full state held by the test, cut into shards like a cluster.
class CheckpointTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kShards = 3;

  void SetUp() override {
    root_ = TempDir();
    spec_ = testing::MakeSpec({{1000, 37}, {5000}, {64}});
    spec_.mutable_groups(2)->mutable_tensors(0)->set_trainable(false);
    map_ = std::make_unique<PartitionMap>(*PartitionMap::Create(spec_, kShards, 16, 0));
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0, 1);
    state_.resize(map_->num_groups());
    for (size_t g = 0; g < map_->num_groups(); ++g) {
      for (auto& a : state_[g]) {
        a.resize(map_->group_numel(g));
        for (float& x : a) x = d(rng);
      }
    }
    MakeCluster(/*full_every=*/3, /*keep_bases=*/1);
  }

  void TearDown() override {
    writers_.clear();
    std::system(("rm -rf " + root_).c_str());
  }

  void MakeCluster(uint32_t full_every, uint32_t keep_bases,
                   absl::Duration chunk_delay = absl::ZeroDuration()) {
    writers_.clear();
    CheckpointCoordinatorOptions co;
    co.root = root_;
    co.keep_bases = keep_bases;
    co.cluster.num_shards = kShards;
    co.cluster.world_size = 2;
    co.cluster.accumulation_steps = 1;
    co.cluster.alignment = 16;
    co.history = [] {
      MembershipRecord r;
      r.kind = "DROPPED";
      r.rank = 1;
      r.identity = "host:7 (instance 1)";
      r.step = 9;
      r.reason = "no heartbeat";
      r.unix_seconds = 1.5;
      return std::vector<MembershipRecord>{r};
    };
    coordinator_ = std::make_unique<CheckpointCoordinator>(co);
    for (uint32_t s = 0; s < kShards; ++s) {
      CheckpointWriterOptions o;
      o.root = root_;
      o.shard_id = s;
      o.num_shards = kShards;
      o.chunk_elements = 256;
      o.full_every = full_every;
      o.testing_chunk_delay = chunk_delay;
      std::vector<StagedGroupShape> shapes;
      for (size_t g = 0; g < map_->num_groups(); ++g) {
        shapes.push_back({map_->slice(g, s).begin, map_->slice(g, s).size()});
      }
      auto w = CheckpointWriter::Create(
          o, shapes,
          [this, s](const ShardManifest& m, uint32_t crc) {
            ShardCommit c;
            c.step = m.step;
            c.shard_id = s;
            c.base_step = m.base_step;
            c.manifest_crc = crc;
            c.bytes_written = m.bytes_written;
            c.trainer_states = m.trainer_states;
            c.last_step_skipped = m.last_step_skipped;
            return coordinator_->Commit(c, spec_);
          },
          [this, s](uint64_t step) {
            CheckpointWriter::TrainerResume r;
            // Only the last few steps' states are kept (TrainerStates): gone
            // once this shard's data file is begun.
            const std::string data =
                root_ + "/" + StepDirName(step) + "/" + ShardDataName(s);
            if (forget_states_once_written_ &&
                (std::ifstream(data).good() ||
                 std::ifstream(data + ".tmp").good())) {
              return r;
            }
            r.states = {{0, "pos" + std::to_string(step)}, {1, std::string("\0\1", 2)}};
            r.last_step_skipped = step == 20;
            return r;
          });
      ASSERT_TRUE(w.ok()) << w.status();
      writers_.push_back(std::move(*w));
    }
  }

  // Stages every shard's slices (groups in reverse order, as arrival may be).
  GlobalManifest Checkpoint(uint64_t step) {
    for (uint32_t s = 0; s < kShards; ++s) {
      for (size_t g = map_->num_groups(); g-- > 0;) {
        const Slice& sl = map_->slice(g, s);
        EXPECT_TRUE(writers_[s]
                        ->StageGroup(step, static_cast<uint32_t>(g),
                                     state_[g][0].data() + sl.begin,
                                     state_[g][1].data() + sl.begin,
                                     state_[g][2].data() + sl.begin, step, step - 1,
                                     absl::Now() + absl::Seconds(10))
                        .ok());
      }
    }
    auto done = coordinator_->WaitComplete(step, absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(done.ok()) << done.status();
    for (auto& w : writers_) EXPECT_TRUE(w->WaitIdle(absl::Now() + absl::Seconds(10)).ok());
    return done.ok() ? *done : GlobalManifest{};
  }

  void ExpectReads(uint64_t step, const std::vector<std::array<std::vector<float>, 3>>& want) {
    auto r = CheckpointReader::Open(root_, step);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*r)->VerifyDataFiles().ok());
    for (size_t g = 0; g < want.size(); ++g) {
      for (int a = 0; a < 3; ++a) {
        std::vector<float> got(want[g][a].size(), -1.0f);
        ASSERT_TRUE((*r)->Read(static_cast<uint32_t>(g), static_cast<StateArray>(a), 0,
                               got.size(), got.data())
                        .ok());
        ASSERT_EQ(0, std::memcmp(got.data(), want[g][a].data(), got.size() * 4))
            << "group " << g << " array " << a;
      }
    }
  }

  std::string root_;
  v1::ModelSpec spec_;
  std::unique_ptr<PartitionMap> map_;
  std::vector<std::array<std::vector<float>, 3>> state_;
  std::unique_ptr<CheckpointCoordinator> coordinator_;
  std::vector<std::unique_ptr<CheckpointWriter>> writers_;
  std::atomic<bool> forget_states_once_written_{false};
};

TEST_F(CheckpointTest, BaseRoundTripsBitExactWithTrainerStatesAndSpec) {
  GlobalManifest g = Checkpoint(10);
  EXPECT_EQ(g.step, 10u);
  EXPECT_EQ(g.base_step, 10u);
  EXPECT_EQ(g.trainer_states.at(0), "pos10");
  EXPECT_EQ(g.trainer_states.at(1), std::string("\0\1", 2));
  ExpectReads(10, state_);
  auto r = CheckpointReader::Open(root_, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->spec().SerializeAsString(), spec_.SerializeAsString());
  EXPECT_EQ((*r)->applied(1), 9u);
  EXPECT_EQ((*r)->global().trainer_states.at(0), "pos10");
  ASSERT_EQ((*r)->global().membership_history.size(), 1u);
  EXPECT_EQ((*r)->global().membership_history[0].kind, "DROPPED");
  EXPECT_EQ((*r)->global().membership_history[0].step, 9u);
  EXPECT_EQ((*r)->global().membership_history[0].reason, "no heartbeat");
}

TEST_F(CheckpointTest, DeltaStoresOnlyChangedChunksAndReadsBack) {
  GlobalManifest base = Checkpoint(10);
  auto before = state_;
  // Change one element of group 1's master and nothing else.
  state_[1][0][4000] += 1.0f;
  GlobalManifest d = Checkpoint(20);
  EXPECT_EQ(d.base_step, 10u);
  EXPECT_TRUE(d.last_step_skipped);
  EXPECT_LT(d.bytes_written * 20, base.bytes_written);
  ExpectReads(20, state_);
  ExpectReads(10, before);  // the older one still reads as it was
  // Nothing changed: a delta of (almost) nothing.
  GlobalManifest empty = Checkpoint(30);
  EXPECT_EQ(empty.bytes_written, 0u);
  ExpectReads(30, state_);
  // The third after the base is a new base (full_every = 3).
  GlobalManifest next = Checkpoint(40);
  EXPECT_EQ(next.base_step, 40u);
  ExpectReads(40, state_);
}

TEST_F(CheckpointTest, ReadsAnyRangeAcrossOldShards) {
  for (auto& g : state_) g[1][0] = 5;  // some change for the delta
  Checkpoint(10);
  state_[0][1][1036] = -3;
  Checkpoint(20);
  auto r = CheckpointReader::Open(root_, 20);
  ASSERT_TRUE(r.ok());
  // Ranges as 2 or 5 new shards would own them.
  for (uint32_t shards : {2u, 5u}) {
    auto map = *PartitionMap::Create(spec_, shards, 8, 0);
    for (uint32_t s = 0; s < shards; ++s) {
      for (size_t g = 0; g < map.num_groups(); ++g) {
        const Slice& sl = map.slice(g, s);
        std::vector<float> got(sl.size());
        ASSERT_TRUE((*r)->Read(static_cast<uint32_t>(g), StateArray::kExpAvg, sl.begin,
                               sl.end, got.data())
                        .ok());
        ASSERT_EQ(0, std::memcmp(got.data(), state_[g][1].data() + sl.begin, got.size() * 4));
      }
    }
  }
  std::vector<float> out(10);
  EXPECT_EQ((*r)->Read(0, StateArray::kMaster, 1030, 1040, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, CorruptDataIsDetectedAndLatestFallsBack) {
  Checkpoint(10);
  state_[1][0][10] = 42;
  Checkpoint(20);
  const std::string file = root_ + "/step-00000020/shard-00000.data";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    char c;
    f.read(&c, 1);
    f.seekp(5);
    c ^= 0x40;
    f.write(&c, 1);
  }
  auto r = CheckpointReader::Open(root_, 20);
  ASSERT_TRUE(r.ok());
  absl::Status st = (*r)->VerifyDataFiles();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("step-00000020/shard-00000.data"), std::string::npos) << st;
  std::vector<std::string> refused;
  auto latest = FindRestorableCheckpoint(root_, UINT64_MAX, &refused);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 10u);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("shard-00000.data"), std::string::npos);
}

TEST_F(CheckpointTest, TruncatedManifestOrMissingGlobalIsRefused) {
  Checkpoint(10);
  Checkpoint(20);
  const std::string m = root_ + "/step-00000020/shard-00001.manifest.json";
  ASSERT_EQ(::truncate(m.c_str(), 100), 0);
  auto r = CheckpointReader::Open(root_, 20);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("shard-00001.manifest.json"), std::string::npos);
  ::unlink((root_ + "/step-00000010/MANIFEST.json").c_str());
  EXPECT_EQ(CheckpointReader::Open(root_, 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindRestorableCheckpoint(root_, UINT64_MAX, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, OldChainsAreCollectedAfterANewerBase) {
  MakeCluster(/*full_every=*/2, /*keep_bases=*/1);
  for (uint64_t step : {10, 20, 30, 40, 50}) {
    state_[0][0][step] += 1;
    Checkpoint(step);
  }
  // Bases at 10, 30, 50; keeping one base leaves only 50.
  auto steps = ListCheckpointSteps(root_);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<uint64_t>({50}));
  ExpectReads(50, state_);
}

TEST_F(CheckpointTest, StepsOnlyIncrease) {
  Checkpoint(10);
  const Slice& sl = map_->slice(0, 0);
  absl::Status st = writers_[0]->StageGroup(10, 0, state_[0][0].data() + sl.begin,
                                            state_[0][1].data() + sl.begin,
                                            state_[0][2].data() + sl.begin, 10, 9,
                                            absl::Now() + absl::Seconds(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
  writers_[1]->SkipStepsUpTo(30);
  EXPECT_EQ(writers_[1]->last_step(), 30u);
  EXPECT_EQ(writers_[1]
                ->StageGroup(20, 0, state_[0][0].data(), state_[0][1].data(),
                             state_[0][2].data(), 20, 19, absl::Now() + absl::Seconds(1))
                .code(),
            absl::StatusCode::kAlreadyExists);
}

// A shard that stops (SIGTERM) finishes and commits a write in progress,
// drops a step only partly staged and says so, and stages nothing after.
TEST_F(CheckpointTest, DrainFinishesTheWriteAndDropsAPartialStaging) {
  auto stage = [this](uint32_t s, uint32_t g, uint64_t step) {
    const Slice& sl = map_->slice(g, s);
    return writers_[s]->StageGroup(step, g, state_[g][0].data() + sl.begin,
                                   state_[g][1].data() + sl.begin,
                                   state_[g][2].data() + sl.begin, step, step - 1,
                                   absl::Now() + absl::Seconds(10));
  };
  for (uint32_t s = 0; s < 2; ++s) {
    for (uint32_t g = 0; g < map_->num_groups(); ++g) ASSERT_TRUE(stage(s, g, 10).ok());
  }
  ASSERT_TRUE(stage(2, 0, 10).ok());  // shard 2 stops mid-staging
  for (uint32_t s = 0; s < 2; ++s) {
    uint64_t abandoned = 99;
    ASSERT_TRUE(writers_[s]->Drain(absl::Now() + absl::Seconds(20), &abandoned).ok());
    EXPECT_EQ(abandoned, 0u);
    EXPECT_EQ(writers_[s]->writes_completed(), 1u) << "shard " << s;
  }
  uint64_t abandoned = 0;
  ASSERT_TRUE(writers_[2]->Drain(absl::Now() + absl::Seconds(20), &abandoned).ok());
  EXPECT_EQ(abandoned, 10u);
  EXPECT_EQ(writers_[2]->writes_completed(), 0u);
  absl::Status later = stage(2, 1, 10);
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_NE(later.message().find("stopping"), std::string::npos) << later;

  absl::Status waiting = coordinator_->WaitSettled(absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(waiting.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(waiting.message().find("step 10 waits for shards 2"), std::string::npos)
      << waiting;
  ShardCommit failed;
  failed.step = 10;
  failed.shard_id = 2;
  failed.error = absl::AbortedError("shard 2 stopped");
  ASSERT_TRUE(coordinator_->Commit(failed, spec_).ok());
  EXPECT_TRUE(coordinator_->WaitSettled(absl::Now() + absl::Seconds(1)).ok());
  auto done = coordinator_->WaitComplete(10, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(done.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(done.status().message().find("failed on shard 2"), std::string::npos)
      << done.status();
}

// The trainers' states are taken before the write: a write that ends after
// the states of step - 1 were forgotten still holds them.
TEST_F(CheckpointTest, TrainerStatesAreTakenBeforeTheWrite) {
  MakeCluster(/*full_every=*/3, /*keep_bases=*/1, absl::Milliseconds(20));
  forget_states_once_written_ = true;
  for (uint32_t s = 0; s < kShards; ++s) {
    for (size_t g = 0; g < map_->num_groups(); ++g) {
      const Slice& sl = map_->slice(g, s);
      ASSERT_TRUE(writers_[s]
                      ->StageGroup(10, static_cast<uint32_t>(g),
                                   state_[g][0].data() + sl.begin,
                                   state_[g][1].data() + sl.begin,
                                   state_[g][2].data() + sl.begin, 10, 9,
                                   absl::Now() + absl::Seconds(10))
                      .ok());
    }
  }
  auto done = coordinator_->WaitComplete(10, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->trainer_states.size(), 2u);
  EXPECT_EQ(done->trainer_states[0], "pos10");
}

TEST_F(CheckpointTest, NoTemporaryFilesRemain) {
  Checkpoint(10);
  std::string out;
  FILE* p = ::popen(("find " + root_ + " -name '*.tmp'").c_str(), "r");
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  EXPECT_EQ(out, "");
}

}  // namespace
}  // namespace zshard
