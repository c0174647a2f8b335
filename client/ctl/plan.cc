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

// One micro-step's seconds, forward and backward. Forward computes for
// `f` while `fwd_link` seconds of fetches arrive group by group: the first
// group's fetch is waited for, the others arrive behind the computation
// (prefetched, or refreshed in the order of the last step). Backward
// computes for `b` in `pieces` equal parts, each one's gradients pushed
// (and at stage 3 the next group re-fetched) while the next part computes:
// `bwd_link` seconds on the link in all, the last part's waited for.
struct MicroStep {
  double forward = 0;
  double backward = 0;
  double total() const { return forward + backward; }
};
MicroStep MicroStepSeconds(double f, double b, double fwd_link, double bwd_link,
                           double groups, double pieces) {
  MicroStep m;
  m.forward = fwd_link > 0 ? fwd_link / groups + std::max(f, fwd_link) : f;
  const double part = b / pieces, part_link = bwd_link / pieces;
  m.backward = part + (pieces - 1) * std::max(part, part_link) + part_link;
  return m;
}

// The same when the prefetch window holds no group (stage 3, groups larger
// than stage3_prefetch_bucket_size): each group is fetched when it is
// needed and waited for, in forward (`fwd_link`) and in backward
// (`refetch_link`, a piece's share before it computes); a piece's pushes
// (`push_link` in all, the other direction) go while the next piece
// fetches and computes, the last one's waited for.
MicroStep OnDemandMicroStepSeconds(double f, double b, double fwd_link,
                                   double refetch_link, double push_link,
                                   double pieces) {
  MicroStep m;
  m.forward = fwd_link + f;
  const double part = b / pieces + refetch_link / pieces;
  const double push = push_link / pieces;
  m.backward = pieces * part + (pieces - 1) * std::max(0.0, push - part) + push;
  return m;
}

// Seconds until `fetch` seconds of a server host's fetches have left it
// while `*snapshot` seconds of a snapshot leave it too: the link is shared
// between them until one is done, so the fetches take up to twice as long;
// `*snapshot` becomes what is left of the snapshot when they are done.
double FetchBesideSnapshot(double fetch, double* snapshot) {
  const double shared = std::min(fetch, *snapshot);
  *snapshot -= shared;
  return fetch + shared;
}

// A host link's seconds per byte: a trainer host's and a server host's (a
// server host carries its shards' share of every trainer's slices).
struct LinkLoads {
  double trainer = 0;
  double server = 0;
  double rate = 0;  // bytes per second of one host's link, each way
};

// Stages 1-3: the mean step's seconds, the link overlapped as the trainer
// does (MicroStepSeconds). Forward is a third of the computation, backward
// two thirds. Stages 1-2 (and resident groups) refresh every group once
// per step, stage 3 fetches the groups in each micro-step's forward and
// re-fetches in backward what the window no longer holds; stage 1 pushes
// every gradient at the step's end, stage 2 bucket by bucket
// (`bucket_groups` whole groups), stage 3 each group after its backward.
// Every snapshot_interval_steps-th step a server host also sends a shard's
// state to the next host, from the publish on: it shares the link with
// the fetches (FetchBesideSnapshot), goes on alone while the link is
// otherwise idle, and what is left at the step's end shares the next
// step's first fetches.
// `prefetch`: false when the window holds no group (OnDemandMicroStepSeconds).
double OverlappedStepSeconds(const PlanInput& in, const StagePlan& p,
                             uint32_t stage, double once, double micro_fwd,
                             double micro_bwd, double bucket_groups,
                             bool prefetch, const LinkLoads& load) {
  const TrainingConfig& c = in.config;
  const double accumulation = c.gradient_accumulation_steps;
  const double f = in.compute_ms / 1e3 / 3 / accumulation;
  const double pieces = stage == 1   ? 1
                        : stage == 2 ? std::ceil(in.groups / bucket_groups)
                                     : in.groups;
  // One step with `snapshot` seconds of a snapshot to send; `*left` gets
  // what is left of it at the step's end.
  auto step = [&](double snapshot, double* left) {
    double total = 0;
    for (uint32_t m = 0; m < c.gradient_accumulation_steps; ++m) {
      const bool first = m == 0;
      const bool last = m + 1 == c.gradient_accumulation_steps;
      const double push = stage == 1 ? (last ? p.pushed_bytes : 0)
                                     : p.pushed_bytes / accumulation;
      const double fwd_bytes = (first ? once : 0) + micro_fwd;
      const double fetch =
          FetchBesideSnapshot(load.server * fwd_bytes, &snapshot);
      const double refetch =
          FetchBesideSnapshot(load.server * micro_bwd, &snapshot);
      const double fwd_link = std::max(load.trainer * fwd_bytes, fetch);
      const MicroStep s =
          prefetch
              ? MicroStepSeconds(f, 2 * f, fwd_link,
                                 std::max(load.trainer * (micro_bwd + push),
                                          refetch + load.server * push),
                                 in.groups, pieces)
              : OnDemandMicroStepSeconds(
                    f, 2 * f, fwd_link,
                    std::max(load.trainer * micro_bwd, refetch),
                    std::max(load.trainer, load.server) * push, pieces);
      // Alone while the server host's link has nothing else to send.
      snapshot = std::max(0.0, snapshot - std::max(0.0, s.forward - fetch) -
                                   std::max(0.0, s.backward - refetch));
      total += s.total();
    }
    *left = snapshot;
    return total;
  };
  double left = 0;
  const double plain = step(0, &left);
  const uint64_t interval = c.fault_tolerance.snapshot_interval_steps;
  if (p.snapshot_across_bytes <= 0 || interval == 0) return plain;
  const double with_snapshot =
      step(p.snapshot_across_bytes * static_cast<double>(interval) / load.rate,
           &left);
  // The rest shares the next step's first fetches (the link is otherwise
  // busy then), delaying them by as much, at most their own length.
  const double spill = std::min(left, load.server * (once + micro_fwd));
  return plain +
         (with_snapshot + spill - plain) / static_cast<double>(interval);
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
  // still holds them, again for backward. The window counts groups in the
  // compute dtype against 4 bytes per element of its two limits, as the
  // trainer's parameter cache does; one that holds no group prefetches
  // nothing.
  const bool persistent =
      group < static_cast<double>(c.stage3_param_persistence_threshold);
  const double window_elems =
      std::min(static_cast<double>(c.stage3_prefetch_bucket_size),
               static_cast<double>(c.stage3_max_live_parameters));
  const double fetched_groups = persistent ? 0 : in.groups;
  const double kept =
      std::min(fetched_groups, std::floor(4 * window_elems / (elem * group)));
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
            persistent ? elem * n
                       : std::min(elem * n, 4 * window_elems + elem * group);
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
    // A trainer's bytes load its host's link `trainer_load` times (its
    // host's trainers) and a server host's `server_load` times (its share
    // of every trainer's slices). A snapshot leaves a server host while its
    // next one comes in, the two directions at once, right after a step's
    // publish: one of them adds to the host's busy direction then, the
    // forward fetches.
    const double trainer_load = in.trainers_per_host / rate;
    const double server_load = static_cast<double>(in.shards_per_host) *
                               in.trainers / in.shards / rate;
    auto link = [&](double bytes, double snapshot) {
      return std::max(trainer_load * bytes,
                      server_load * bytes + snapshot / rate);
    };
    const double per_trainer = p.fetched_across_bytes + p.pushed_bytes;
    p.comm_seconds = link(per_trainer, p.snapshot_across_bytes);
    p.step_seconds = in.compute_ms / 1e3 + p.comm_seconds;
    if (stage > 0) {
      const double once = stage < 3 || persistent ? p.fetched_across_bytes : 0;
      const double micro_fwd =
          std::min(fetched_groups * group_fetch,
                   (p.fetched_across_bytes - once) / accumulation);
      const double micro_bwd =
          (p.fetched_across_bytes - once) / accumulation - micro_fwd;
      p.step_seconds =
          OverlappedStepSeconds(in, p, stage, once, micro_fwd, micro_bwd,
                                std::max(1.0, std::ceil(bucket_elems / group)),
                                stage < 3 || persistent || kept >= 1,
                                LinkLoads{trainer_load, server_load, rate});
    }
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
      "one after the other; step: stage 0 --compute_ms plus comm, stages "
      "1-3 overlapped as the trainer does (forward a third of --compute_ms, "
      "prefetching all but the first group; backward two thirds, pushing "
      "each bucket or group behind the computation); stage 0's servers only "
      "average gradients (fp32, not quantized)\n");
  if (!plans.empty() && plans.back().server_snapshots > 0) {
    absl::StrAppendFormat(
        &out,
        "snapshots (zshard_fault_tolerance.snapshot_interval_steps %llu): "
        "server MB includes 5 copies of a shard's state; %.2f / %.2f MB per "
        "step (stages 0 / 1-3) cross a server host's link each way to "
        "buddies on the next host, in comm\n",
        static_cast<unsigned long long>(
            c.fault_tolerance.snapshot_interval_steps),
        plans.front().snapshot_across_bytes / 1e6,
        plans.back().snapshot_across_bytes / 1e6);
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
