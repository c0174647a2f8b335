#include "server/shard_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/adamw_step.h"
#include "common/model_spec.h"
#include "common/status_macros.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/cast.h"

namespace zshard {
namespace {

// How often a blocked wait re-checks its caller's cancellation.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Create(
    const ShardStoreOptions& options) {
  if (options.sum_only && !options.checkpoint.root.empty()) {
    return absl::FailedPreconditionError(
        "checkpoints need ZeRO stage 1-3: at stage 0 the trainers hold the optimizer state");
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::CpuKernels> k,
                      kernels::CpuKernels::Create(options.kernels));
  return std::unique_ptr<ShardStore>(new ShardStore(options, std::move(k)));
}

ShardStore::ShardStore(const ShardStoreOptions& options,
                       std::unique_ptr<kernels::CpuKernels> kernels)
    : options_(options), kernels_(std::move(kernels)) {
  if (options.transport) leases_ = std::make_unique<LeaseTable>(options.lease_timeout);
  absl::MutexLock lock(&step_mu_);
  barrier_.committed.assign(options.world_size, 0);
}

void ShardStore::SetNormExchange(NormExchange exchange) {
  absl::MutexLock lock(&step_mu_);
  exchange_ = std::move(exchange);
}

size_t ShardStore::NonEmptyGroups() const {
  size_t n = 0;
  for (const auto& g : groups_) n += g->slice.size() > 0 ? 1 : 0;
  return n;
}

absl::StatusOr<bool> ShardStore::Register(
    const v1::ModelSpec& spec, const std::vector<ValueChunk>& values) {
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  absl::MutexLock lock(&mu_);
  if (registered_) {
    const std::string diff = FirstSpecDifference(spec_, spec);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(
          "a different model is registered: " + diff);
    }
    return false;
  }
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(spec, options_.num_shards, options_.alignment,
                           options_.persistence_threshold));
  const uint32_t shard = options_.shard_id;
  // Check the values tile this shard's slices exactly before touching state.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(
      map.num_groups());
  for (const ValueChunk& c : values) {
    if (c.group >= map.num_groups()) {
      return absl::InvalidArgumentError(
          absl::StrCat("initial values for unknown group ", c.group));
    }
    const Slice& s = map.slice(c.group, shard);
    if (!s.Contains(c.offset, c.values.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initial values [", c.offset, ", ", c.offset + c.values.size(),
          ") of group ", c.group, " lie outside shard ", shard, "'s slice [",
          s.begin, ", ", s.end, ")"));
    }
    ranges[c.group].emplace_back(c.offset, c.offset + c.values.size());
  }
  for (size_t g = 0; g < map.num_groups(); ++g) {
    auto& r = ranges[g];
    std::sort(r.begin(), r.end());
    uint64_t next = map.slice(g, shard).begin;
    for (const auto& [lo, hi] : r) {
      if (lo != next) {
        return absl::InvalidArgumentError(absl::StrCat(
            "initial values of group ", g, " ",
            lo < next ? "overlap" : "leave a gap", " at element ",
            std::min(lo, next)));
      }
      next = hi;
    }
    if (next != map.slice(g, shard).end) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model not registered yet and the initial values of group ", g,
          " stop at element ", next, " of shard ", shard, "'s slice [",
          map.slice(g, shard).begin, ", ", map.slice(g, shard).end, ")"));
    }
  }

  ZS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<GroupState>> groups, MakeGroups(map, spec));
  for (const ValueChunk& c : values) {
    GroupState& g = *groups[c.group];
    absl::MutexLock glock(&g.mu);
    std::memcpy(g.master.data() + (c.offset - g.slice.begin), c.values.data(),
                c.values.size() * sizeof(float));
  }
  ZS_RETURN_IF_ERROR(InstallLocked(std::move(map), spec, std::move(groups)));
  return true;
}

absl::StatusOr<std::vector<std::unique_ptr<ShardStore::GroupState>>> ShardStore::MakeGroups(
    const PartitionMap& map, const v1::ModelSpec& spec) const {
  const uint32_t shard = options_.shard_id;
  const size_t contributions =
      static_cast<size_t>(options_.world_size) * options_.accumulation_steps;
  std::vector<std::unique_ptr<GroupState>> groups;
  for (size_t g = 0; g < map.num_groups(); ++g) {
    auto state = std::make_unique<GroupState>();
    absl::MutexLock glock(&state->mu);
    state->index = static_cast<uint32_t>(g);
    state->slice = map.slice(g, shard);
    const size_t n = state->slice.size();
    const auto& tensors = spec.groups(static_cast<int>(g)).tensors();
    for (int t = 0; t < tensors.size(); ++t) {
      if (!tensors[t].trainable()) continue;
      const uint64_t lo = std::max(map.tensor_offset(g, t), state->slice.begin);
      const uint64_t hi = std::min(map.tensor_offset(g, t) + TensorNumel(tensors[t]),
                                   state->slice.end);
      if (lo >= hi) continue;
      auto& ranges = state->trainable;
      if (!ranges.empty() && ranges.back().second == lo - state->slice.begin) {
        ranges.back().second = hi - state->slice.begin;  // merge neighbours
      } else {
        ranges.emplace_back(lo - state->slice.begin, hi - state->slice.begin);
      }
    }
    state->master.assign(n, 0.0f);
    state->m.assign(n, 0.0f);
    state->v.assign(n, 0.0f);
    state->received.assign(contributions, 0);
    state->contrib.n = n * contributions;
    if (options_.transport && n > 0) {
      // Memory the transport serves fastest (UCX: shared memory peers copy
      // from and into directly).
      const size_t elem = options_.publish_bf16 ? sizeof(uint16_t) : sizeof(float);
      for (int s = 0; s < 2; ++s) {
        ZS_ASSIGN_OR_RETURN(state->pub_region[s], options_.transport->Allocate(n * elem));
      }
      ZS_ASSIGN_OR_RETURN(state->contrib_region,
                          options_.transport->Allocate(n * contributions * sizeof(float)));
      state->contrib.ptr = static_cast<float*>(state->contrib_region->data());
      if (options_.publish_bf16) {
        ZS_ASSIGN_OR_RETURN(state->landing_bf16, options_.transport->Allocate(
                                                     n * contributions * sizeof(uint16_t)));
      }
    } else {
      state->contrib.own.assign(n * contributions, 0.0f);
      state->contrib.ptr = state->contrib.own.data();
    }
    groups.push_back(std::move(state));
  }
  return groups;
}

absl::Status ShardStore::InstallLocked(PartitionMap map, const v1::ModelSpec& spec,
                                       std::vector<std::unique_ptr<GroupState>> groups) {
  if (!options_.checkpoint.root.empty()) {
    CheckpointWriterOptions o = options_.checkpoint;
    o.shard_id = options_.shard_id;
    o.num_shards = options_.num_shards;
    std::vector<StagedGroupShape> shapes;
    for (const auto& g : groups) shapes.push_back({g->slice.begin, g->slice.size()});
    CheckpointWriter::CommitFn commit;
    {
      absl::MutexLock lock(&ckpt_mu_);
      commit = commit_;
    }
    ZS_ASSIGN_OR_RETURN(
        writer_, CheckpointWriter::Create(
                     o, std::move(shapes), std::move(commit),
                     [this](uint64_t step) {
                       CheckpointWriter::TrainerResume out;
                       absl::MutexLock lock(&ckpt_mu_);
                       for (const auto& [rank, states] : trainer_states_) {
                         auto it = states.find(step - 1);
                         if (step > 0 && it != states.end()) out.states[rank] = it->second;
                       }
                       auto s = step_skipped_.find(step);
                       out.last_step_skipped = s != step_skipped_.end() && s->second;
                       return out;
                     }));
  }
  if (options_.publish_bf16) {
    for (auto& g : groups) {
      absl::MutexLock glock(&g->mu);
      g->bf16.resize(g->master.size());
      kernels::ReferenceFp32ToBf16(g->master.data(), g->bf16.data(), g->master.size())
          .IgnoreError();  // sizes match by construction
    }
  }
  map_ = std::make_unique<PartitionMap>(std::move(map));
  groups_ = std::move(groups);
  spec_ = spec;
  spec_hash_ = SpecHash(spec);
  registered_ = true;
  ready_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

bool ShardStore::registered() const {
  return ready_.load(std::memory_order_acquire);
}

absl::StatusOr<v1::ModelSpec> ShardStore::spec() const {
  absl::MutexLock lock(&mu_);
  if (!registered_) {
    return absl::FailedPreconditionError("no model is registered");
  }
  return spec_;
}

uint64_t ShardStore::spec_hash() const {
  absl::MutexLock lock(&mu_);
  return spec_hash_;
}

const PartitionMap* ShardStore::partition_map() const {
  return registered() ? map_.get() : nullptr;
}

absl::StatusOr<ShardStore::GroupState*> ShardStore::Group(
    uint32_t group) const {
  if (!registered()) {
    return absl::FailedPreconditionError("no model is registered");
  }
  if (group >= groups_.size()) {
    return absl::NotFoundError(absl::StrCat("unknown group ", group,
                                            " (the model has ", groups_.size(),
                                            " groups)"));
  }
  return groups_[group].get();
}

absl::Status ShardStore::AwaitVersionLocked(GroupState& g, uint32_t group, uint64_t min_version,
                                            absl::Time deadline,
                                            const std::function<bool()>& cancelled) {
  auto ready = [&g, min_version]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return g.version >= min_version;
  };
  while (!ready()) {
    if (cancelled && cancelled()) return absl::CancelledError("fetch cancelled");
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      std::string missing;
      for (uint32_t r = 0; r < options_.world_size; ++r) {
        for (uint32_t a = 0; a < options_.accumulation_steps; ++a) {
          if (g.received[r * options_.accumulation_steps + a] != g.slice.size()) {
            absl::StrAppend(&missing, missing.empty() ? "" : ",", r);
            break;
          }
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", options_.shard_id, ": deadline passed waiting for group ",
          group, " to reach version ", min_version, " (at ", g.version,
          "; step ", g.version, " still needs gradients from trainer ranks ",
          missing, ")"));
    }
    g.mu.AwaitWithDeadline(absl::Condition(&ready), std::min(deadline, now + kCancelPoll));
  }
  return absl::OkStatus();
}

absl::StatusOr<SliceSnapshot> ShardStore::ReadSlice(
    uint32_t group, uint64_t min_version, absl::Time deadline,
    const std::function<bool()>& cancelled, bool bf16) {
  if (bf16 && !options_.publish_bf16) {
    return absl::FailedPreconditionError(
        "bf16 fetch from a shard that does not run with bf16 (bf16.enabled)");
  }
  // Wait for registration.
  {
    absl::MutexLock lock(&mu_);
    while (!registered_) {
      if (cancelled && cancelled()) return absl::CancelledError("fetch cancelled");
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shard ", options_.shard_id,
            ": deadline passed waiting for the model to be registered"));
      }
      mu_.AwaitWithDeadline(absl::Condition(&registered_),
                            std::min(deadline, now + kCancelPoll));
    }
  }
  ZS_ASSIGN_OR_RETURN(GroupState * g, Group(group));
  absl::ReaderMutexLock lock(&g->mu);
  ZS_RETURN_IF_ERROR(AwaitVersionLocked(*g, group, min_version, deadline, cancelled));
  SliceSnapshot snap;
  snap.version = g->version;
  snap.offset = g->slice.begin;
  if (bf16) {
    snap.bf16 = g->bf16;
  } else {
    snap.values = g->master;
  }
  return snap;
}

absl::Status ShardStore::AcceptGradient(uint32_t group, uint64_t step,
                                        uint32_t micro_step, uint32_t rank,
                                        uint64_t offset, const void* data,
                                        size_t n, bool bf16) {
  if (bf16 && !options_.publish_bf16) {
    return absl::FailedPreconditionError(
        "bf16 gradients sent to a shard that does not run with bf16");
  }
  ZS_ASSIGN_OR_RETURN(GroupState * g, Group(group));
  ZS_RETURN_IF_ERROR(CheckContributor(rank, micro_step));
  absl::ReleasableMutexLock lock(&g->mu);
  ZS_RETURN_IF_ERROR(CheckContributionStepLocked(*g, group, step));
  const Slice& s = g->slice;
  if (!s.Contains(offset, n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient range [", offset, ", ", offset + n, ") of group ", group,
        " is outside shard ", options_.shard_id, "'s slice [", s.begin, ", ",
        s.end, ")"));
  }
  const size_t slot = static_cast<size_t>(rank) * options_.accumulation_steps +
                      micro_step;
  uint64_t& received = g->received[slot];
  if (received == s.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " already pushed micro-step ", micro_step,
        " of step ", step, " for group ", group));
  }
  if (offset != s.begin + received) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient chunk of group ", group, " starts at element ", offset,
        " but element ", s.begin + received, " is expected next"));
  }
  float* dest = g->contrib.data() + slot * s.size() + (offset - s.begin);
  if (n > 0 && bf16) {
    const auto* h = static_cast<const uint16_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, h + i, sizeof(bits));  // `data` may be unaligned
      dest[i] = kernels::Bf16BitsToFp32(bits);
    }
  } else if (n > 0) {
    std::memcpy(dest, data, n * sizeof(float));
  }
  received += n;
  const bool reduced = received == s.size() && ContributionCompleteLocked(*g);
  lock.Release();
  if (reduced) GroupReduced();
  return absl::OkStatus();
}

absl::Status ShardStore::CheckContributor(uint32_t rank, uint32_t micro_step) const {
  if (rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", rank, " out of range (world size ", options_.world_size, ")"));
  }
  if (micro_step >= options_.accumulation_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-step ", micro_step, " out of range (gradient_accumulation_steps ",
        options_.accumulation_steps, ")"));
  }
  return absl::OkStatus();
}

absl::Status ShardStore::CheckContributionStepLocked(const GroupState& g, uint32_t group,
                                                     uint64_t step) const {
  if (step != g.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gradient for step ", step, " of group ", group, " is from the ",
        step < g.version ? "past" : "future", ": shard ", options_.shard_id,
        " is at version ", g.version));
  }
  if (g.slice.size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " owns no elements of group ", group));
  }
  return absl::OkStatus();
}

bool ShardStore::ContributionCompleteLocked(GroupState& g) {
  ++g.complete;
  if (g.complete != g.received.size()) return false;
  g.last_landed = absl::Now();
  ReduceLocked(g);
  if (options_.step_barrier) return true;  // the update waits for the step's decision
  UpdateLocked(g, 1.0f / static_cast<float>(g.received.size()), false);
  return false;
}

void ShardStore::GroupReduced() {
  {
    absl::MutexLock step_lock(&step_mu_);
    ++barrier_.groups_reduced;
  }
  MaybeFinishStep();
}

void ShardStore::AbortContribution(uint32_t group, uint64_t step,
                                   uint32_t micro_step, uint32_t rank) {
  auto g_or = Group(group);
  if (!g_or.ok() || rank >= options_.world_size ||
      micro_step >= options_.accumulation_steps) {
    return;
  }
  GroupState* g = *g_or;
  absl::MutexLock lock(&g->mu);
  if (step != g->version) return;
  uint64_t& received =
      g->received[static_cast<size_t>(rank) * options_.accumulation_steps +
                  micro_step];
  if (received != g->slice.size()) received = 0;
}

void ShardStore::ReduceLocked(GroupState& g) {
  const size_t n = g.slice.size();
  const size_t contributions = g.received.size();
  float* sum = g.contrib.data();
  // Fixed order: slot 0 += slot 1 += ... so the bits do not depend on which
  // trainer arrived first.
  for (size_t c = 1; c < contributions; ++c) {
    const float* src = g.contrib.data() + c * n;
    for (size_t i = 0; i < n; ++i) sum[i] += src[i];
  }
}

void ShardStore::UpdateLocked(GroupState& g, float grad_scale, bool skip) {
  if (options_.sum_only) {
    const float* sum = g.contrib.data();
    for (size_t i = 0; i < g.master.size(); ++i) g.master[i] = sum[i] * grad_scale;
  } else if (!skip) {
    kernels::AdamWStep hp =
        AdamWStepFor(options_.adamw, options_.scheduler, g.applied, grad_scale);
    absl::MutexLock lock(&kernels_mu_);
    float* sum = g.contrib.data();
    if (options_.publish_bf16) hp.half_type = kernels::HalfType::kBf16;
    for (const auto& [lo, hi] : g.trainable) {
      // Arguments were validated at construction; a failure is a bug. The
      // bf16 copy is written in the same pass.
      absl::Status st = kernels_->AdamW(
          g.master.data() + lo, sum + lo, g.m.data() + lo, g.v.data() + lo,
          hi - lo, hp, options_.publish_bf16 ? g.bf16.data() + lo : nullptr);
      if (!st.ok()) std::abort();
    }
    ++g.applied;
  }
  ++g.version;
  g.complete = 0;
  std::fill(g.received.begin(), g.received.end(), 0);
  MaybeStageLocked(g, skip);
}

void ShardStore::MaybeFinishStep() {
  uint64_t step;
  double loss_scale;
  bool overflow;
  NormExchange exchange;
  {
    absl::MutexLock lock(&step_mu_);
    Barrier& b = barrier_;
    if (b.finishing || !b.error.ok() || b.groups_reduced < NonEmptyGroups()) return;
    for (char c : b.committed) {
      if (!c) return;
    }
    b.finishing = true;
    step = b.step;
    loss_scale = b.loss_scale;
    overflow = b.overflow;
    exchange = exchange_;
  }
  // Unscale in place (loss scale and averaging over the contributions) and
  // measure this shard's part of the global norm, group after group.
  const float unscale = static_cast<float>(
      1.0 / (loss_scale * options_.world_size * options_.accumulation_steps));
  double sum_squares = 0;
  bool non_finite = false;
  for (const auto& gp : groups_) {
    absl::MutexLock glock(&gp->mu);
    if (gp->slice.size() == 0) continue;
    absl::MutexLock klock(&kernels_mu_);
    auto r = kernels_->GradCheck(gp->contrib.data(), gp->slice.size(), unscale);
    if (!r.ok()) std::abort();  // arguments are ours; a failure is a bug
    sum_squares += r->sum_squares;
    non_finite |= r->non_finite;
  }
  absl::StatusOr<NormTotals> totals = NormTotals{sum_squares, non_finite};
  if (exchange) {
    totals = exchange(step, sum_squares, non_finite,
                      absl::Now() + options_.decision_timeout);
  }
  if (!totals.ok()) {
    absl::MutexLock lock(&step_mu_);
    barrier_.error = absl::Status(
        totals.status().code(),
        absl::StrCat("step ", step, " could not be decided: ",
                     totals.status().message()));
    barrier_.finishing = false;
    return;
  }
  StepDecision d;
  d.skipped = overflow || totals->non_finite;
  d.grad_norm = std::sqrt(totals->sum_squares);
  float coef = 1.0f;
  if (!d.skipped && options_.gradient_clipping > 0) {
    const double c = options_.gradient_clipping / (d.grad_norm + 1e-6);
    if (c < 1.0) coef = static_cast<float>(c);
  }
  for (const auto& gp : groups_) {
    absl::MutexLock glock(&gp->mu);
    UpdateLocked(*gp, coef, d.skipped);
  }
  absl::MutexLock lock(&step_mu_);
  Barrier& b = barrier_;
  b.decided[step] = d;
  while (b.decided.size() > 8) b.decided.erase(b.decided.begin());
  b.step = step + 1;
  std::fill(b.committed.begin(), b.committed.end(), 0);
  b.overflow = false;
  b.loss_scale = 0;
  b.groups_reduced = 0;
  b.finishing = false;
}

absl::StatusOr<StepDecision> ShardStore::CommitStep(
    uint64_t step, uint32_t rank, bool overflow, double loss_scale,
    absl::Time deadline, const std::function<bool()>& cancelled) {
  if (!options_.step_barrier) {
    return absl::FailedPreconditionError(
        "this cluster applies steps without a barrier (no fp16, no clipping); "
        "CommitStep is not used");
  }
  if (!registered()) return absl::FailedPreconditionError("no model is registered");
  if (rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", rank, " out of range (world size ", options_.world_size, ")"));
  }
  if (!(loss_scale > 0) || !std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scale must be positive and finite, got ", loss_scale));
  }
  {
    absl::MutexLock lock(&step_mu_);
    Barrier& b = barrier_;
    auto done = b.decided.find(step);
    if (done != b.decided.end()) return done->second;
    if (!b.error.ok()) return b.error;
    if (step != b.step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "commit of step ", step, " is from the ", step < b.step ? "past" : "future",
          ": shard ", options_.shard_id, " is collecting step ", b.step));
    }
    if (b.loss_scale != 0 && b.loss_scale != loss_scale) {
      return absl::FailedPreconditionError(absl::StrCat(
          "trainer ", rank, " commits step ", step, " with loss scale ", loss_scale,
          " but another trainer used ", b.loss_scale));
    }
    b.committed[rank] = 1;
    b.overflow |= overflow;
    b.loss_scale = loss_scale;
  }
  MaybeFinishStep();
  absl::MutexLock lock(&step_mu_);
  auto ready = [this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return barrier_.decided.count(step) > 0 || !barrier_.error.ok();
  };
  while (!ready()) {
    if (cancelled && cancelled()) return absl::CancelledError("commit cancelled");
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      std::string missing;
      for (size_t r = 0; r < barrier_.committed.size(); ++r) {
        if (!barrier_.committed[r]) absl::StrAppend(&missing, missing.empty() ? "" : ",", r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", options_.shard_id, ": step ", step, " not decided by the deadline",
          missing.empty() ? " (waiting for gradients or the other shards)"
                          : absl::StrCat(" (trainer ranks ", missing, " have not committed)")));
    }
    step_mu_.AwaitWithDeadline(absl::Condition(&ready),
                               std::min(deadline, now + absl::Milliseconds(50)));
  }
  auto done = barrier_.decided.find(step);
  if (done == barrier_.decided.end()) return barrier_.error;
  return done->second;
}

std::vector<GroupProgress> ShardStore::Progress() const {
  std::vector<GroupProgress> out;
  if (!registered()) return out;
  for (const auto& gp : groups_) {
    absl::ReaderMutexLock lock(&gp->mu);
    GroupProgress p;
    p.version = gp->version;
    p.slice = gp->slice;
    p.contributions_received = gp->complete;
    if (gp->complete > 0 || std::any_of(gp->received.begin(),
                                        gp->received.end(),
                                        [](uint64_t r) { return r > 0; })) {
      for (uint32_t r = 0; r < options_.world_size; ++r) {
        for (uint32_t a = 0; a < options_.accumulation_steps; ++a) {
          if (gp->received[r * options_.accumulation_steps + a] !=
              gp->slice.size()) {
            p.waiting_for_ranks.push_back(r);
            break;
          }
        }
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

uint64_t ShardStore::slice_elements() const {
  const PartitionMap* map = partition_map();
  return map ? map->shard_numel(options_.shard_id) : 0;
}

}  // namespace zshard
