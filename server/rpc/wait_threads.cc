#include "server/rpc/wait_threads.h"

#include "absl/strings/str_cat.h"
#include "common/base/thread_name.h"

namespace zshard {

absl::Status WaitThreads::Run(Wait wait) {
  absl::MutexLock lock(&mu_);
  if (stopping_.load()) {
    return absl::UnavailableError("the shard is stopping: no new waits");
  }
  if (queue_.size() + running_ >= threads_.size()) {
    if (threads_.size() >= max_threads_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the shard already waits for ", max_threads_,
                       " transport calls (leases and landing slots)"));
    }
    threads_.emplace_back([this] {
      NameCurrentThread("zs-rpc-wait");
      Work();
    });
  }
  queue_.push_back(std::move(wait));
  return absl::OkStatus();
}

void WaitThreads::Work() {
  const std::function<bool()> cancelled = [this] { return stopping_.load(); };
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !queue_.empty() || stopping_.load();
    };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) return;  // stopping, nothing left to run
    Wait wait = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    mu_.Unlock();
    wait(cancelled);
    mu_.Lock();
    --running_;
  }
}

void WaitThreads::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

size_t WaitThreads::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

}  // namespace zshard
