#include "client/core/step_reporter.h"

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zshard {

struct StepReporter::Call {
  grpc::ClientContext ctx;
  v1::ReportStepRequest req;
  v1::ReportStepResponse resp;
  absl::Time sent;
};

StepReporter::StepReporter(v1::ShardService::Stub* shard0, uint32_t rank,
                           uint64_t instance_id,
                           std::function<void(absl::Time)> accepted)
    : shard0_(shard0),
      rank_(rank),
      instance_id_(instance_id),
      accepted_(std::move(accepted)) {}

StepReporter::~StepReporter() {
  WaitIdle(absl::Seconds(10));
  absl::MutexLock lock(&mu_);
  closing_ = true;
  counts_.dropped += waiting_.size();
  waiting_.clear();
  auto idle = [this]()
                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight_ == 0; };
  // Every call ends by its own 5 s deadline; the margin covers gRPC's
  // callback thread getting to it.
  mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
}

void StepReporter::Report(uint64_t step, double loss, uint64_t samples,
                          double step_seconds, uint64_t rpcs) {
  auto call = std::make_unique<Call>();
  call->req.set_step(step);
  call->req.set_trainer_rank(rank_);
  call->req.set_loss(loss);
  call->req.set_samples(samples);
  call->req.set_step_seconds(step_seconds);
  call->req.set_rpcs(rpcs);
  call->req.set_instance_id(instance_id_);
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || waiting_.size() >= kMaxWaiting) {
      ++counts_.dropped;
      return;
    }
    if (in_flight_ >= kMaxInFlight || !waiting_.empty()) {
      waiting_.push_back(std::move(call));
      return;
    }
    ++in_flight_;
  }
  Send(std::move(call));
}

void StepReporter::Send(std::unique_ptr<Call> owned) {
  Call* call = owned.release();
  call->sent = absl::Now();
  call->ctx.set_deadline(absl::ToChronoTime(call->sent + absl::Seconds(5)));
  shard0_->async()->ReportStep(
      &call->ctx, &call->req, &call->resp,
      [this, call](grpc::Status st) { Done(call, st.ok()); });
}

void StepReporter::Done(Call* call, bool ok) {
  if (ok && instance_id_ != 0 && accepted_) accepted_(call->sent);
  delete call;
  std::unique_ptr<Call> next;
  {
    absl::MutexLock lock(&mu_);
    if (ok) {
      ++counts_.sent;
    } else {
      ++counts_.failed;
    }
    if (closing_ || waiting_.empty()) {
      --in_flight_;
      return;
    }
    next = std::move(waiting_.front());
    waiting_.pop_front();
  }
  Send(std::move(next));
}

bool StepReporter::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return in_flight_ == 0 && waiting_.empty();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
}

StepReporter::Counts StepReporter::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace zshard
