#include "client/ctl/plan.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"

namespace zshard {
namespace {

PlanInput Wide() {
  PlanInput in;
  in.config = DefaultTrainingConfig();
  // links_bench's: a 5e6-element window and gradient bucket.
  in.config.stage3_prefetch_bucket_size = 5'000'000;
  in.config.reduce_bucket_size = 5'000'000;
  // Snapshots every 2 steps (the arithmetic below counts on it).
  in.config.fault_tolerance.snapshot_interval_steps = 2;
  in.params = 50'000'000;
  in.groups = 4;  // 12.5M each: larger than the window
  in.trainers = 2;
  in.shards = 4;
  in.shards_per_host = 2;
  in.link_gbps = 1;
  in.compute_ms = 1000;
  return in;
}

TEST(PlanTest, MemoryFallsWithTheStageAndBytesFollowTheCachesRules) {
  auto plans = PlanStages(Wide());
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 4u);
  const auto& p = *plans;
  for (uint32_t s = 1; s <= 3; ++s) {
    EXPECT_LT(p[s].trainer_total(), p[s - 1].trainer_total()) << s;
  }
  const double n = 50e6;
  EXPECT_DOUBLE_EQ(p[0].trainer_total(), 20 * n);  // params, grads, moments
  EXPECT_DOUBLE_EQ(p[1].trainer_params, 4 * n);
  EXPECT_DOUBLE_EQ(p[1].trainer_grads, 4 * n);
  EXPECT_DOUBLE_EQ(p[3].trainer_optimizer, 0);
  // Stages 1 and 2 fetch every parameter once and push every gradient once.
  EXPECT_DOUBLE_EQ(p[2].fetched_bytes, 4 * n);
  EXPECT_DOUBLE_EQ(p[2].pushed_bytes, 4 * n);
  // Stage 3: the window holds no group, so backward fetches
  // every group again.
  EXPECT_DOUBLE_EQ(p[3].fetched_bytes, 8 * n);
  // A shard: fp32 master and AdamW moments for its quarter, except stage 0.
  EXPECT_DOUBLE_EQ(p[1].server_state, 12 * n / 4);
  EXPECT_DOUBLE_EQ(p[0].server_state, 4 * n / 4);
  // 1 Gbit/s: a trainer moves 8n bytes at stage 2, its host's link carries
  // them, and so does a server host (2 shards x 2 trainers / 4 shards), which
  // also sends a shard's state (12n / 4) to the next host every 2 steps.
  EXPECT_DOUBLE_EQ(p[2].snapshot_across_bytes, 12 * n / 4 / 2);
  EXPECT_NEAR(p[2].comm_seconds, (8 * n + 1.5 * n) / 125e6, 1e-9);
  // Stage 0 does not overlap; stage 2 overlaps: forward (1/3 s) waits for
  // the first of 4 groups and computes behind the fetches and the snapshot
  // (5.5n bytes); backward (2/3 s) pushes 4 buckets of a group each (4n
  // bytes), each behind the next one's computation, the last one waited for.
  EXPECT_NEAR(p[0].step_seconds, 1.0 + p[0].comm_seconds, 1e-9);
  const double fwd_link = 5.5 * n / 125e6, bwd_link = 4 * n / 125e6;
  const double forward = fwd_link / 4 + std::max(1.0 / 3, fwd_link);
  const double part = 2.0 / 3 / 4;
  const double backward =
      part + 3 * std::max(part, bwd_link / 4) + bwd_link / 4;
  EXPECT_NEAR(p[2].step_seconds, forward + backward, 1e-9);
  EXPECT_LT(p[2].step_seconds, 1.0 + p[2].comm_seconds);
}

// The overlap follows the code's pieces: with the link far faster than the
// computation the step is the computation plus the first group's fetch and
// the last piece's push; stage 1 pushes everything at the step's end.
TEST(PlanTest, OverlapHidesAFastLinkBehindTheComputation) {
  PlanInput in = Wide();
  in.link_gbps = 1000;
  in.config.fault_tolerance.snapshot_interval_steps = 0;
  auto plans = PlanStages(in);
  ASSERT_TRUE(plans.ok());
  const double n = 50e6, rate = 125e9;
  const auto& p = *plans;
  // Stage 3, the window holds no group: nothing is prefetched, so every
  // fetch is waited for, in forward (4 groups) and again in backward (4),
  // and then the last group's push.
  EXPECT_NEAR(p[3].step_seconds, 1.0 + 9 * n / rate, 1e-9);
  EXPECT_NEAR(p[1].step_seconds, 1.0 + n / rate + 4 * n / rate, 1e-9);
  // Accumulation: stage 3 fetches and pushes in every micro-step.
  in.config.gradient_accumulation_steps = 2;
  auto acc = PlanStages(in);
  ASSERT_TRUE(acc.ok());
  EXPECT_NEAR((*acc)[3].step_seconds, 1.0 + 2 * 9 * n / rate, 1e-9);
  // A window of one group prefetches the next one and keeps the last for
  // backward: the first group's fetch, then the last piece's share of
  // backward's 3 re-fetches and 4 pushes.
  in.config.gradient_accumulation_steps = 1;
  in.config.stage3_prefetch_bucket_size = 12'500'000;
  auto one = PlanStages(in);
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR((*one)[3].step_seconds, 1.0 + n / rate + 7 * n / 4 / rate, 1e-9);
}

// In-memory snapshots: two copies of a shard's state and three of its
// neighbour's on every shard; their traffic crosses a server host's link
// only where a buddy is on another host.
TEST(PlanTest, SnapshotsTakeMemoryAndCrossHostLinksToBuddies) {
  PlanInput in = Wide();
  in.config.fault_tolerance.snapshot_interval_steps = 0;
  auto off = PlanStages(in);
  ASSERT_TRUE(off.ok());
  in.config.fault_tolerance.snapshot_interval_steps = 4;
  auto on = PlanStages(in);
  ASSERT_TRUE(on.ok());
  const double n = 50e6;
  for (uint32_t s = 0; s <= 3; ++s) {
    const StagePlan& a = (*off)[s];
    const StagePlan& b = (*on)[s];
    EXPECT_DOUBLE_EQ(a.server_snapshots, 0) << s;
    EXPECT_DOUBLE_EQ(a.snapshot_across_bytes, 0) << s;
    EXPECT_DOUBLE_EQ(b.server_snapshots, 5 * b.server_state) << s;
    EXPECT_DOUBLE_EQ(b.server_total() - a.server_total(), 5 * b.server_state)
        << s;
    EXPECT_DOUBLE_EQ(b.snapshot_across_bytes, b.server_state / 4) << s;
    // The trainers' links carry no snapshot.
    EXPECT_DOUBLE_EQ(b.fetched_bytes, a.fetched_bytes) << s;
  }
  EXPECT_NEAR((*on)[3].comm_seconds - (*off)[3].comm_seconds,
              12 * n / 4 / 4 / 125e6, 1e-9);
  // Every shard on one host: the snapshots stay in its memory.
  in.shards_per_host = in.shards;
  auto one_host = PlanStages(in);
  ASSERT_TRUE(one_host.ok());
  EXPECT_DOUBLE_EQ((*one_host)[3].snapshot_across_bytes, 0);
  EXPECT_GT((*one_host)[3].server_snapshots, 0);
  // A single shard has no buddy.
  in.shards = in.shards_per_host = 1;
  auto alone = PlanStages(in);
  ASSERT_TRUE(alone.ok());
  EXPECT_DOUBLE_EQ((*alone)[3].server_snapshots, 0);
}

// A snapshot larger than the step's fetches (int8 weights and gradients):
// it shares the server host's link with the forward fetches, which take
// twice as long, and its rest goes while stage 2's backward leaves that
// link idle; every other step has none, so the mean step pays half of it.
// The trainers' link and the step's other parts are as without snapshots.
TEST(PlanTest, ASnapshotSharesTheLinkWithTheFetchesAndGoesOnWhileItIsIdle) {
  PlanInput in = Wide();
  in.config.quantization.weights = true;
  in.config.quantization.gradients = true;
  in.config.fault_tolerance.snapshot_interval_steps = 0;
  auto off = PlanStages(in);
  ASSERT_TRUE(off.ok());
  in.config.fault_tolerance.snapshot_interval_steps = 2;
  auto on = PlanStages(in);
  ASSERT_TRUE(on.ok());
  const StagePlan& p = (*on)[2];
  const double rate = 125e6;
  const double fetch = p.fetched_across_bytes / rate;  // one server host's
  const double snapshot = 2 * p.snapshot_across_bytes / rate;
  ASSERT_GT(snapshot, fetch);
  // Forward: 1/3 s of computation behind 4 groups' fetches.
  auto forward = [](double link) { return link / 4 + std::max(1.0 / 3, link); };
  const double with = forward(2 * fetch), without = forward(fetch);
  // The rest of the snapshot fits in the forward's and backward's idle time.
  ASSERT_LT(snapshot - fetch - (with - 2 * fetch), 2.0 / 3);
  EXPECT_NEAR(p.step_seconds - (*off)[2].step_seconds, (with - without) / 2,
              1e-9);
  // The old rule (each step's share of a snapshot in its forward fetches)
  // costs more.
  EXPECT_LT(p.step_seconds - (*off)[2].step_seconds,
            forward(fetch + snapshot / 2) - without);
}

TEST(PlanTest, AWindowThatHoldsTheModelFetchesOnceAndQuantizingCutsBytes) {
  PlanInput in = Wide();
  in.config.stage3_prefetch_bucket_size = 100'000'000;
  auto plain = PlanStages(in);
  ASSERT_TRUE(plain.ok());
  EXPECT_DOUBLE_EQ((*plain)[3].fetched_bytes, (*plain)[2].fetched_bytes);
  in.config.quantization.weights = true;
  in.config.quantization.gradients = true;
  auto q = PlanStages(in);
  ASSERT_TRUE(q.ok());
  for (uint32_t s = 1; s <= 3; ++s) {
    const double ratio = ((*q)[s].fetched_bytes + (*q)[s].pushed_bytes) /
                         ((*plain)[s].fetched_bytes + (*plain)[s].pushed_bytes);
    EXPECT_NEAR(ratio, 0.25 * (1 + 4.0 / 128), 1e-3) << s;
    // Shards keep the quantized copy beside the plain one.
    EXPECT_GT((*q)[s].server_published, (*plain)[s].server_published);
  }
  // Stage 0 averages fp32 gradients whatever the config says.
  EXPECT_DOUBLE_EQ((*q)[0].fetched_bytes, (*plain)[0].fetched_bytes);
}

// hpZ: with 2 trainers per host sharing, each version of each slice crosses
// a host's link once; stage 3's backward re-fetches come from host memory.
TEST(PlanTest, HpzFetchesEachVersionAcrossOncePerHost) {
  PlanInput in = Wide();
  in.trainers = 4;
  in.trainers_per_host = 2;
  auto plain = PlanStages(in);
  ASSERT_TRUE(plain.ok());
  in.config.hpz_partition_size = 2;
  auto hpz = PlanStages(in);
  ASSERT_TRUE(hpz.ok());
  const double n = 50e6;
  for (uint32_t s = 1; s <= 3; ++s) {
    EXPECT_DOUBLE_EQ((*hpz)[s].fetched_bytes, (*plain)[s].fetched_bytes);
    EXPECT_DOUBLE_EQ((*hpz)[s].fetched_across_bytes, 4 * n / 2) << s;
    EXPECT_LT((*hpz)[s].comm_seconds, (*plain)[s].comm_seconds) << s;
  }
  EXPECT_DOUBLE_EQ((*plain)[3].fetched_across_bytes, 8 * n);
  // Stage 0 fetches the averaged gradient, not shared.
  EXPECT_DOUBLE_EQ((*hpz)[0].fetched_across_bytes, (*hpz)[0].fetched_bytes);
  EXPECT_NE(FormatPlans(in, *hpz).find("hpZ"), std::string::npos);
}

TEST(PlanTest, OutOfRangeInputsAreNamed) {
  struct Case {
    void (*change)(PlanInput&);
    const char* flag;
  } cases[] = {
      {[](PlanInput& in) { in.params = 0; }, "--params"},
      {[](PlanInput& in) { in.groups = 0; }, "--groups"},
      {[](PlanInput& in) { in.trainers = 0; }, "--trainers"},
      {[](PlanInput& in) { in.shards_per_host = 5; }, "--shards_per_host"},
      {[](PlanInput& in) { in.link_gbps = 0; }, "--link_gbps"},
      {[](PlanInput& in) { in.compute_ms = -1; }, "--compute_ms"},
  };
  for (const Case& c : cases) {
    PlanInput in = Wide();
    c.change(in);
    auto plans = PlanStages(in);
    EXPECT_EQ(plans.status().code(), absl::StatusCode::kInvalidArgument)
        << c.flag;
    EXPECT_NE(plans.status().message().find(c.flag), std::string::npos)
        << plans.status();
  }
  auto ok = PlanStages(Wide());
  ASSERT_TRUE(ok.ok());
  const std::string table = FormatPlans(Wide(), *ok);
  EXPECT_NE(table.find("parameters on the wire fp32"), std::string::npos);
  EXPECT_NE(PlansJson(*ok).find("\"stage\": 3"), std::string::npos);
}

}  // namespace
}  // namespace zshard
