// ScratchBuffers: byte buffers that are taken, used by one thread and given
// back, so that transfers needing a staging area (quantized fetches and
// pushes) reuse memory instead of touching fresh pages on every call.
//
// Thread-safe. A buffer keeps its capacity when given back; at most
// `keep` buffers are kept.
#ifndef ZSHARD_CLIENT_CORE_SCRATCH_BUFFERS_H_
#define ZSHARD_CLIENT_CORE_SCRATCH_BUFFERS_H_

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zshard {

class ScratchBuffers {
 public:
  explicit ScratchBuffers(size_t keep) : keep_(keep) {}

  // A buffer of at least `bytes` bytes (as floats, so 4-byte aligned); its
  // contents are undefined.
  std::vector<float> Take(size_t bytes) {
    std::vector<float> b;
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        b.swap(free_.back());
        free_.pop_back();
      }
    }
    b.resize((bytes + sizeof(float) - 1) / sizeof(float));
    return b;
  }
  void Give(std::vector<float> b) {
    absl::MutexLock lock(&mu_);
    if (free_.size() < keep_) free_.push_back(std::move(b));
  }

 private:
  const size_t keep_;
  absl::Mutex mu_;
  std::vector<std::vector<float>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_SCRATCH_BUFFERS_H_
