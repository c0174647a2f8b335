#include "common/base/thread_pool.h"

#include "common/base/thread_name.h"

namespace zshard {

ThreadPool::ThreadPool(int threads, std::string name) {
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([this, name] {
      NameCurrentThread(name);
      Work();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

void ThreadPool::Work() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace zshard
