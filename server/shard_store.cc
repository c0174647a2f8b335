#include "server/shard_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace {

// How often a blocked wait re-checks its caller's cancellation.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

// This shard's slice of group `g` and its trainable ranges (slice-relative).
GroupShape ShapeOf(const PartitionMap& map, size_t g, uint32_t shard) {
  GroupShape shape;
  shape.slice = map.slice(g, shard);
  shape.trainable = map.slice_trainable_ranges(g, shard);
  return shape;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Create(
    const ShardStoreOptions& options) {
  if (options.sum_only && !options.checkpoint.root.empty()) {
    return absl::FailedPreconditionError(
        "checkpoints need ZeRO stage 1-3: at stage 0 the trainers hold the "
        "optimizer state");
  }
  // The optimizer makes its kernels at registration; refuse bad options now.
  ZS_RETURN_IF_ERROR(kernels::CpuKernels::Create(options.kernels).status());
  return std::unique_ptr<ShardStore>(new ShardStore(options));
}

ShardStore::ShardStore(const ShardStoreOptions& options)
    : options_(options),
      roster_(std::make_unique<Roster>(options.world_size,
                                       options.initial_trainers > 0
                                           ? options.initial_trainers
                                           : options.world_size,
                                       0, options.min_trainers)) {}

void ShardStore::SetNormExchange(NormExchange* exchange) {
  absl::MutexLock lock(&mu_);
  exchange_ = exchange;
}

size_t ShardStore::NonEmptyGroups(const PartitionMap& map) const {
  size_t n = 0;
  for (size_t g = 0; g < map.num_groups(); ++g) {
    n += map.slice(g, options_.shard_id).size() > 0 ? 1 : 0;
  }
  return n;
}

absl::StatusOr<bool> ShardStore::Register(
    const v1::ModelSpec& spec, const std::vector<ValueChunk>& values) {
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(spec, options_.num_shards, options_.alignment,
                           options_.persistence_threshold));
  InitialValues assembled(map, options_.shard_id);
  // Registered already: the values would be ignored.
  if (registered()) return Register(spec, std::move(assembled));
  for (const ValueChunk& c : values) {
    ZS_RETURN_IF_ERROR(
        assembled.Add(c.group, c.offset, c.values.data(), c.values.size()));
  }
  return Register(spec, std::move(assembled));
}

absl::StatusOr<bool> ShardStore::Register(const v1::ModelSpec& spec,
                                          InitialValues values) {
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  absl::MutexLock lock(&mu_);
  if (registered_) {
    const std::string diff = FirstSpecDifference(spec_, spec);
    if (!diff.empty()) {
      return absl::FailedPreconditionError("a different model is registered: " +
                                           diff);
    }
    return false;
  }
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(spec, options_.num_shards, options_.alignment,
                           options_.persistence_threshold));
  bool same = values.shard() == options_.shard_id &&
              values.slices().size() == map.num_groups();
  for (size_t g = 0; same && g < map.num_groups(); ++g) {
    const Slice& a = values.slices()[g];
    const Slice& b = map.slice(g, options_.shard_id);
    same = a.begin == b.begin && a.end == b.end;
  }
  if (!same) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial values were assembled for another partition "
                     "than shard ",
                     options_.shard_id, "'s of this model"));
  }
  ZS_RETURN_IF_ERROR(values.CheckComplete());
  const FillFn keep = [](uint32_t, const GroupShape&, Optimizer::State&) {
    return absl::OkStatus();  // the masters are the values already
  };
  ZS_RETURN_IF_ERROR(
      InstallLocked(std::move(map), spec, /*version=*/0, keep, values.Take()));
  return true;
}

absl::Status ShardStore::CreateDataStages(
    const std::vector<GroupShape>& shapes, uint64_t version,
    std::vector<std::vector<float>> masters, Model* m) const {
  OptimizerOptions oo;
  oo.adamw = options_.adamw;
  oo.scheduler = options_.scheduler;
  oo.sum_only = options_.sum_only;
  oo.publish_bf16 = options_.publish_bf16;
  oo.quantized = options_.quantized_parameters;
  oo.kernels = options_.kernels;
  ZS_ASSIGN_OR_RETURN(m->optimizer,
                      Optimizer::Create(oo, shapes, std::move(masters)));
  // One pool for every group: slots as large as the largest contribution.
  LandingPoolOptions lo;
  lo.shard_id = options_.shard_id;
  lo.quarantine = options_.quarantine;
  lo.slots = options_.landing_slots;
  lo.transport = options_.transport;
  m->landing_capacity = 0;
  for (const GroupShape& shape : shapes) {
    if (shape.slice.size() == 0) continue;
    m->landing_capacity =
        std::max<uint64_t>(m->landing_capacity, shape.trainable_size());
  }
  lo.slot_bytes = GradientWire().Bytes(m->landing_capacity);
  ZS_ASSIGN_OR_RETURN(m->pool, LandingPool::Create(lo));
  std::vector<uint64_t> elements;
  for (uint32_t g = 0; g < shapes.size(); ++g) {
    elements.push_back(shapes[g].slice.size());
    ContributionBufferOptions co;
    co.shard_id = options_.shard_id;
    co.group = g;
    co.slice = shapes[g].slice;
    co.trainable = shapes[g].trainable;
    co.world_size = options_.world_size;
    co.accumulation_steps = options_.accumulation_steps;
    co.bf16 = options_.publish_bf16;
    co.quantized = options_.quantized_gradients;
    co.pool = m->pool.get();
    co.roster = roster_.get();
    ZS_ASSIGN_OR_RETURN(auto c, ContributionBuffer::Create(co, version));
    m->contributions.push_back(std::move(c));
  }
  PublisherOptions po;
  po.shard_id = options_.shard_id;
  po.bf16 = options_.publish_bf16;
  po.quantized = options_.quantized_parameters;
  po.lease_timeout = options_.lease_timeout;
  po.transport = options_.transport;
  ZS_ASSIGN_OR_RETURN(m->publisher, Publisher::Create(po, elements));
  return absl::OkStatus();
}

absl::Status ShardStore::CreateStagerLocked(uint64_t version, Model* m) {
  if (options_.checkpoint.root.empty()) return absl::OkStatus();
  CheckpointStagerOptions so;
  so.shard_id = options_.shard_id;
  so.num_shards = options_.num_shards;
  so.world_size = options_.world_size;
  so.checkpoint = options_.checkpoint;
  so.interval = options_.checkpoint_interval;
  so.stage_timeout = options_.decision_timeout;
  ZS_ASSIGN_OR_RETURN(m->stager,
                      CheckpointStager::Create(so, m->optimizer.get(), commit_,
                                               commit_failed_));
  if (version > 0)
    m->stager->writer()->SkipStepsUpTo(version);  // that one is on disk
  return absl::OkStatus();
}

void ShardStore::StartEngineLocked(Model* m) {
  UpdateEngineStages es;
  es.shard_id = options_.shard_id;
  for (const auto& c : m->contributions) es.contributions.push_back(c.get());
  es.optimizer = m->optimizer.get();
  es.publisher = m->publisher.get();
  es.barrier = m->barrier.get();
  es.exchange = exchange_;
  es.gradient_clipping = options_.gradient_clipping;
  es.decision_timeout = options_.decision_timeout;
  UpdateEngine::PublishedFn published;
  CheckpointStager* stager = m->stager.get();
  SnapshotKeeper* keeper = m->keeper.get();
  if (stager || keeper) {
    published = [stager, keeper](uint32_t g, uint64_t v, bool skipped) {
      if (stager) stager->OnPublished(g, v, skipped);
      if (keeper) keeper->OnPublished(g, v, skipped);
    };
  }
  m->engine = std::make_unique<UpdateEngine>(es, std::move(published));
}

absl::Status ShardStore::InstallLocked(
    PartitionMap map, const v1::ModelSpec& spec, uint64_t version,
    const FillFn& fill, std::vector<std::vector<float>> masters) {
  auto m = std::make_unique<Model>();
  std::vector<GroupShape> shapes;
  for (size_t g = 0; g < map.num_groups(); ++g) {
    shapes.push_back(ShapeOf(map, g, options_.shard_id));
  }
  ZS_RETURN_IF_ERROR(
      CreateDataStages(shapes, version, std::move(masters), m.get()));
  // The state, then its first published version. A bf16 copy goes into both
  // slots: updates rewrite only the trainable ranges.
  for (uint32_t g = 0; g < map.num_groups(); ++g) {
    absl::Status st;
    m->optimizer->Write(g, [&](Optimizer::State& s) {
      s.version = version;
      st = fill(g, shapes[g], s);
    });
    ZS_RETURN_IF_ERROR(st);
    m->optimizer->WriteCopy(g, m->publisher->AcquireSlot(g, version));
    m->optimizer->WriteQuantized(g, m->publisher->QuantizedSlot(g, version));
    if (options_.publish_bf16) {
      m->optimizer->WriteCopy(g, m->publisher->AcquireSlot(g, version + 1));
    }
    m->publisher->Publish(g, version, absl::InfinitePast());
  }
  if (options_.step_barrier) {
    m->barrier = std::make_unique<StepBarrier>(
        options_.shard_id, options_.world_size, NonEmptyGroups(map), version,
        roster_.get());
  }
  ZS_RETURN_IF_ERROR(CreateStagerLocked(version, m.get()));
  if (options_.snapshot_interval > 0 && snapshot_send_) {
    SnapshotKeeperOptions ko;
    ko.shard_id = options_.shard_id;
    ko.num_shards = options_.num_shards;
    ko.world_size = options_.world_size;
    ko.spec_hash = SpecHash(spec);
    ko.interval = options_.snapshot_interval;
    ko.send_timeout = std::min(options_.decision_timeout, absl::Seconds(30));
    ko.transport = options_.transport;
    m->keeper = std::make_unique<SnapshotKeeper>(
        ko, m->optimizer.get(), snapshot_send_, snapshot_skip_);
    if (snapshot_prepared_) snapshot_prepared_(m->keeper->total_floats());
  }
  StartEngineLocked(m.get());
  if (!map_) map_ = std::make_unique<PartitionMap>(map);
  m->map = std::make_unique<PartitionMap>(std::move(map));
  {
    absl::MutexLock lock(&model_mu_);
    retired_ = std::move(model_);  // kept until the next rollback
    model_ = std::move(m);
  }
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

std::shared_ptr<ShardStore::Model> ShardStore::Current() const {
  absl::MutexLock lock(&model_mu_);
  return model_;
}

absl::StatusOr<std::shared_ptr<ShardStore::Model>> ShardStore::Installed()
    const {
  if (!registered())
    return absl::FailedPreconditionError("no model is registered");
  return Current();
}

std::function<bool()> ShardStore::Watch(
    const Model& m, const std::function<bool()>& cancelled) {
  return [&m, cancelled] {
    return m.retired.load(std::memory_order_acquire) ||
           (cancelled && cancelled());
  };
}

absl::Status ShardStore::RolledBack(const Model& m, absl::Status st) const {
  if (st.ok() || !m.retired.load(std::memory_order_acquire)) return st;
  absl::MutexLock lock(&mu_);
  return absl::AbortedError(rolled_back_);
}

absl::StatusOr<std::shared_ptr<ShardStore::Model>> ShardStore::ForGroup(
    uint32_t group) const {
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, Installed());
  const size_t groups = m->contributions.size();
  if (group >= groups) {
    return absl::NotFoundError(absl::StrCat(
        "unknown group ", group, " (the model has ", groups, " groups)"));
  }
  return m;
}

absl::Status ShardStore::AwaitInstalled(absl::Time deadline,
                                        const std::function<bool()>& cancelled,
                                        const char* what) {
  absl::MutexLock lock(&mu_);
  while (!registered_) {
    if (cancelled && cancelled())
      return absl::CancelledError(absl::StrCat(what, " cancelled"));
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", options_.shard_id,
          ": deadline passed waiting for the model to be registered"));
    }
    mu_.AwaitWithDeadline(absl::Condition(&registered_),
                          std::min(deadline, now + kCancelPoll));
  }
  return absl::OkStatus();
}

void ShardStore::Arrived(Model& m, uint32_t group,
                         const ContributionBuffer::Arrival& a) {
  if (a.fold) m.engine->ContributionLanded(group);
}

absl::StatusOr<std::optional<uint32_t>> ShardStore::TryTakeSlot(
    Model& m, uint32_t group, uint64_t step, uint32_t micro_step,
    uint32_t rank) {
  ContributionBuffer& c = *m.contributions[group];
  LandingPool& pool = *m.pool;
  ZS_ASSIGN_OR_RETURN(const bool in_order, c.InOrder(step, micro_step, rank));
  std::optional<uint32_t> slot = pool.TryTake(in_order ? 0 : 1);
  if (!slot) return std::nullopt;
  absl::Status st = c.Reserve(step, micro_step, rank, *slot);
  if (!st.ok()) {
    pool.Give(*slot);
    return st;
  }
  pool.Notify();  // later contributions of the group may be in order now
  return slot;
}

absl::StatusOr<uint32_t> ShardStore::TakeSlot(
    Model& m, uint32_t group, uint64_t step, uint32_t micro_step, uint32_t rank,
    absl::Time deadline, const std::function<bool()>& cancelled) {
  ContributionBuffer& c = *m.contributions[group];
  LandingPool& pool = *m.pool;
  for (;;) {
    const uint64_t seen = pool.epoch();
    ZS_ASSIGN_OR_RETURN(std::optional<uint32_t> slot,
                        TryTakeSlot(m, group, step, micro_step, rank));
    if (slot) return *slot;
    if (cancelled && cancelled()) {
      return absl::CancelledError("landing slot reservation cancelled");
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", options_.shard_id, ": no landing slot for trainer ", rank,
          "'s micro-step ", micro_step, " of step ", step, " of group ", group,
          " before the deadline: all ", pool.slots(),
          " slots of the landing pool (--landing_slots) hold contributions "
          "that wait for earlier ones (group ",
          group, " waits for ranks ", absl::StrJoin(c.MissingRanks(), ","),
          ")"));
    }
    pool.AwaitChange(seen, std::min(deadline, now + kCancelPoll));
  }
}

namespace {

// "1,3": the ranks `c` still misses (for deadline messages).
// "1 (host:pid (instance ...)), 3": the ranks a group's step still waits
// for, with who holds them (the roster's identity, once admitted).
std::function<std::string()> MissingRanksOf(const ContributionBuffer* c,
                                            const Roster* roster) {
  return [c, roster] {
    std::string out;
    for (uint32_t r : c->MissingRanks()) {
      const std::string who = roster->Identity(r);
      absl::StrAppend(&out, out.empty() ? "" : ", ", r,
                      who.empty() ? "" : absl::StrCat(" (", who, ")"));
    }
    return absl::StrCat(
        out, "; a trainer silent for --trainer_timeout_s is dropped");
  };
}

}  // namespace

absl::StatusOr<SliceSnapshot> ShardStore::ReadSlice(
    uint32_t group, uint64_t min_version, absl::Time deadline,
    const std::function<bool()>& cancelled, bool bf16) {
  if (bf16 && !options_.publish_bf16) {
    return absl::FailedPreconditionError(
        "bf16 fetch from a shard that does not run with bf16 (bf16.enabled)");
  }
  ZS_RETURN_IF_ERROR(AwaitInstalled(deadline, cancelled, "fetch"));
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, ForGroup(group));
  const auto missing =
      MissingRanksOf(m->contributions[group].get(), roster_.get());
  SliceSnapshot snap;
  snap.offset = m->optimizer->shape(group).slice.begin;
  if (bf16 == options_.publish_bf16) {
    absl::StatusOr<Publisher::Copy> read = m->publisher->Read(
        group, min_version, deadline, Watch(*m, cancelled), missing);
    ZS_RETURN_IF_ERROR(RolledBack(*m, read.status()));
    Publisher::Copy& copy = *read;
    snap.version = copy.version;
    if (bf16) {
      snap.bf16.resize(copy.bytes.size() / sizeof(uint16_t));
      if (!copy.bytes.empty())
        std::memcpy(snap.bf16.data(), copy.bytes.data(), copy.bytes.size());
    } else {
      snap.values.resize(copy.bytes.size() / sizeof(float));
      if (!copy.bytes.empty()) {
        std::memcpy(snap.values.data(), copy.bytes.data(), copy.bytes.size());
      }
    }
    return snap;
  }
  // fp32 values of a shard that publishes bf16: the master weights.
  ZS_RETURN_IF_ERROR(RolledBack(
      *m, m->publisher->AwaitVersion(group, min_version, deadline,
                                     Watch(*m, cancelled), missing)));
  m->optimizer->Read(group, [&snap](const Optimizer::State& s) {
    snap.version = s.version;
    snap.values = s.master;
  });
  return snap;
}

absl::StatusOr<SliceSnapshot> ShardStore::ReadValues(uint32_t group,
                                                     uint64_t version,
                                                     uint64_t begin,
                                                     uint64_t end, bool bf16) {
  if (bf16 && !options_.publish_bf16) {
    return absl::FailedPreconditionError(
        "bf16 values from a shard that does not run with bf16 (bf16.enabled)");
  }
  if (!registered()) {
    return absl::FailedPreconditionError("no model is registered yet");
  }
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, ForGroup(group));
  const auto slice = m->optimizer->shape(group).slice;
  if (begin > end || begin < slice.begin || end > slice.end) {
    return absl::OutOfRangeError(
        absl::StrCat("elements [", begin, ", ", end, ") of group ", group,
                     " are not all on shard ", options_.shard_id,
                     " (its slice is [", slice.begin, ", ", slice.end, "))"));
  }
  if (end - begin > kMaxReadElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("a read of ", end - begin, " elements exceeds the ",
                     kMaxReadElements, " one call may return"));
  }
  SliceSnapshot snap;
  snap.offset = begin;
  const uint64_t from = begin - slice.begin, n = end - begin;
  if (bf16 != options_.publish_bf16) {
    // fp32 from a bf16 shard: the master weights, current version only.
    absl::Status held;
    m->optimizer->Read(group, [&](const Optimizer::State& s) {
      if (version != 0 && s.version != version) {
        held = absl::FailedPreconditionError(absl::StrCat(
            "fp32 values of group ", group, " at version ", version,
            " are not held: this bf16 shard keeps fp32 master weights of "
            "the current version (",
            s.version, ") only"));
        return;
      }
      snap.version = s.version;
      snap.values.assign(s.master.begin() + from, s.master.begin() + from + n);
    });
    if (!held.ok()) return held;
    return snap;
  }
  const uint64_t v = version != 0 ? version : m->publisher->version(group);
  ZS_ASSIGN_OR_RETURN(Publisher::Copy copy,
                      m->publisher->ReadVersion(group, v));
  snap.version = copy.version;
  const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
  if (bf16) {
    snap.bf16.resize(n);
    std::memcpy(snap.bf16.data(), copy.bytes.data() + from * es, n * es);
  } else {
    snap.values.resize(n);
    std::memcpy(snap.values.data(), copy.bytes.data() + from * es, n * es);
  }
  return snap;
}

absl::Status ShardStore::AcceptGradient(uint32_t group, uint64_t step,
                                        uint32_t micro_step, uint32_t rank,
                                        uint64_t offset, const void* data,
                                        size_t n, bool bf16,
                                        absl::Time deadline) {
  if (bf16 != options_.publish_bf16) {
    return absl::FailedPreconditionError(
        bf16 ? "bf16 gradients sent to a shard that does not run with bf16"
             : "fp32 gradients sent to a shard that runs with bf16 "
               "(bf16.enabled)");
  }
  if (GradientWire().quantized()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " lands ", GradientWire().name(),
        " gradients (zero_optimization.zero_quantized_gradients): they come "
        "over the data plane, not in chunks"));
  }
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, ForGroup(group));
  ContributionBuffer& c = *m->contributions[group];
  // The first chunk of a contribution with trainable elements takes a slot.
  bool took = false;
  if (c.elements() > 0 && !c.ReservedSlot(step, micro_step, rank)) {
    ZS_RETURN_IF_ERROR(c.CheckNew(step, micro_step, rank));
    ZS_RETURN_IF_ERROR(
        RolledBack(*m, TakeSlot(*m, group, step, micro_step, rank, deadline,
                                Watch(*m, nullptr))
                           .status()));
    took = true;
  }
  absl::StatusOr<ContributionBuffer::Arrival> a =
      c.Accept(step, micro_step, rank, offset, data, n);
  if (!a.ok()) {
    if (took) c.Abort(step, micro_step, rank);  // nothing changes
    return a.status();
  }
  Arrived(*m, group, *a);
  return absl::OkStatus();
}

void ShardStore::AbortContribution(uint32_t group, uint64_t step,
                                   uint32_t micro_step, uint32_t rank) {
  auto m = ForGroup(group);
  if (m.ok()) (*m)->contributions[group]->Abort(step, micro_step, rank);
}

absl::StatusOr<StepDecision> ShardStore::CommitStep(
    uint64_t step, uint32_t rank, bool overflow, double loss_scale,
    absl::Time deadline, const std::function<bool()>& cancelled) {
  if (!options_.step_barrier) {
    return absl::FailedPreconditionError(
        "this cluster applies steps without a barrier (no fp16, no clipping); "
        "CommitStep is not used");
  }
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, Installed());
  if (rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("trainer rank ", rank,
                                                   " out of range (world size ",
                                                   options_.world_size, ")"));
  }
  if (!(loss_scale > 0) || !std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scale must be positive and finite, got ", loss_scale));
  }
  ZS_ASSIGN_OR_RETURN(StepBarrier::CommitResult r,
                      m->barrier->Commit(step, rank, overflow, loss_scale));
  if (r.decided) return r.decision;
  if (r.ready) m->engine->DecideStep();
  absl::StatusOr<StepDecision> d =
      m->barrier->Await(step, deadline, Watch(*m, cancelled));
  ZS_RETURN_IF_ERROR(RolledBack(*m, d.status()));
  return d;
}

absl::StatusOr<LeaseGrant> ShardStore::Lease(
    uint32_t group, uint64_t min_version, v1::DType dtype, uint32_t rank,
    absl::Time deadline, const std::function<bool()>& cancelled) {
  if (!options_.transport) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " has no data plane transport"));
  }
  const bool quantized = options_.quantized_parameters.quantized() &&
                         dtype == options_.quantized_parameters.dtype();
  if (dtype != PlainWire().dtype() && !quantized) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " publishes ", PlainWire().name(),
        options_.quantized_parameters.quantized()
            ? absl::StrCat(" and ", options_.quantized_parameters.name())
            : std::string(),
        " values, not ", v1::DType_IsValid(dtype) ? v1::DType_Name(dtype) : "?",
        " (bf16.enabled and zero_optimization.zero_quantized_weights must "
        "match)"));
  }
  if (rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("trainer rank ", rank,
                                                   " out of range (world size ",
                                                   options_.world_size, ")"));
  }
  ZS_RETURN_IF_ERROR(AwaitInstalled(deadline, cancelled, "lease"));
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, ForGroup(group));
  const ContributionBuffer* c = m->contributions[group].get();
  absl::StatusOr<Publisher::Grant> leased = m->publisher->Lease(
      group, min_version, rank, deadline, Watch(*m, cancelled),
      MissingRanksOf(c, roster_.get()), quantized);
  ZS_RETURN_IF_ERROR(RolledBack(*m, leased.status()));
  Publisher::Grant& g = *leased;
  const Slice& slice = m->optimizer->shape(group).slice;
  LeaseGrant grant;
  grant.version = g.version;
  grant.lease_id = g.lease_id;
  grant.offset = slice.begin;
  grant.elements = slice.size();
  grant.landing_elements = c->elements();
  grant.values = std::move(g.values);
  return grant;
}

absl::Status ShardStore::Release(uint32_t rank,
                                 const std::vector<uint64_t>& ids) {
  if (!options_.transport)
    return absl::FailedPreconditionError("no data plane transport");
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, Installed());
  return m->publisher->Release(rank, ids);
}

std::map<uint32_t, LeaseTable::RankStats> ShardStore::LeaseStats() {
  if (!options_.transport || !registered()) return {};
  return Current()->publisher->LeaseStats();
}

PublishLatency::Summary ShardStore::PublishLatencySummary() const {
  if (!registered()) return {};
  return Current()->publisher->Latency();
}

absl::Status ShardStore::CheckLanding(v1::DType dtype) const {
  if (!options_.transport) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " has no data plane transport"));
  }
  if (dtype != GradientWire().dtype()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " lands ", GradientWire().name(),
        " gradients, not ",
        v1::DType_IsValid(dtype) ? v1::DType_Name(dtype) : "?",
        " (bf16.enabled and zero_optimization.zero_quantized_gradients must "
        "match)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ShardStore::Model>> ShardStore::CheckReserve(
    uint32_t group, uint64_t step, uint32_t micro_step, uint32_t rank,
    v1::DType dtype) {
  ZS_RETURN_IF_ERROR(CheckLanding(dtype));
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, ForGroup(group));
  ContributionBuffer& c = *m->contributions[group];
  ZS_RETURN_IF_ERROR(c.CheckNew(step, micro_step, rank));
  if (c.elements() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", group, " has no trainable elements on shard ",
        options_.shard_id, ": its contributions need no landing slot"));
  }
  return m;
}

LandingGrant ShardStore::GrantOf(const Model& m, uint32_t group,
                                 uint32_t slot) const {
  LandingGrant grant;
  grant.slot = slot;
  grant.region = m.pool->region()->Describe();
  grant.offset = static_cast<uint64_t>(slot) * m.pool->slot_bytes();
  grant.elements = m.contributions[group]->elements();
  return grant;
}

absl::StatusOr<LandingGrant> ShardStore::ReserveLanding(
    uint32_t group, uint64_t step, uint32_t micro_step, uint32_t rank,
    v1::DType dtype, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m,
                      CheckReserve(group, step, micro_step, rank, dtype));
  absl::StatusOr<uint32_t> taken = TakeSlot(*m, group, step, micro_step, rank,
                                            deadline, Watch(*m, cancelled));
  ZS_RETURN_IF_ERROR(RolledBack(*m, taken.status()));
  return GrantOf(*m, group, *taken);
}

absl::StatusOr<std::optional<LandingGrant>> ShardStore::TryReserveLanding(
    uint32_t group, uint64_t step, uint32_t micro_step, uint32_t rank,
    v1::DType dtype) {
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m,
                      CheckReserve(group, step, micro_step, rank, dtype));
  absl::StatusOr<std::optional<uint32_t>> taken =
      TryTakeSlot(*m, group, step, micro_step, rank);
  ZS_RETURN_IF_ERROR(RolledBack(*m, taken.status()));
  if (!*taken) return std::nullopt;
  return GrantOf(*m, group, **taken);
}

absl::StatusOr<uint64_t> ShardStore::Landed(uint32_t group, uint64_t step,
                                            uint32_t micro_step, uint32_t rank,
                                            v1::DType dtype,
                                            std::optional<uint32_t> slot,
                                            bool credit,
                                            const std::string& trainer_state) {
  ZS_RETURN_IF_ERROR(CheckLanding(dtype));
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<Model> m, ForGroup(group));
  ContributionBuffer& c = *m->contributions[group];
  if (credit) {
    if (!slot || c.elements() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a landing credit names a slot, for a group with trainable "
          "elements (group ",
          group, " on shard ", options_.shard_id, ")"));
    }
    ZS_RETURN_IF_ERROR(c.CheckNew(step, micro_step, rank));
    if (!m->pool->RedeemCredit(*slot, rank)) {
      return absl::FailedPreconditionError(
          absl::StrCat("landing slot ", *slot, " is not trainer ", rank,
                       "'s landing credit on shard ", options_.shard_id));
    }
    absl::Status st = c.Reserve(step, micro_step, rank, *slot);
    if (!st.ok()) {
      m->pool->Give(*slot);
      return st;
    }
    m->pool->Notify();
  } else if (c.elements() > 0) {
    const std::optional<uint32_t> reserved =
        c.ReservedSlot(step, micro_step, rank);
    if (reserved && slot != reserved) {
      return absl::FailedPreconditionError(absl::StrCat(
          "trainer ", rank, " landed micro-step ", micro_step, " of step ",
          step, " of group ", group, " in ",
          slot ? absl::StrCat("landing slot ", *slot) : "no landing slot",
          " but reserved slot ", *reserved, " on shard ", options_.shard_id));
    }
  } else if (slot) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " has no trainable elements on shard ",
                     options_.shard_id, ": its contributions land in no slot"));
  }
  // Before the contribution counts: the step it completes may be staged at
  // once. Not for a rank the step does not take (a client from before a
  // rollback).
  if (!trainer_state.empty() && roster_->CheckContributor(rank, step).ok()) {
    RecordTrainerState(rank, step, trainer_state);
  }
  ZS_ASSIGN_OR_RETURN(ContributionBuffer::Arrival a,
                      c.Land(step, micro_step, rank));
  if (slot) ++(credit ? landed_credit_ : landed_reserved_);
  Arrived(*m, group, a);
  return a.bytes;
}

absl::Status ShardStore::Drain(absl::Time deadline) {
  if (!registered()) return absl::OkStatus();
  return Current()->engine->Run([] { return absl::OkStatus(); }, deadline);
}

std::vector<GroupProgress> ShardStore::Progress() const {
  std::vector<GroupProgress> out;
  if (!registered()) return out;
  const std::shared_ptr<Model> current = Current();
  const Model& m = *current;
  for (uint32_t g = 0; g < m.contributions.size(); ++g) {
    const ContributionBuffer::Progress c = m.contributions[g]->GetProgress();
    GroupProgress p;
    p.version = m.optimizer->version(g);
    p.slice = m.optimizer->shape(g).slice;
    p.contributions_received = c.complete;
    p.waiting_for_ranks = c.waiting_for;
    out.push_back(std::move(p));
  }
  return out;
}

std::optional<LandingGrant> ShardStore::GrantCredit(uint32_t rank) {
  if (!options_.transport || !registered() || rank >= options_.world_size ||
      !roster_->Expected(rank, UINT64_MAX)) {
    return std::nullopt;
  }
  const std::shared_ptr<Model> current = Current();
  LandingPool& pool = *current->pool;
  if (!pool.region()) return std::nullopt;
  const std::optional<uint32_t> slot = pool.GrantCredit(rank);
  if (!slot) return std::nullopt;
  LandingGrant grant;
  grant.slot = *slot;
  grant.region = pool.region()->Describe();
  grant.offset = static_cast<uint64_t>(*slot) * pool.slot_bytes();
  grant.elements = current->landing_capacity;
  return grant;
}

void ShardStore::ForgetCredit(uint32_t rank) {
  if (registered()) Current()->pool->ForgetCredit(rank);
}

absl::StatusOr<uint64_t> ShardStore::PrepareAdmit(uint32_t rank,
                                                  uint64_t min_step,
                                                  const std::string& identity,
                                                  absl::Time deadline) {
  if (rank >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", rank, " out of range (",
                     options_.world_size, " ranks)"));
  }
  if (!registered()) {
    // Nothing has moved yet: the store is at its first version.
    ZS_RETURN_IF_ERROR(roster_->Prepare(rank, min_step, identity));
    return min_step;
  }
  const std::shared_ptr<Model> current = Current();
  Model& m = *current;
  auto from = std::make_shared<uint64_t>(min_step);
  // On the engine thread: no group moves while the step is chosen.
  ZS_RETURN_IF_ERROR(m.engine->Run(
      [this, &m, rank, identity, from]() -> absl::Status {
        for (uint32_t g = 0; g < m.optimizer->num_groups(); ++g) {
          if (m.optimizer->shape(g).slice.size() == 0) continue;
          const uint64_t v = m.optimizer->version(g);
          ContributionBuffer& c = *m.contributions[g];
          // A step that waits for the rank already (one of the first
          // --trainers ranks) and that it has not touched is its to join,
          // and so is one that has not begun. Any other goes on without it:
          // the others' contributions were admitted to the landing pool as
          // if it would not come, and would wait behind it in the fold
          // order for slots it could not get; an earlier process of this
          // rank's may have left part of a contribution.
          const bool waits = roster_->Expected(rank, v) && !c.RankTouched(rank);
          *from = std::max(*from, v + (waits || c.Quiet() ? 0 : 1));
        }
        for (uint32_t g = 0; g < m.optimizer->num_groups(); ++g) {
          // Steps it joins that only passed over absent ranks: it comes.
          if (m.optimizer->version(g) == *from) m.contributions[g]->Rewind();
        }
        return roster_->Prepare(rank, *from, identity);
      },
      deadline));
  m.engine->RosterChanged(nullptr, [pool = m.pool.get()] { pool->Notify(); });
  return *from;
}

absl::Status ShardStore::Admit(uint32_t rank, uint64_t step) {
  ZS_RETURN_IF_ERROR(roster_->Admit(rank, step));
  if (registered()) {
    const std::shared_ptr<Model> current = Current();
    current->engine->RosterChanged(
        nullptr, [pool = current->pool.get()] { pool->Notify(); });
  }
  return absl::OkStatus();
}

void ShardStore::DropTrainer(uint32_t rank, const std::string& reason) {
  if (!registered()) {
    roster_->Drop(rank, reason);
    return;
  }
  const std::shared_ptr<Model> current = Current();
  Model& m = *current;
  // Not on the engine: it may be waiting in a slot wait for these.
  m.publisher->ReleaseRank(rank);
  m.pool->DropRank(rank);
  m.engine->RosterChanged(
      [this, &m, rank, reason] {
        if (!roster_->Expected(rank, UINT64_MAX)) return;  // not a member
        // After the drop nothing more of the rank lands: what has is final.
        roster_->Drop(rank, reason);
        absl::MutexLock lock(&drops_mu_);
        for (uint32_t g = 0; g < m.optimizer->num_groups(); ++g) {
          if (m.optimizer->shape(g).slice.size() == 0) continue;
          const auto [step, mask] = m.contributions[g]->LandedMask(rank);
          drops_.push_back(DropRecord{rank, g, step, mask});
        }
        while (drops_.size() > 4096) drops_.pop_front();
      },
      [pool = m.pool.get()] { pool->Notify(); });
}

std::vector<ShardStore::DropRecord> ShardStore::DropRecords() const {
  absl::MutexLock lock(&drops_mu_);
  return {drops_.begin(), drops_.end()};
}

StoreMemory ShardStore::Memory() const {
  StoreMemory out;
  if (!registered()) return out;
  const std::shared_ptr<Model> current = Current();
  const Model& m = *current;
  const uint64_t published_elem = options_.publish_bf16 ? 2 : 4;
  for (uint32_t g = 0; g < m.optimizer->num_groups(); ++g) {
    const GroupShape& shape = m.optimizer->shape(g);
    out.state +=
        sizeof(float) * (shape.slice.size() + 2 * shape.trainable_size());
    out.published += 2 * published_elem * shape.slice.size();
    out.accumulators += m.contributions[g]->bytes();
  }
  out.landing = m.pool->bytes();
  out.landing_slots = m.pool->slots();
  out.landing_slots_peak = m.pool->stats().peak_in_use;
  out.landed_reserved = landed_reserved_.load();
  out.landed_credit = landed_credit_.load();
  const UpdateEngine::ReduceStats r = m.engine->reduce_stats();
  out.reduced_contributions = r.contributions;
  out.reduced_elements = r.elements;
  out.reduce_seconds = r.seconds;
  return out;
}

UpdateEngine::UpdateStats ShardStore::Timings() const {
  if (!registered()) return {};
  return Current()->engine->update_stats();
}

uint64_t ShardStore::slice_elements() const {
  const PartitionMap* map = partition_map();
  return map ? map->shard_numel(options_.shard_id) : 0;
}

}  // namespace zshard
