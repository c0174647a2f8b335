#include "common/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace zshard {

LossScaler::LossScaler(const Fp16Config& c)
    : dynamic_(c.enabled && c.loss_scale == 0),
      window_(c.loss_scale_window),
      hysteresis_(c.hysteresis),
      min_scale_(c.min_loss_scale),
      scale_(!c.enabled ? 1.0
                        : (c.loss_scale != 0 ? c.loss_scale
                                             : std::ldexp(1.0, static_cast<int>(
                                                                   c.initial_scale_power)))),
      cur_hysteresis_(c.hysteresis) {}

void LossScaler::Update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (hysteresis_ == 1 || cur_hysteresis_ == 1) {
      scale_ = std::max(scale_ / 2, min_scale_);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = iter_;
  } else if ((iter_ - last_overflow_iter_) % static_cast<int64_t>(window_) == 0) {
    cur_hysteresis_ = hysteresis_;
    scale_ *= 2;
  }
  ++iter_;
}

}  // namespace zshard
