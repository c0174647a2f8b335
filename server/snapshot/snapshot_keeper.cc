#include "server/snapshot/snapshot_keeper.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/base/thread_name.h"

namespace zshard {

SnapshotKeeper::SnapshotKeeper(const SnapshotKeeperOptions& options,
                               const Optimizer* optimizer, SendFn send,
                               SkipFn skip)
    : options_(options),
      optimizer_(optimizer),
      send_(std::move(send)),
      skip_(std::move(skip)),
      trainer_states_(options.world_size),
      thread_([this] {
        NameCurrentThread("zs-snapshot");
        Run();
      }) {
  // The buffers of the first two snapshots, allocated and touched now, at
  // the model's setup: fresh memory is slow to touch (tens of ms per 100 MB
  // here), and the first snapshots' buffers were touched on the engine
  // (BeginLocked), which then held up the steps' publishes.
  absl::MutexLock lock(&mu_);
  const uint64_t total = TotalFloats();
  for (int i = 0; i < kBuffers; ++i) {
    auto s = std::make_shared<Snapshot>();
    SizeLocked(*s, total);
    spares_.push_back(std::move(s));
  }
}

SnapshotKeeper::~SnapshotKeeper() {
  Abandon();
  thread_.join();
}

void SnapshotKeeper::Abandon() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void SnapshotKeeper::RecordTrainerState(uint32_t rank, uint64_t step,
                                        std::string state) {
  absl::MutexLock lock(&mu_);
  trainer_states_.Record(rank, step, std::move(state));
}

void SnapshotKeeper::OnPublished(uint32_t group, uint64_t version,
                                 bool skipped) {
  {
    absl::MutexLock lock(&mu_);
    skipped_[version] = skipped;
    while (skipped_.size() > 8) skipped_.erase(skipped_.begin());
  }
  if (version == 0 || version % options_.interval != 0) return;
  Stage(group, version);
}

uint64_t SnapshotKeeper::TotalFloats() const {
  uint64_t total = 0;
  for (uint32_t g = 0; g < optimizer_->num_groups(); ++g) {
    optimizer_->Read(g, [&](const Optimizer::State& st) {
      total += st.master.size() + 2 * st.m.size();
    });
  }
  return total;
}

void SnapshotKeeper::SizeLocked(Snapshot& s, uint64_t total) {
  const size_t bytes = total * sizeof(float);
  if (s.region && s.region->size() != bytes) s.region.reset();
  if (options_.transport && !s.region && total > 0) {
    // The transport's memory (UCX: shared memory the buddy copies from
    // directly), allocated and touched once per buffer.
    auto r = options_.transport->Allocate(bytes);
    if (r.ok()) {
      s.region = std::move(*r);
      s.data.clear();
      s.data.shrink_to_fit();
    }
  }
  if (!s.region && s.data.size() != total) s.data.resize(total);
}

void SnapshotKeeper::KeepSpareLocked(std::shared_ptr<Snapshot> s) {
  if (s && spares_.size() < static_cast<size_t>(kBuffers)) {
    spares_.push_back(std::move(s));
  }
}

void SnapshotKeeper::BeginLocked(uint64_t version) {
  std::shared_ptr<Snapshot> s;
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (it->use_count() == 1) {  // no reader holds it (Own)
      s = std::move(*it);
      spares_.erase(it);
      break;
    }
  }
  if (!s) s = std::make_shared<Snapshot>();
  s->header.Clear();
  s->header.set_shard_id(options_.shard_id);
  s->header.set_num_shards(options_.num_shards);
  s->header.set_step(version);
  s->header.set_spec_hash(options_.spec_hash);
  s->header.set_complete_step(kept_ ? kept_->step() : 0);
  uint64_t total = 0;
  for (uint32_t g = 0; g < optimizer_->num_groups(); ++g) {
    v1::SnapshotGroup* sg = s->header.add_groups();
    sg->set_group(g);
    optimizer_->Read(g, [&](const Optimizer::State& st) {
      sg->set_master_elements(st.master.size());
      sg->set_moment_elements(st.m.size());
    });
    total += sg->master_elements() + 2 * sg->moment_elements();
  }
  s->header.set_total_floats(total);
  SizeLocked(*s, total);
  s->filled = 0;
  pending_ = std::move(s);
  group_staged_.assign(optimizer_->num_groups(), 0);
  staged_ = 0;
  // A group without elements here is never published on this shard (no
  // trainer pushes to it): nothing to copy.
  for (uint32_t g = 0; g < optimizer_->num_groups(); ++g) {
    const v1::SnapshotGroup& sg = pending_->header.groups(static_cast<int>(g));
    if (sg.master_elements() == 0 && sg.moment_elements() == 0) {
      group_staged_[g] = 1;
      ++staged_;
    }
  }
  stats_.bytes = total * sizeof(float);
}

void SnapshotKeeper::SkipLocked(uint64_t version) {
  skipping_ = version;
  skips_.push_back(version);
  ++stats_.skipped;
}

void SnapshotKeeper::Stage(uint32_t group, uint64_t version) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || version == skipping_) return;
  if (!pending_ || pending_->step() != version) {
    if (pending_ && pending_->step() > version) return;  // a late publish
    if (to_send_ || (pending_ && pending_ != kept_)) {
      // The previous one is still being copied or sent: this step is
      // skipped here (the engine never waits), and the others are told so
      // theirs of this step do not wait for this shard's.
      SkipLocked(version);
      return;
    }
    BeginLocked(version);
  }
  if (group >= group_staged_.size() || group_staged_[group]) return;
  group_staged_[group] = 1;
  const v1::SnapshotGroup& sg =
      pending_->header.groups(static_cast<int>(group));
  const uint64_t bytes =
      (sg.master_elements() + 2 * sg.moment_elements()) * sizeof(float);
  if (bytes <= kCopyHereBytes) {
    // Small: copied now, on the engine (microseconds). The keeper's thread
    // could lose the race with the group's next update, which may start at
    // once when the trainers fetch little or nothing of it from this shard.
    CopyLocked(group);
    return;
  }
  copies_.push_back(group);  // the keeper's thread copies it
}

bool SnapshotKeeper::Copy(Snapshot& s, uint32_t group) {
  const uint64_t version = s.step();
  float* out = s.values() + s.GroupOffset(group);
  v1::SnapshotGroup* sg = s.header.mutable_groups(static_cast<int>(group));
  bool same = false;
  optimizer_->Read(group, [&](const Optimizer::State& st) {
    same = st.version == version;  // no update since the publish
    if (!same) return;
    out = std::copy(st.master.begin(), st.master.end(), out);
    out = std::copy(st.m.begin(), st.m.end(), out);
    std::copy(st.v.begin(), st.v.end(), out);
    sg->set_version(st.version);
    sg->set_applied(st.applied);
  });
  return same;
}

void SnapshotKeeper::CopyOneLocked() {
  const uint32_t group = copies_.front();
  copies_.pop_front();
  CopyLocked(group);
}

void SnapshotKeeper::CopyLocked(uint32_t group) {
  std::shared_ptr<Snapshot> s = pending_;
  const absl::Time start = absl::Now();
  mu_.Unlock();
  const bool copied = Copy(*s, group);
  mu_.Lock();
  stats_.stage_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  if (pending_ != s) return;  // abandoned meanwhile
  if (!copied) {
    // The group moved on before it was copied: not this step.
    SkipLocked(s->step());
    copies_.clear();
    pending_ = nullptr;
    KeepSpareLocked(std::move(s));
    return;
  }
  const v1::SnapshotGroup& sg = s->header.groups(static_cast<int>(group));
  s->filled += sg.master_elements() + 2 * sg.moment_elements();
  if (++staged_ < group_staged_.size()) return;
  // Every group is in: the resume states, and to the sender.
  for (auto& [rank, state] : trainer_states_.At(s->step() - 1)) {
    (*s->header.mutable_trainer_states())[rank] = std::move(state);
  }
  auto sk = skipped_.find(s->step());
  s->header.set_last_step_skipped(sk != skipped_.end() && sk->second);
  to_send_ = std::move(s);
}

void SnapshotKeeper::Run() {
  for (;;) {
    std::shared_ptr<Snapshot> s;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !skips_.empty() || !copies_.empty() ||
               (to_send_ != nullptr && !sent_);
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      if (!skips_.empty()) {
        const uint64_t step = skips_.front();
        skips_.pop_front();
        mu_.Unlock();
        (void)skip_(step);  // best effort: the others time out otherwise
        mu_.Lock();
        continue;
      }
      if (!copies_.empty()) {
        CopyOneLocked();
        continue;
      }
      s = to_send_;
      sent_ = true;
    }
    const absl::Time start = absl::Now();
    absl::Status st = send_(*s);
    absl::MutexLock lock(&mu_);
    sent_ = false;
    stats_.send_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    if (to_send_ != s) continue;  // given up on meanwhile
    to_send_ = nullptr;
    if (!st.ok()) {
      ++stats_.failed;
      // ABORTED: another shard skipped the step, or a rollback came.
      if (!absl::IsAborted(st))
        std::cerr << "zshard-server: shard " << options_.shard_id
                  << ": snapshot of step " << s->step()
                  << " not held: " << st.message() << "\n";
      if (pending_ == s) pending_ = nullptr;
      if (!absl::IsAborted(st) && (!kept_ || s->step() > kept_->step())) {
        // Not known to have failed everywhere (the coordinator may have
        // counted the step complete and died before answering, or the
        // buddy that failed is the shard about to be replaced): the others
        // may roll back to it, so it stays listed with the kept one.
        std::swap(unsettled_, s);
      }
      KeepSpareLocked(std::move(s));
      continue;
    }
    ++stats_.taken;
    stats_.newest_complete = s->step();
    KeepSpareLocked(std::move(kept_));
    kept_ = std::move(s);
    if (pending_ == kept_) pending_ = nullptr;
    if (unsettled_ && unsettled_->step() <= kept_->step()) {
      KeepSpareLocked(std::move(unsettled_));
      unsettled_ = nullptr;
    }
  }
}

std::shared_ptr<const Snapshot> SnapshotKeeper::Own(uint64_t step) const {
  absl::MutexLock lock(&mu_);
  if (kept_ && kept_->step() == step) return kept_;
  if (unsettled_ && unsettled_->step() == step) return unsettled_;
  if (pending_ && pending_->step() == step && staged_ == group_staged_.size()) {
    return pending_;
  }
  return nullptr;
}

std::vector<uint64_t> SnapshotKeeper::OwnSteps() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> steps;
  if (kept_) steps.push_back(kept_->step());
  if (unsettled_) steps.push_back(unsettled_->step());
  if (pending_ && pending_ != kept_ && staged_ == group_staged_.size() &&
      pending_->complete()) {
    steps.push_back(pending_->step());
  }
  return steps;
}

SnapshotStats SnapshotKeeper::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace zshard
