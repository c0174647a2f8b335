// LossScaler: DeepSpeed's fp16 loss scaling rules. Dynamic: start at
// 2^initial_scale_power; an overflow uses up one unit of hysteresis and, when
// none is left, halves the scale (not below min_loss_scale); every
// loss_scale_window steps without overflow doubles it and restores the
// hysteresis. Static when fp16.loss_scale != 0. Pure; thread-compatible.
#ifndef ZSHARD_COMMON_CONFIG_LOSS_SCALER_H_
#define ZSHARD_COMMON_CONFIG_LOSS_SCALER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/config/training_config.h"

namespace zshard {

class LossScaler {
 public:
  // A scaler of 1 that never changes when fp16 is disabled.
  explicit LossScaler(const Fp16Config& config);

  double scale() const { return scale_; }
  // Records the outcome of a step (overflow: the step was skipped).
  void Update(bool overflow);

  // The evolving state as text (exact), and back: a resumed run continues
  // with the same scales. INVALID_ARGUMENT for text Save did not produce.
  std::string Save() const;
  absl::Status Load(absl::string_view text);

 private:
  const bool dynamic_;
  const uint64_t window_;
  const uint32_t hysteresis_;
  const double min_scale_;
  double scale_;
  uint32_t cur_hysteresis_;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_CONFIG_LOSS_SCALER_H_
