// A fixed-size pool of worker threads running queued closures in FIFO order.
// Thread-safe. The destructor runs what is queued, then joins the workers.
#ifndef ZSHARD_COMMON_BASE_THREAD_POOL_H_
#define ZSHARD_COMMON_BASE_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zshard {

class ThreadPool {
 public:
  // Each worker is named `name` (see NameCurrentThread).
  explicit ThreadPool(int threads, std::string name = "zs-pool");
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `fn`; never blocks.
  void Schedule(std::function<void()> fn);

 private:
  void Work();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_THREAD_POOL_H_
