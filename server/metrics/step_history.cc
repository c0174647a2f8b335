#include "server/metrics/step_history.h"

#include <algorithm>

namespace zshard {

void StepHistory::Add(uint64_t step, uint32_t rank, double loss,
                      uint64_t samples, double step_seconds, uint64_t rpcs,
                      absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = steps_[step];
  if (std::find(e.ranks.begin(), e.ranks.end(), rank) != e.ranks.end()) {
    return;
  }
  ++reports_;
  e.ranks.push_back(rank);
  e.loss_sum += loss;
  e.point.step = step;
  e.point.time = now;
  e.point.ranks = static_cast<uint32_t>(e.ranks.size());
  e.point.loss = e.loss_sum / e.point.ranks;
  e.point.samples += samples;
  e.point.step_seconds = std::max(e.point.step_seconds, step_seconds);
  e.point.rpcs = std::max(e.point.rpcs, rpcs);
  if (steps_.size() > kMaxSteps) ThinLocked();
}

void StepHistory::ThinLocked() {
  // Drops every other entry of the older half.
  const size_t half = steps_.size() / 2;
  size_t i = 0;
  for (auto it = steps_.begin(); it != steps_.end() && i < half; ++i) {
    it = (i % 2 == 1) ? steps_.erase(it) : std::next(it);
  }
}

std::vector<StepPoint> StepHistory::Points() const {
  absl::MutexLock lock(&mu_);
  std::vector<StepPoint> out;
  out.reserve(steps_.size());
  for (const auto& [step, e] : steps_) out.push_back(e.point);
  return out;
}

uint64_t StepHistory::reports() const {
  absl::MutexLock lock(&mu_);
  return reports_;
}

uint64_t StepHistory::last_step() const {
  absl::MutexLock lock(&mu_);
  return steps_.empty() ? 0 : steps_.rbegin()->first;
}

}  // namespace zshard
