#include "server/coordinator/coordinator_channel.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zshard {

CoordinatorChannel::CoordinatorChannel(
    std::shared_ptr<const RpcCredentials> peers, const std::string& endpoint)
    : peers_(std::move(peers)) {
  Advance(0, endpoint);
}

std::string CoordinatorChannel::endpoint() const {
  absl::MutexLock lock(&mu_);
  return endpoint_;
}

std::shared_ptr<v1::Coordinator::Stub> CoordinatorChannel::stub() const {
  absl::MutexLock lock(&mu_);
  return stub_;
}

uint64_t CoordinatorChannel::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

void CoordinatorChannel::Advance(uint64_t epoch, const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  epoch_ = std::max(epoch_, epoch);
  if (endpoint.empty() || endpoint == endpoint_) return;
  endpoint_ = endpoint;
  stub_ = v1::Coordinator::NewStub(peers_->Channel(endpoint));
}

absl::Status CoordinatorChannel::CheckCaller(uint64_t epoch,
                                             const char* method) const {
  absl::MutexLock lock(&mu_);
  if (epoch >= epoch_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      method, ": the calling coordinator is of epoch ", epoch,
      " but this shard is at epoch ", epoch_, " with the coordinator at ",
      endpoint_, " (the caller was replaced)"));
}

}  // namespace zshard
