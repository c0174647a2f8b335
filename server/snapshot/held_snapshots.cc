#include "server/snapshot/held_snapshots.h"

#include "common/base/huge_pages.h"

namespace zshard {

namespace {

// Gives s->data exactly `floats` values; fresh memory (when the buffer has
// too little room) in huge pages.
void SizeHeld(Snapshot* s, uint64_t floats) {
  if (s->data.size() == floats) return;
  if (s->data.capacity() < floats) {
    std::vector<float>().swap(s->data);
    s->data.reserve(floats);
    AdviseHugePages(s->data.data(), floats * sizeof(float));
  }
  s->data.resize(floats);
}

}  // namespace

void HeldSnapshots::Prepare(uint32_t shard, uint64_t floats) {
  std::vector<std::shared_ptr<Snapshot>> made;
  {
    absl::MutexLock lock(&mu_);
    int missing = kBuffersPerShard;
    for (const auto& s : spare_[shard]) {
      if (s->data.capacity() >= floats) --missing;
    }
    auto it = held_.find(shard);
    if (it != held_.end()) missing -= static_cast<int>(it->second.size());
    for (int i = 0; i < missing; ++i) made.push_back(std::make_shared<Snapshot>());
  }
  for (auto& s : made) {
    SizeHeld(s.get(), floats);  // touched outside the lock
    s->data.clear();            // the room (and the touched pages) stay
  }
  absl::MutexLock lock(&mu_);
  auto& spares = spare_[shard];
  for (auto& s : made) {
    if (spares.size() < static_cast<size_t>(kBuffersPerShard)) {
      spares.push_back(std::move(s));
    }
  }
}

std::shared_ptr<Snapshot> HeldSnapshots::Begin(
    const v1::SnapshotHeader& header) {
  std::shared_ptr<Snapshot> s;
  {
    absl::MutexLock lock(&mu_);
    auto& spares = spare_[header.shard_id()];
    // A free one (no reader holds it), with room if there is such.
    auto pick = spares.end();
    for (auto it = spares.begin(); it != spares.end(); ++it) {
      if (it->use_count() != 1) continue;
      if (pick == spares.end() ||
          (*it)->data.capacity() >= header.total_floats()) {
        pick = it;
      }
    }
    if (pick != spares.end()) {
      s = std::move(*pick);
      spares.erase(pick);
    }
  }
  if (!s) s = std::make_shared<Snapshot>();
  s->header = header;
  SizeHeld(s.get(), header.total_floats());
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
    auto& spares = spare_[s->header.shard_id()];
    if (spares.size() < static_cast<size_t>(kBuffersPerShard)) {
      spares.push_back(std::move(*it));
    }
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
