// The planner behind `zshardctl plan`: for each ZeRO stage, the memory a
// trainer and a shard server hold, the bytes a trainer moves per step and the
// seconds those take on a link, from the same rules the code follows (the
// parameter cache's residency and re-fetches, the pusher's buckets, the
// shards' published copies and landing pool, WireFormat's bytes). The model
// is taken as `groups` equal fetch groups, each split over every shard.
//
// Pure functions; thread-compatible.
#ifndef ZSHARD_CLIENT_CTL_PLAN_H_
#define ZSHARD_CLIENT_CTL_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/training_config.h"

namespace zshard {

struct PlanInput {
  TrainingConfig config;  // its zero_optimization.stage is not used
  uint64_t params = 0;    // elements, every one trainable
  uint32_t groups = 1;    // fetch groups (layers, embedding, head)
  uint32_t trainers = 1;
  uint32_t shards = 1;
  uint32_t trainers_per_host = 1;
  uint32_t shards_per_host = 1;
  double link_gbps = 0;  // each host's link, each way
  // The step's computation without communication (the floor), or 0.
  double compute_ms = 0;
  uint32_t landing_slots = 8;  // the servers' --landing_slots
};

struct StagePlan {
  uint32_t stage = 0;
  // Per trainer, bytes.
  double trainer_params = 0, trainer_grads = 0, trainer_optimizer = 0,
         trainer_buffers = 0;
  double trainer_total() const {
    return trainer_params + trainer_grads + trainer_optimizer + trainer_buffers;
  }
  // Per shard server, bytes: master weights and moments, published copies
  // (two slots, plain and quantized), accumulators and the landing pool, and
  // the in-memory snapshots (zshard_fault_tolerance.snapshot_interval_steps
  // > 0 with more than one shard: two copies of its own state and three of
  // its neighbour's, which is about the same size).
  double server_state = 0, server_published = 0, server_buffers = 0,
         server_snapshots = 0;
  double server_total() const {
    return server_state + server_published + server_buffers + server_snapshots;
  }
  // Per trainer and step.
  double fetched_bytes = 0, pushed_bytes = 0;
  // Of fetched_bytes, what crosses the trainer's host link: with hpZ
  // (zero_hpz_partition_size k > 1, stages 1-3) each version of each slice
  // once per k trainers (the rest, backward's re-fetches and micro-steps
  // included, comes from host memory); without, all of it.
  double fetched_across_bytes = 0;
  // Per server host and step, each way: the snapshots its shards' buddies
  // on other hosts pull (the last shard of a host has its buddy on the
  // next host: one shard's state every interval steps, in and out), 0
  // without snapshots or with every shard on one host.
  double snapshot_across_bytes = 0;
  // The busier end of a link (a trainer host's or a server host's), both
  // directions one after the other (forward fetches, backward pushes; on a
  // server host also the snapshots out and in).
  double comm_seconds = 0;
  // The step with compute_ms of computation: stage 0 adds comm_seconds to
  // it (no overlap); stages 1-3 overlap the link with the computation as
  // the trainer does (see PlanStages).
  double step_seconds = 0;
};

// Stages 1-3's step, per micro-step: forward (a third of compute_ms) waits
// for the first group's fetch and then computes while the others arrive
// (prefetch; a step's refresh at stages 1-2, with the snapshot a server
// host sends at the same time); backward (two thirds) computes in pieces
// (stage 1: one, gradients pushed at the step's end; stage 2: its buckets of
// whole groups; stage 3: each group) whose pushes, and stage 3's re-fetches,
// overlap the next piece's computation, the last piece's waited for.
//
// INVALID_ARGUMENT naming the input that is out of range (params, groups,
// trainers, shards or the hosts' counts 0, a link rate <= 0).
absl::StatusOr<std::vector<StagePlan>> PlanStages(const PlanInput& in);

// The plans as a table (and the assumptions under it), or as one JSON
// array.
std::string FormatPlans(const PlanInput& in,
                        const std::vector<StagePlan>& plans);
std::string PlansJson(const std::vector<StagePlan>& plans);

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CTL_PLAN_H_
