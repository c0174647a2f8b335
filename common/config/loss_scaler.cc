#include "common/config/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace zshard {

LossScaler::LossScaler(const Fp16Config& c)
    : dynamic_(c.enabled && c.loss_scale == 0),
      window_(c.loss_scale_window),
      hysteresis_(c.hysteresis),
      min_scale_(c.min_loss_scale),
      scale_(!c.enabled ? 1.0
                        : (c.loss_scale != 0
                               ? c.loss_scale
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
  } else if ((iter_ - last_overflow_iter_) % static_cast<int64_t>(window_) ==
             0) {
    cur_hysteresis_ = hysteresis_;
    scale_ *= 2;
  }
  ++iter_;
}

std::string LossScaler::Save() const {
  return absl::StrFormat("scale=%a hysteresis=%u iter=%d last_overflow=%d",
                         scale_, cur_hysteresis_, iter_, last_overflow_iter_);
}

absl::Status LossScaler::Load(absl::string_view text) {
  double scale = 0;
  unsigned hysteresis = 0;
  long long iter = 0, last = 0;
  const std::string s(text);
  char tail = 0;
  if (std::sscanf(s.c_str(),
                  "scale=%la hysteresis=%u iter=%lld last_overflow=%lld%c",
                  &scale, &hysteresis, &iter, &last, &tail) != 4 ||
      !(scale > 0) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError("loss scaler state '" + s +
                                      "' is not one Save() wrote");
  }
  scale_ = scale;
  cur_hysteresis_ = hysteresis;
  iter_ = iter;
  last_overflow_iter_ = last;
  return absl::OkStatus();
}

}  // namespace zshard
