#include "server/publish_latency.h"

#include <algorithm>

namespace zshard {

void PublishLatency::Record(absl::Duration latency) {
  absl::MutexLock lock(&mu_);
  if (samples_.size() < capacity_) {
    samples_.push_back(latency);
  } else {
    samples_[count_ % capacity_] = latency;
  }
  ++count_;
}

PublishLatency::Summary PublishLatency::Summarize() const {
  std::vector<absl::Duration> s;
  Summary out;
  {
    absl::MutexLock lock(&mu_);
    s = samples_;
    out.count = count_;
  }
  if (s.empty()) return out;
  std::sort(s.begin(), s.end());
  out.median = s[s.size() / 2];
  out.p90 = s[std::min(s.size() - 1, s.size() * 9 / 10)];
  return out;
}

}  // namespace zshard
