// PublishLatency: how long a group's new version takes to reach the trainers
// (DESIGN.md, "The server's step as a pipeline"): the time from the last
// contribution of a group's step landing on this shard to the first lease of
// the version that step produced. Keeps the most recent samples only.
// Thread-safe; Record and Summary never block for long.
#ifndef ZSHARD_SERVER_PUBLISH_LATENCY_H_
#define ZSHARD_SERVER_PUBLISH_LATENCY_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zshard {

class PublishLatency {
 public:
  // Samples kept: the newest `capacity` ones.
  explicit PublishLatency(size_t capacity = 4096) : capacity_(capacity) {}

  void Record(absl::Duration latency);

  struct Summary {
    uint64_t count = 0;  // every sample ever recorded
    absl::Duration median = absl::ZeroDuration();  // over the kept ones
    absl::Duration p90 = absl::ZeroDuration();
  };
  Summary Summarize() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<absl::Duration> samples_ ABSL_GUARDED_BY(mu_);  // a ring
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_PUBLISH_LATENCY_H_
