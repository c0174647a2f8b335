// StepReporter: sends a trainer's finished steps (loss, samples, wall time)
// to shard 0's ReportStep, for its status page and metrics. Fire and forget
// on gRPC's callback API: Report never blocks the training path; at most 8
// reports are in flight (more are dropped and counted: shard 0 is that many
// steps behind); each has a 5 s deadline. Thread-safe.
#ifndef ZSHARD_CLIENT_CORE_STEP_REPORTER_H_
#define ZSHARD_CLIENT_CORE_STEP_REPORTER_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {

class StepReporter {
 public:
  // `shard0` is not owned and outlives the reporter. With an
  // `instance_id` (not 0) each report also counts as this trainer's
  // heartbeat, and `accepted(sent)` (on gRPC's callback thread; must not
  // block) is told when shard 0 accepted a report sent at `sent`.
  StepReporter(v1::ShardService::Stub* shard0, uint32_t rank,
               uint64_t instance_id = 0,
               std::function<void(absl::Time)> accepted = nullptr)
      : shard0_(shard0),
        rank_(rank),
        instance_id_(instance_id),
        accepted_(std::move(accepted)) {}
  // Waits for the reports in flight (each ends by its deadline).
  ~StepReporter();
  StepReporter(const StepReporter&) = delete;
  StepReporter& operator=(const StepReporter&) = delete;

  void Report(uint64_t step, double loss, uint64_t samples, double step_seconds,
              uint64_t rpcs);

  struct Counts {
    uint64_t sent = 0;     // answered OK
    uint64_t failed = 0;   // answered with an error
    uint64_t dropped = 0;  // not sent: too many in flight
  };
  Counts counts() const;

  // Blocks until no report is in flight, at most `timeout`; false if some
  // still were then.
  bool WaitIdle(absl::Duration timeout) const;

 private:
  static constexpr int kMaxInFlight = 8;
  struct Call;
  void Done(Call* call, bool ok);

  v1::ShardService::Stub* const shard0_;
  const uint32_t rank_;
  const uint64_t instance_id_;
  const std::function<void(absl::Time)> accepted_;
  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_STEP_REPORTER_H_
