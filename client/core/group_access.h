// GroupAccess: what a model runner needs from wherever the parameters live —
// acquire a group's values, release them, hand back its gradient. The
// trainer client implements it over the shard servers; tests implement it
// in memory to compute reference results with the same runner.
#ifndef ZSHARD_CLIENT_CORE_GROUP_ACCESS_H_
#define ZSHARD_CLIENT_CORE_GROUP_ACCESS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zshard {

class GroupAccess {
 public:
  virtual ~GroupAccess() = default;
  // Group g's flat values (fp32, or bf16 bits when the cluster runs with
  // bf16), read-only, valid until Release(g).
  virtual absl::StatusOr<const void*> Acquire(size_t g) = 0;
  virtual absl::Status Release(size_t g) = 0;
  // Group g's flat gradient (same element type) for micro-step `micro_step`
  // of the current step. The data is copied before this returns.
  virtual absl::Status PushGradient(size_t g, const void* grad,
                                    uint32_t micro_step) = 0;
  // Where to write group g's next gradient so that PushGradient(g, it, ...)
  // need not copy it (a buffer of the group's size, valid until then); null:
  // the caller's own buffer is as good.
  virtual void* GradientBuffer(size_t /*g*/) { return nullptr; }
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_GROUP_ACCESS_H_
