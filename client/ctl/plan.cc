#include "client/ctl/plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace zshard {
namespace {

// Bytes of `n` elements split evenly over `shards` slices, each in `wire`
// (a quantized slice pays its padding and scales).
double SlicedBytes(const WireFormat& wire, double n, uint32_t shards) {
  const uint64_t slice = static_cast<uint64_t>(std::ceil(n / shards));
  return static_cast<double>(shards) * static_cast<double>(wire.Bytes(slice));
}

absl::Status CheckInput(const PlanInput& in) {
  auto bad = [](const char* what, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  if (in.params == 0) return bad("--params", "must be at least 1");
  if (in.groups == 0 || in.groups > in.params)
    return bad("--groups", "must be 1..params");
  if (in.trainers == 0) return bad("--trainers", "must be at least 1");
  if (in.shards == 0) return bad("--shards", "must be at least 1");
  if (in.trainers_per_host == 0 || in.trainers_per_host > in.trainers)
    return bad("--trainers_per_host", "must be 1..trainers");
  if (in.shards_per_host == 0 || in.shards_per_host > in.shards)
    return bad("--shards_per_host", "must be 1..shards");
  if (!(in.link_gbps > 0) || !std::isfinite(in.link_gbps))
    return bad("--link_gbps", "must be a rate above 0");
  if (!(in.compute_ms >= 0) || !std::isfinite(in.compute_ms))
    return bad("--compute_ms", "must be 0 or more");
  if (in.landing_slots < 2) return bad("--landing_slots", "must be at least 2");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<StagePlan>> PlanStages(const PlanInput& in) {
  if (absl::Status st = CheckInput(in); !st.ok()) return st;
  const TrainingConfig& c = in.config;
  const double n = static_cast<double>(in.params);
  const double group = n / in.groups;
  const double accumulation = c.gradient_accumulation_steps;
  const WireFormat plain = c.PlainWire();
  const double elem = plain.Bytes(1);  // compute dtype on the trainer
  const WireFormat param_wire = c.ParameterWire();
  const WireFormat grad_wire = c.GradientWire();
  const double group_fetch = SlicedBytes(param_wire, group, in.shards);
  const double group_push = SlicedBytes(grad_wire, group, in.shards);
  // Groups below the persistence threshold stay resident (refreshed once
  // per step); the others are fetched for forward and, unless the window
  // still holds them, again for backward.
  const bool persistent =
      group < static_cast<double>(c.stage3_param_persistence_threshold);
  const double window_elems =
      std::min(static_cast<double>(c.stage3_prefetch_bucket_size),
               static_cast<double>(c.stage3_max_live_parameters));
  const double fetched_groups = persistent ? 0 : in.groups;
  const double kept =
      std::min(fetched_groups, std::floor(window_elems / group));
  const double bucket_elems = static_cast<double>(c.reduce_bucket_size);
  const double n_shard = n / in.shards;
  const double slice_group = std::ceil(group / in.shards);
  const double rate = in.link_gbps * 1e9 / 8;
  const double hpz = c.hpz_partition_size;
  const uint64_t snapshot_interval = c.fault_tolerance.snapshot_interval_steps;
  const bool snapshots = snapshot_interval > 0 && in.shards > 1;

  std::vector<StagePlan> plans;
  for (uint32_t stage = 0; stage <= 3; ++stage) {
    StagePlan p;
    p.stage = stage;
    switch (stage) {
      case 0:  // trainers run AdamW on fp32; servers average gradients
        p.trainer_params = 4 * n;
        p.trainer_grads = 4 * n;
        p.trainer_optimizer = 8 * n;
        p.trainer_buffers = 4 * n;  // the averaged gradient fetched
        p.fetched_bytes = 4 * n;
        p.pushed_bytes = accumulation * 4 * n;
        break;
      case 1:
      case 2:
        p.trainer_params = elem * n;
        p.trainer_grads =
            stage == 1 ? elem * n
                       : std::min(elem * n, 2 * elem * (bucket_elems + group));
        p.fetched_bytes = in.groups * group_fetch;
        p.pushed_bytes = accumulation * in.groups * group_push;
        break;
      case 3:
        p.trainer_params =
            persistent ? elem * n : elem * std::min(n, window_elems + group);
        p.trainer_grads = 2 * elem * group;
        p.fetched_bytes =
            persistent
                ? in.groups * group_fetch
                : accumulation * (2 * fetched_groups - kept) * group_fetch;
        p.pushed_bytes = accumulation * in.groups * group_push;
        break;
    }
    if (stage > 0 && param_wire.quantized()) {
      p.trainer_buffers = group_fetch;  // a group's quantized staging
    }
    // The shard: master (+ moments but at stage 0), two published slots
    // of the plain copy (+ the quantized one), the accumulator and the pool.
    p.server_state = 4 * n_shard + (stage == 0 ? 0 : 8 * n_shard);
    p.server_published = 2 * (stage == 0 ? 4 : elem) * n_shard;
    if (stage > 0 && param_wire.quantized()) {
      p.server_published += 2 * in.groups *
                            static_cast<double>(param_wire.Bytes(
                                static_cast<uint64_t>(slice_group)));
    }
    const WireFormat landing = stage == 0 ? WireFormat::Fp32() : grad_wire;
    p.server_buffers =
        4 * n_shard +
        in.landing_slots * static_cast<double>(landing.Bytes(
                               static_cast<uint64_t>(slice_group)));
    if (snapshots) {
      p.server_snapshots = 5 * p.server_state;
      if (in.shards_per_host < in.shards) {
        p.snapshot_across_bytes =
            p.server_state / static_cast<double>(snapshot_interval);
      }
    }
    p.fetched_across_bytes = p.fetched_bytes;
    if (stage > 0 && c.hpz_partition_size > 1) {
      p.fetched_across_bytes =
          std::min(p.fetched_bytes, in.groups * group_fetch / hpz);
    }
    const double per_trainer = p.fetched_across_bytes + p.pushed_bytes;
    const double trainer_link = in.trainers_per_host * per_trainer / rate;
    // A snapshot leaves a server host while its next one comes in, the two
    // directions at once, right after a step's publish: one of them adds to
    // the host's busy direction.
    const double server_link =
        (static_cast<double>(in.shards_per_host) * in.trainers * per_trainer /
             in.shards +
         p.snapshot_across_bytes) /
        rate;
    p.comm_seconds = std::max(trainer_link, server_link);
    p.step_seconds = in.compute_ms / 1e3 + p.comm_seconds;
    plans.push_back(p);
  }
  return plans;
}

std::string FormatPlans(const PlanInput& in,
                        const std::vector<StagePlan>& plans) {
  const TrainingConfig& c = in.config;
  std::string out = absl::StrFormat(
      "%llu parameters in %u groups, %u trainers (%u per host), %u shards "
      "(%u per host), %.3g Gbit/s links; parameters on the wire %s, "
      "gradients %s\n",
      static_cast<unsigned long long>(in.params), in.groups, in.trainers,
      in.trainers_per_host, in.shards, in.shards_per_host, in.link_gbps,
      c.ParameterWire().name(), c.GradientWire().name());
  absl::StrAppendFormat(&out,
                        "%-5s %12s %12s %12s %12s %12s %12s %12s %10s %10s\n",
                        "stage", "trainer MB", "(params", "grads", "optim)",
                        "server MB", "fetch MB", "push MB", "comm s", "step s");
  for (const StagePlan& p : plans) {
    absl::StrAppendFormat(
        &out,
        "%-5u %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %10.3f %10s\n",
        p.stage, p.trainer_total() / 1e6, p.trainer_params / 1e6,
        p.trainer_grads / 1e6, p.trainer_optimizer / 1e6,
        p.server_total() / 1e6, p.fetched_bytes / 1e6, p.pushed_bytes / 1e6,
        p.comm_seconds,
        in.compute_ms > 0 ? absl::StrFormat("%.3f", p.step_seconds) : "n/a");
  }
  absl::StrAppend(
      &out,
      "per trainer and step; comm: the busier host link, fetches and pushes "
      "one after the other; step: --compute_ms plus comm (no overlap); stage "
      "0's servers only average gradients (fp32, not quantized)\n");
  if (!plans.empty() && plans.back().server_snapshots > 0) {
    absl::StrAppendFormat(
        &out,
        "snapshots (zshard_fault_tolerance.snapshot_interval_steps %llu): "
        "server MB includes 5 copies of a shard's state; %s MB per step "
        "(stages 0 / 1-3) cross a server host's link each way to buddies on "
        "the next host, in comm\n",
        static_cast<unsigned long long>(c.fault_tolerance.snapshot_interval_steps),
        absl::StrFormat("%.2f / %.2f", plans.front().snapshot_across_bytes / 1e6,
                        plans.back().snapshot_across_bytes / 1e6));
  }
  if (c.hpz_partition_size > 1) {
    absl::StrAppendFormat(
        &out,
        "hpZ (zero_hpz_partition_size %u): per trainer and step, stages 1-3 "
        "fetch across the link %s MB of their fetch MB (the rest from host "
        "memory)\n",
        c.hpz_partition_size,
        absl::StrJoin(plans.begin() + 1, plans.end(), " / ",
                      [](std::string* o, const StagePlan& p) {
                        absl::StrAppendFormat(o, "%.2f",
                                              p.fetched_across_bytes / 1e6);
                      }));
  }
  return out;
}

std::string PlansJson(const std::vector<StagePlan>& plans) {
  std::string out = "[";
  for (size_t i = 0; i < plans.size(); ++i) {
    const StagePlan& p = plans[i];
    absl::StrAppendFormat(
        &out,
        "%s{\"stage\": %u, \"trainer_bytes\": %.0f, \"trainer_param_bytes\": "
        "%.0f, \"trainer_grad_bytes\": %.0f, \"trainer_optimizer_bytes\": "
        "%.0f, \"server_bytes\": %.0f, \"fetched_bytes\": %.0f, "
        "\"fetched_across_bytes\": %.0f, \"pushed_bytes\": %.0f, "
        "\"snapshot_across_bytes\": %.0f, \"comm_seconds\": %.6f, "
        "\"step_seconds\": %.6f}",
        i ? ", " : "", p.stage, p.trainer_total(), p.trainer_params,
        p.trainer_grads, p.trainer_optimizer, p.server_total(), p.fetched_bytes,
        p.fetched_across_bytes, p.pushed_bytes, p.snapshot_across_bytes,
        p.comm_seconds, p.step_seconds);
  }
  return out + "]\n";
}

}  // namespace zshard
