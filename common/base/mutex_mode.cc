#include "common/base/mutex_mode.h"

#include "absl/synchronization/mutex.h"

namespace zshard {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace zshard
