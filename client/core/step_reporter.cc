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

StepReporter::~StepReporter() {
  // Every call ends by its own 5 s deadline; the margin covers gRPC's
  // callback thread getting to it.
  WaitIdle(absl::Seconds(10));
}

bool StepReporter::WaitIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void StepReporter::Report(uint64_t step, double loss, uint64_t samples,
                          double step_seconds, uint64_t rpcs) {
  {
    absl::MutexLock lock(&mu_);
    if (in_flight_ >= kMaxInFlight) {
      ++counts_.dropped;
      return;
    }
    ++in_flight_;
  }
  Call* call = new Call();
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  call->req.set_step(step);
  call->req.set_trainer_rank(rank_);
  call->req.set_loss(loss);
  call->req.set_samples(samples);
  call->req.set_step_seconds(step_seconds);
  call->req.set_rpcs(rpcs);
  call->req.set_instance_id(instance_id_);
  call->sent = absl::Now();
  shard0_->async()->ReportStep(
      &call->ctx, &call->req, &call->resp,
      [this, call](grpc::Status st) { Done(call, st.ok()); });
}

void StepReporter::Done(Call* call, bool ok) {
  if (ok && instance_id_ != 0 && accepted_) accepted_(call->sent);
  delete call;
  absl::MutexLock lock(&mu_);
  --in_flight_;
  if (ok) {
    ++counts_.sent;
  } else {
    ++counts_.failed;
  }
}

StepReporter::Counts StepReporter::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace zshard
