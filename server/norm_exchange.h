// NormExchange: how a shard learns the global part of a step's decision
// (DESIGN.md, "One training step"): it reports its own sum of squares and
// inf/nan flag for the step and gets the totals over every shard, summed in
// shard order so every shard decides the same. The coordinator's service
// implements it for the cluster; a lone shard's totals are its own.
#ifndef ZSHARD_SERVER_NORM_EXCHANGE_H_
#define ZSHARD_SERVER_NORM_EXCHANGE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zshard {

// The global part of a step's decision, summed over every shard.
struct NormTotals {
  double sum_squares = 0;
  bool non_finite = false;
};

class NormExchange {
 public:
  virtual ~NormExchange() = default;
  // Reports this shard's part of `step`; blocks until every shard reported
  // or `deadline` (DEADLINE_EXCEEDED naming the shards missing). May be
  // called from the update engine's thread.
  virtual absl::StatusOr<NormTotals> Exchange(uint64_t step, double sum_squares,
                                              bool non_finite, absl::Time deadline) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_NORM_EXCHANGE_H_
