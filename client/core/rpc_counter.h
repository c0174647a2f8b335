// RpcCounter: counts the gRPC calls a trainer's control channels start, by
// method ("Lease", "Landed", ...), so the control plane's cost per step can
// be measured (issue 19, "Control plane at scale"). The channels take it as
// a client interceptor factory (Factory); counting takes a short lock and a
// map update per call (well under a microsecond, against tens of them for
// the call itself) and intercepts nothing. Thread-safe; outlives every channel made with
// its factory (the factory holds a reference).
#ifndef ZSHARD_CLIENT_CORE_RPC_COUNTER_H_
#define ZSHARD_CLIENT_CORE_RPC_COUNTER_H_

#include <grpcpp/support/client_interceptor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zshard {

class RpcCounter : public std::enable_shared_from_this<RpcCounter> {
 public:
  static std::shared_ptr<RpcCounter> Create();
  RpcCounter(const RpcCounter&) = delete;
  RpcCounter& operator=(const RpcCounter&) = delete;

  // A factory for one channel's interceptors; it keeps this counter alive.
  std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
  Factory();

  // Calls started so far, by method name without the service
  // ("/zshard.v1.ShardService/Lease" counts as "Lease").
  std::map<std::string, uint64_t> Counts() const;
  // Every call started so far.
  uint64_t Total() const;

  // The calls the factory's interceptors report (public for them).
  void Count(const char* method);

 private:
  RpcCounter() = default;
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_RPC_COUNTER_H_
