// Internal: a persistent pool that runs one closure over a few parts, the
// calling thread taking part 0. Thread-compatible: one Run at a time.
#ifndef ZSHARD_KERNELS_CPU_KERNEL_POOL_H_
#define ZSHARD_KERNELS_CPU_KERNEL_POOL_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zshard {
namespace kernels {

class KernelPool {
 public:
  // Starts threads - 1 workers.
  explicit KernelPool(int threads);
  ~KernelPool();
  KernelPool(const KernelPool&) = delete;
  KernelPool& operator=(const KernelPool&) = delete;

  // Runs fn(0) .. fn(parts - 1), parts <= threads, and returns when all are
  // done. fn must not throw.
  void Run(int parts, const std::function<void(int)>& fn);

 private:
  void Work(int index);

  absl::Mutex mu_;
  const std::function<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int parts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_CPU_KERNEL_POOL_H_
