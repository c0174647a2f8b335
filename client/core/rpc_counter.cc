#include "client/core/rpc_counter.h"

#include <cstring>

namespace zshard {
namespace {

class CountingFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit CountingFactory(std::shared_ptr<RpcCounter> counter)
      : counter_(std::move(counter)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    counter_->Count(info->method());
    return nullptr;  // counted; nothing to intercept
  }

 private:
  const std::shared_ptr<RpcCounter> counter_;
};

}  // namespace

std::shared_ptr<RpcCounter> RpcCounter::Create() {
  return std::shared_ptr<RpcCounter>(new RpcCounter());
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
RpcCounter::Factory() {
  return std::make_unique<CountingFactory>(shared_from_this());
}

void RpcCounter::Count(const char* method) {
  const char* name = method == nullptr ? "" : method;
  if (const char* slash = std::strrchr(name, '/')) name = slash + 1;
  absl::MutexLock lock(&mu_);
  ++counts_[name];
  ++total_;
}

std::map<std::string, uint64_t> RpcCounter::Counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

uint64_t RpcCounter::Total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace zshard
