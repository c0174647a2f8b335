#include "server/snapshot/held_snapshots.h"

#include "common/base/huge_pages.h"

namespace zshard {

std::shared_ptr<Snapshot> HeldSnapshots::Begin(
    const v1::SnapshotHeader& header) {
  std::shared_ptr<Snapshot> s;
  {
    absl::MutexLock lock(&mu_);
    auto it = spare_.find(header.shard_id());
    if (it != spare_.end() && it->second.use_count() == 1) {
      s = std::move(it->second);
      spare_.erase(it);
    }
  }
  if (!s) s = std::make_shared<Snapshot>();
  s->header = header;
  if (s->data.size() != header.total_floats()) {
    // Fresh memory, touched here while the shard trains: in huge pages.
    std::vector<float>().swap(s->data);
    s->data.reserve(header.total_floats());
    AdviseHugePages(s->data.data(), header.total_floats() * sizeof(float));
    s->data.resize(header.total_floats());
  }
  s->filled = 0;
  return s;
}

void HeldSnapshots::Keep(std::shared_ptr<Snapshot> s) {
  absl::MutexLock lock(&mu_);
  auto& q = held_[s->header.shard_id()];
  const uint64_t complete = s->header.complete_step();
  // Besides the new one, only the sender's newest complete one stays (a
  // snapshot that arrived but was not held everywhere is of no use).
  for (auto it = q.begin(); it != q.end();) {
    if ((*it)->step() == complete && complete != s->step()) {
      ++it;
      continue;
    }
    spare_[s->header.shard_id()] = std::move(*it);
    it = q.erase(it);
  }
  q.push_back(std::move(s));
}

std::shared_ptr<const Snapshot> HeldSnapshots::Get(uint32_t shard,
                                                   uint64_t step) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(shard);
  if (it == held_.end()) return nullptr;
  for (const auto& s : it->second) {
    if (s->step() == step) return s;
  }
  return nullptr;
}

std::vector<std::pair<uint32_t, uint64_t>> HeldSnapshots::Inventory() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (const auto& [shard, q] : held_) {
    for (const auto& s : q) out.emplace_back(shard, s->step());
  }
  return out;
}

uint64_t HeldSnapshots::bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [shard, q] : held_) {
    for (const auto& s : q) n += s->data.size() * sizeof(float);
  }
  return n;
}

}  // namespace zshard
