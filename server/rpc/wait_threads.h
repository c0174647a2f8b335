// WaitThreads: where a shard waits for the transport calls it answers later
// (Transport::SetDeferredCallHandler: a lease of a version not yet
// published, a landing slot while the pool is full). Each wait runs on a
// thread of its own, so none queues behind another (a lease waits for a
// version that a reservation queued behind it would let through); threads
// are reused once idle, and at most `max_threads` exist.
//
// Thread-safety: every method may be called from any thread, but not from a
// wait (Stop joins them).
#ifndef ZSHARD_SERVER_RPC_WAIT_THREADS_H_
#define ZSHARD_SERVER_RPC_WAIT_THREADS_H_

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace zshard {

class WaitThreads {
 public:
  // A wait: it polls `cancelled` (true once Stop was called) as the shard's
  // store waits do, and answers its call itself.
  using Wait = std::function<void(const std::function<bool()>& cancelled)>;

  explicit WaitThreads(size_t max_threads) : max_threads_(max_threads) {}
  ~WaitThreads() { Stop(); }
  WaitThreads(const WaitThreads&) = delete;
  WaitThreads& operator=(const WaitThreads&) = delete;

  // Starts `wait` on an idle thread or a new one; never blocks. Nothing is
  // run on an error: RESOURCE_EXHAUSTED when max_threads waits run already,
  // UNAVAILABLE once stopping.
  absl::Status Run(Wait wait);

  // Cancels every wait (they end within their store's cancel poll), runs
  // the ones still queued (cancelled at once) and joins the threads.
  // Idempotent.
  void Stop();

  // Threads made so far (each one idle or waiting).
  size_t threads() const;

 private:
  void Work();

  const size_t max_threads_;
  std::atomic<bool> stopping_{false};
  mutable absl::Mutex mu_;
  std::deque<Wait> queue_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_RPC_WAIT_THREADS_H_
