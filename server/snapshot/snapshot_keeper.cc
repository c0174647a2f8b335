#include "server/snapshot/snapshot_keeper.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace zshard {

SnapshotKeeper::SnapshotKeeper(const SnapshotKeeperOptions& options,
                               const Optimizer* optimizer, SendFn send,
                               SkipFn skip)
    : options_(options),
      optimizer_(optimizer),
      send_(std::move(send)),
      skip_(std::move(skip)),
      thread_([this] { Run(); }) {}

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
  if (rank >= options_.world_size) return;
  absl::MutexLock lock(&mu_);
  auto& states = trainer_states_[rank];
  states[step] = std::move(state);
  while (states.size() > 4) states.erase(states.begin());
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

void SnapshotKeeper::BeginLocked(uint64_t version) {
  std::shared_ptr<Snapshot> s;
  if (spare_ && spare_.use_count() == 1) s = std::move(spare_);
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
  const size_t bytes = total * sizeof(float);
  if (s->region && s->region->size() != bytes) s->region.reset();
  if (options_.transport && !s->region && total > 0) {
    // The transport's memory (UCX: shared memory the buddy copies from
    // directly), allocated and touched once per buffer.
    auto r = options_.transport->Allocate(bytes);
    if (r.ok()) {
      s->region = std::move(*r);
      s->data.clear();
      s->data.shrink_to_fit();
    }
  }
  if (!s->region && s->data.size() != total) s->data.resize(total);
  s->filled = 0;
  pending_ = std::move(s);
  group_staged_.assign(optimizer_->num_groups(), 0);
  staged_ = 0;
  stats_.bytes = total * sizeof(float);
}

void SnapshotKeeper::Stage(uint32_t group, uint64_t version) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  if (version == skipping_) return;
  if (!pending_ || pending_->step() != version) {
    if (pending_ && pending_->step() > version) return;  // a late publish
    if (to_send_) {
      // The previous one is still on its way: this step is skipped here
      // (the engine never waits), and the others are told so theirs of
      // this step do not wait for this shard's.
      skipping_ = version;
      skips_.push_back(version);
      ++stats_.skipped;
      return;
    }
    BeginLocked(version);
  }
  if (group >= group_staged_.size() || group_staged_[group]) return;
  const absl::Time start = absl::Now();
  Snapshot& s = *pending_;
  const size_t i = group;
  float* out = s.values() + s.GroupOffset(i);
  v1::SnapshotGroup* sg = s.header.mutable_groups(static_cast<int>(i));
  optimizer_->Read(group, [&](const Optimizer::State& st) {
    out = std::copy(st.master.begin(), st.master.end(), out);
    out = std::copy(st.m.begin(), st.m.end(), out);
    std::copy(st.v.begin(), st.v.end(), out);
    sg->set_version(st.version);
    sg->set_applied(st.applied);
    s.filled += st.master.size() + st.m.size() + st.v.size();
  });
  group_staged_[group] = 1;
  stats_.stage_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  if (++staged_ < group_staged_.size()) return;
  // Every group is in: the resume states and hand it to the sender.
  for (const auto& [rank, states] : trainer_states_) {
    auto it = states.find(version - 1);
    if (it != states.end())
      (*s.header.mutable_trainer_states())[rank] = it->second;
  }
  auto sk = skipped_.find(version);
  s.header.set_last_step_skipped(sk != skipped_.end() && sk->second);
  to_send_ = pending_;
}

void SnapshotKeeper::Run() {
  for (;;) {
    std::shared_ptr<Snapshot> s;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !skips_.empty() || (to_send_ != nullptr && !sent_);
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
      spare_ = std::move(s);
      continue;
    }
    ++stats_.taken;
    stats_.newest_complete = s->step();
    spare_ = std::move(kept_);
    kept_ = std::move(s);
    if (pending_ == kept_) pending_ = nullptr;
  }
}

std::shared_ptr<const Snapshot> SnapshotKeeper::Own(uint64_t step) const {
  absl::MutexLock lock(&mu_);
  if (kept_ && kept_->step() == step) return kept_;
  if (pending_ && pending_->step() == step && staged_ == group_staged_.size()) {
    return pending_;
  }
  return nullptr;
}

std::vector<uint64_t> SnapshotKeeper::OwnSteps() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> steps;
  if (kept_) steps.push_back(kept_->step());
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
