// The AdamW kernel arguments for one update from the config's optimizer and
// schedule: the one place that turns DeepSpeed's keys into kernel arguments
// (servers, stage-0 trainers and test references all use it).
#ifndef ZSHARD_COMMON_CONFIG_ADAMW_STEP_H_
#define ZSHARD_COMMON_CONFIG_ADAMW_STEP_H_

#include <cstdint>

#include "common/config/training_config.h"
#include "zshard/kernels/adamw.h"

namespace zshard {

// The update that follows `applied` earlier ones (its 1-based step is
// applied + 1; the learning rate comes from the schedule).
inline kernels::AdamWStep AdamWStepFor(const AdamWParams& adamw,
                                       const SchedulerConfig& schedule,
                                       uint64_t applied,
                                       float grad_scale = 1.0f) {
  kernels::AdamWStep hp;
  hp.lr = static_cast<float>(LearningRate(schedule, adamw.lr, applied));
  hp.beta1 = static_cast<float>(adamw.beta1);
  hp.beta2 = static_cast<float>(adamw.beta2);
  hp.eps = static_cast<float>(adamw.eps);
  hp.weight_decay = static_cast<float>(adamw.weight_decay);
  hp.step = static_cast<int64_t>(applied) + 1;
  hp.grad_scale = grad_scale;
  return hp;
}

}  // namespace zshard

#endif  // ZSHARD_COMMON_CONFIG_ADAMW_STEP_H_
