#include "cpu/kernel_pool.h"

#include <pthread.h>

namespace zshard {
namespace kernels {

KernelPool::KernelPool(int threads) {
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] {
      // As common/base/thread_name.h does (the kernels depend on no other
      // zshard library).
      pthread_setname_np(pthread_self(), "zs-kernels");
      Work(i);
    });
  }
}

KernelPool::~KernelPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (auto& t : workers_) t.join();
}

void KernelPool::Run(int parts, const std::function<void(int)>& fn) {
  if (parts <= 1 || workers_.empty()) {
    for (int i = 0; i < parts; ++i) fn(i);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    parts_ = parts;
    remaining_ = parts - 1;
    ++generation_;
  }
  fn(0);
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return remaining_ == 0; };
  // Workers only run our closure; they finish it without waiting on anything.
  mu_.Await(absl::Condition(&done));
  fn_ = nullptr;
}

void KernelPool::Work(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* fn = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      seen = generation_;
      if (index >= parts_) continue;
      fn = fn_;
    }
    (*fn)(index);
    absl::MutexLock lock(&mu_);
    --remaining_;
  }
}

}  // namespace kernels
}  // namespace zshard
