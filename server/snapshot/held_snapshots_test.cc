// The buddy side of snapshots: what HeldSnapshots keeps, and the stream a
// snapshot travels as (header, then the floats, refused when it does not
// add up).
#include "server/snapshot/held_snapshots.h"

#include <vector>

#include "gtest/gtest.h"
#include "server/snapshot/snapshot_wire.h"

namespace zshard {
namespace {

Snapshot Make(uint32_t shard, uint64_t step, uint64_t floats) {
  Snapshot s;
  s.header.set_shard_id(shard);
  s.header.set_num_shards(3);
  s.header.set_step(step);
  v1::SnapshotGroup* g = s.header.add_groups();
  g->set_group(0);
  g->set_master_elements(floats / 3);
  g->set_moment_elements(floats / 3);
  s.header.set_total_floats(floats);
  for (uint64_t i = 0; i < floats; ++i) {
    s.data.push_back(static_cast<float>(step * 1000 + i));
  }
  s.filled = floats;
  return s;
}

// Prepared buffers are what the first snapshots of that shard arrive in
// (room for the values, no fresh memory), at most kBuffersPerShard of them
// however often a model is set up; another shard's still get their own.
TEST(HeldSnapshotsTest, TheFirstSnapshotsArriveInPreparedBuffers) {
  HeldSnapshots held;
  held.Prepare(1, 1200);
  held.Prepare(1, 1200);  // a rollback sets the model up again
  std::vector<std::shared_ptr<Snapshot>> arrived;
  for (uint64_t step = 1; step <= HeldSnapshots::kBuffersPerShard + 1; ++step) {
    Snapshot src = Make(1, step, 999);
    arrived.push_back(held.Begin(src.header));
    ASSERT_EQ(arrived.back()->data.size(), 999u);
  }
  for (int i = 0; i < HeldSnapshots::kBuffersPerShard; ++i) {
    EXPECT_GE(arrived[i]->data.capacity(), 1200u) << i;  // a prepared one
  }
  EXPECT_LT(arrived.back()->data.capacity(), 1200u);  // no more were made
  EXPECT_LT(held.Begin(Make(2, 1, 999).header)->data.capacity(), 1200u);
  // One bigger than the room prepared still arrives whole.
  EXPECT_EQ(held.Begin(Make(1, 9, 3000).header)->data.size(), 3000u);
}

TEST(HeldSnapshotsTest, KeepsTheNewestAndTheNewestHeldEverywhere) {
  HeldSnapshots held;
  for (uint64_t step : {1, 2, 3}) {
    Snapshot src = Make(1, step, 6);
    src.header.set_complete_step(step - 1);
    std::shared_ptr<Snapshot> s = held.Begin(src.header);
    s->data = src.data;
    s->filled = src.filled;
    held.Keep(std::move(s));
  }
  std::shared_ptr<Snapshot> other = held.Begin(Make(2, 3, 3).header);
  held.Keep(other);
  EXPECT_EQ(held.Get(1, 1), nullptr);
  ASSERT_NE(held.Get(1, 3), nullptr);
  EXPECT_EQ(held.Get(1, 3)->data[0], 3000.0f);
  ASSERT_NE(held.Get(1, 2), nullptr);
  EXPECT_NE(held.Get(2, 3), nullptr);
  EXPECT_EQ(held.Inventory().size(), 3u);
  EXPECT_EQ(held.bytes(), (6 + 6 + 3) * sizeof(float));
  // Steps 4 and 5 arrive but were not held everywhere (the sender still
  // names 3): 3 stays, 4 goes.
  for (uint64_t step : {4, 5}) {
    Snapshot src = Make(1, step, 6);
    src.header.set_complete_step(3);
    std::shared_ptr<Snapshot> s = held.Begin(src.header);
    s->data = src.data;
    s->filled = src.filled;
    held.Keep(std::move(s));
  }
  EXPECT_NE(held.Get(1, 3), nullptr);
  EXPECT_EQ(held.Get(1, 4), nullptr);
  EXPECT_NE(held.Get(1, 5), nullptr);
}

TEST(SnapshotWireTest, RoundTripAndRefusals) {
  const Snapshot src = Make(1, 7, 3 * 300000);  // more than one chunk
  std::vector<v1::SnapshotChunk> chunks;
  ASSERT_TRUE(WriteSnapshot(src, [&chunks](const v1::SnapshotChunk& c) {
                chunks.push_back(c);
                return true;
              }).ok());
  ASSERT_GT(chunks.size(), 2u);
  ASSERT_TRUE(chunks[0].has_header());
  EXPECT_TRUE(CheckSnapshotHeader(chunks[0].header(), 1, 3, 1).ok());
  Snapshot dst;
  dst.header = chunks[0].header();
  dst.data.resize(dst.header.total_floats());
  for (const auto& c : chunks) ASSERT_TRUE(ReadSnapshotData(c, &dst).ok());
  EXPECT_TRUE(dst.complete());
  EXPECT_EQ(dst.data, src.data);
  // One more chunk runs past the total; a torn float is refused.
  EXPECT_EQ(ReadSnapshotData(chunks[1], &dst).code(),
            absl::StatusCode::kInvalidArgument);
  v1::SnapshotChunk torn;
  torn.set_data("abc");
  EXPECT_EQ(ReadSnapshotData(torn, &dst).code(),
            absl::StatusCode::kInvalidArgument);
  // Headers that do not describe the expected shard or add up.
  EXPECT_EQ(CheckSnapshotHeader(src.header, 2, 3, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckSnapshotHeader(src.header, 1, 3, 2).code(),
            absl::StatusCode::kInvalidArgument);
  v1::SnapshotHeader bad = src.header;
  bad.set_total_floats(5);
  EXPECT_EQ(CheckSnapshotHeader(bad, 1, 3, 1).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zshard
