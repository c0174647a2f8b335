// StepHistory: what the trainers reported of their finished steps (loss,
// samples, wall time, calls to the shards), kept on shard 0 for its status page
// and metrics: one entry per step, averaged over the ranks that reported it.
// Bounded: past kMaxSteps entries, every other old entry is dropped, so a long
// run keeps its whole curve at a coarser grain. Thread-safe.
#ifndef ZSHARD_SERVER_METRICS_STEP_HISTORY_H_
#define ZSHARD_SERVER_METRICS_STEP_HISTORY_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zshard {

struct StepPoint {
  uint64_t step = 0;
  absl::Time time;          // when the last report of the step came
  double loss = 0;          // mean over the ranks that reported
  uint64_t samples = 0;     // summed over them
  double step_seconds = 0;  // the slowest rank's
  uint32_t ranks = 0;       // how many reported
  uint64_t rpcs = 0;        // the busiest rank's calls to the shards
};

class StepHistory {
 public:
  static constexpr size_t kMaxSteps = 2048;

  // Adds rank `rank`'s report of `step`. A non-finite loss is kept as
  // reported (the page shows the gap); a second report of the same rank and
  // step replaces nothing (INVALID_ARGUMENT is the caller's).
  void Add(uint64_t step, uint32_t rank, double loss, uint64_t samples,
           double step_seconds, uint64_t rpcs, absl::Time now);

  // The curve, oldest first.
  std::vector<StepPoint> Points() const;
  // Reports received, and the newest step reported (0: none).
  uint64_t reports() const;
  uint64_t last_step() const;

 private:
  struct Entry {
    StepPoint point;
    double loss_sum = 0;
    std::vector<uint32_t> ranks;
  };
  void ThinLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> steps_ ABSL_GUARDED_BY(mu_);
  uint64_t reports_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_METRICS_STEP_HISTORY_H_
