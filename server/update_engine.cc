#include "server/update_engine.h"

#include <cmath>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/base/thread_name.h"

namespace zshard {

namespace {

// The first group with elements on this shard (0 when none has any).
uint32_t FirstGroupWithElements(const UpdateEngineStages& stages) {
  for (uint32_t g = 0; g < stages.contributions.size(); ++g) {
    if (stages.contributions[g]->elements() > 0) return g;
  }
  return 0;
}

}  // namespace

UpdateEngine::UpdateEngine(const UpdateEngineStages& stages,
                           PublishedFn published)
    : stages_(stages),
      published_(std::move(published)),
      summed_(stages.contributions.size(), 0),
      timed_group_(FirstGroupWithElements(stages)),
      thread_([this] {
        NameCurrentThread("zs-engine");
        Loop();
      }) {}

UpdateEngine::~UpdateEngine() { Stop(); }

void UpdateEngine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void UpdateEngine::Post(std::function<void()> item) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  items_.push_back(std::move(item));
}

void UpdateEngine::Loop() {
  for (;;) {
    std::function<void()> item;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_ || !items_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (stop_) return;
      item = std::move(items_.front());
      items_.pop_front();
    }
    item();
  }
}

void UpdateEngine::ContributionLanded(uint32_t group) {
  Post([this, group] { Fold(group); });
}

UpdateEngine::ReduceStats UpdateEngine::reduce_stats() const {
  absl::MutexLock lock(&stats_mu_);
  return reduce_stats_;
}

void UpdateEngine::DecideStep() {
  Post([this] { Decide(); });
}

void UpdateEngine::RosterChanged(std::function<void()> change,
                                 std::function<void()> after) {
  Post([this, change = std::move(change), after = std::move(after)] {
    if (change) change();
    for (uint32_t g = 0; g < stages_.contributions.size(); ++g) Fold(g);
    if (stages_.barrier && stages_.barrier->RosterChanged()) Decide();
    if (after) after();
  });
}

absl::Status UpdateEngine::Run(std::function<absl::Status()> fn, absl::Time deadline) {
  struct Outcome {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto outcome = std::make_shared<Outcome>();
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      return absl::AbortedError(absl::StrCat(
          "shard ", stages_.shard_id,
          ": this state was rolled back or is shutting down; ask again"));
    }
  }
  Post([outcome, fn = std::move(fn)] {
    absl::Status st = fn();
    absl::MutexLock lock(&outcome->mu);
    outcome->status = st;
    outcome->done = true;
  });
  absl::MutexLock lock(&outcome->mu);
  if (!outcome->mu.AwaitWithDeadline(absl::Condition(&outcome->done), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "shard ", stages_.shard_id, ": the update engine did not get to the request in time"));
  }
  return outcome->status;
}

UpdateEngine::UpdateStats UpdateEngine::update_stats() const {
  absl::MutexLock lock(&stats_mu_);
  return update_stats_;
}

void UpdateEngine::Fold(uint32_t group) {
  ContributionBuffer& c = *stages_.contributions[group];
  const absl::Time start = absl::Now();
  const ContributionBuffer::Folded f = c.Fold();
  if (f.contributions > 0) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    absl::MutexLock lock(&stats_mu_);
    reduce_stats_.contributions += f.contributions;
    reduce_stats_.elements += f.contributions * c.elements();
    reduce_stats_.seconds += seconds;
  }
  if (!f.complete) return;
  summed_[group] = f.summed;
  if (stages_.barrier) {
    // The update waits for the step's decision.
    if (stages_.barrier->GroupReduced()) Decide();
    return;
  }
  // The average over what was summed; nothing summed (every trainer of the
  // step dropped before contributing): the group's step is skipped.
  UpdateAndPublish(group, c.sum(),
                   f.summed ? 1.0f / static_cast<float>(f.summed) : 0.0f,
                   f.summed == 0);
}

void UpdateEngine::UpdateAndPublish(uint32_t group, float* grad, float grad_scale, bool skip) {
  Optimizer& opt = *stages_.optimizer;
  Publisher& pub = *stages_.publisher;
  ContributionBuffer& c = *stages_.contributions[group];
  const uint64_t next = opt.version(group) + 1;
  // The slot of version next - 2: free once its readers are done.
  void* out = pub.AcquireSlot(group, next);
  const absl::Time start = absl::Now();
  opt.Update(group, grad, grad_scale, skip, out, pub.SlotData(group, next - 1));
  opt.WriteQuantized(group, pub.QuantizedSlot(group, next));
  const absl::Time done = absl::Now();
  const absl::Time landed = c.GetProgress().completed_at;
  c.Reset(next);
  pub.Publish(group, next, landed);
  {
    absl::MutexLock lock(&stats_mu_);
    ++update_stats_.updates;
    update_stats_.update_seconds += absl::ToDoubleSeconds(done - start);
    if (group == timed_group_) {
      if (last_timed_version_ != absl::InfinitePast()) {
        const double period = absl::ToDoubleSeconds(done - last_timed_version_);
        ++update_stats_.steps_timed;
        update_stats_.step_seconds_sum += period;
        update_stats_.last_step_seconds = period;
      }
      last_timed_version_ = done;
    }
  }
  if (published_) published_(group, next, skip);
}

void UpdateEngine::Decide() {
  const StepBarrier::Pending p = stages_.barrier->pending();
  Optimizer& opt = *stages_.optimizer;
  // Unscale in place (loss scale and averaging over the contributions
  // summed) and measure this shard's part of the global norm, group after
  // group. No commit (every trainer dropped): scale 1.
  const double loss_scale = p.loss_scale > 0 ? p.loss_scale : 1.0;
  double sum_squares = 0;
  bool non_finite = false;
  for (uint32_t g = 0; g < opt.num_groups(); ++g) {
    const size_t n = stages_.contributions[g]->elements();
    if (n == 0 || summed_[g] == 0) continue;
    const float unscale = static_cast<float>(1.0 / (loss_scale * summed_[g]));
    auto r = opt.kernels().GradCheck(stages_.contributions[g]->sum(), n, unscale);
    if (!r.ok()) std::abort();  // arguments are ours; a failure is a bug
    sum_squares += r->sum_squares;
    non_finite |= r->non_finite;
  }
  absl::StatusOr<NormTotals> totals = NormTotals{sum_squares, non_finite};
  if (stages_.exchange) {
    totals = stages_.exchange->Exchange(p.step, sum_squares, non_finite,
                                        absl::Now() + stages_.decision_timeout);
  }
  if (!totals.ok()) {
    stages_.barrier->Failed(absl::Status(
        totals.status().code(),
        absl::StrCat("step ", p.step, " could not be decided: ", totals.status().message())));
    return;
  }
  StepDecision d;
  d.skipped = p.overflow || totals->non_finite;
  d.grad_norm = std::sqrt(totals->sum_squares);
  float coef = 1.0f;
  if (!d.skipped && stages_.gradient_clipping > 0) {
    const double c = stages_.gradient_clipping / (d.grad_norm + 1e-6);
    if (c < 1.0) coef = static_cast<float>(c);
  }
  for (uint32_t g = 0; g < opt.num_groups(); ++g) {
    UpdateAndPublish(g, stages_.contributions[g]->sum(), coef,
                     d.skipped || summed_[g] == 0);
  }
  stages_.barrier->Decided(p.step, d);
}

}  // namespace zshard
