// CoordinatorChannel: where a shard reaches the coordinator, and the
// membership epoch it knows (DESIGN.md, "Coordinator and membership").
// Shards > 0 start with --coordinator; a replacement of shard 0 moves every
// shard to its own endpoint with a newer epoch (RollBack), and a shard then
// refuses the calls of a coordinator of an older epoch (a stopped shard 0
// that comes back). On shard 0 the endpoint is its own and calls go to the
// coordinator in process.
//
// Thread-safe; nothing blocks.
#ifndef ZSHARD_SERVER_COORDINATOR_COORDINATOR_CHANNEL_H_
#define ZSHARD_SERVER_COORDINATOR_COORDINATOR_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/base/rpc_credentials.h"
#include "zshard/v1/coordinator.grpc.pb.h"

namespace zshard {

class CoordinatorChannel {
 public:
  // `endpoint` may be empty (shard 0 until it is bound).
  CoordinatorChannel(std::shared_ptr<const RpcCredentials> peers,
                     const std::string& endpoint);

  std::string endpoint() const;
  // A stub for the current endpoint (null while there is none); it stays
  // usable after the endpoint moves.
  std::shared_ptr<v1::Coordinator::Stub> stub() const;
  uint64_t epoch() const;

  // Moves to `epoch` (never back) and, when `endpoint` is not empty and
  // differs, to the coordinator there.
  void Advance(uint64_t epoch, const std::string& endpoint = "");

  // A coordinator's call carrying `epoch`: OK when it is not older than
  // this shard's; FAILED_PRECONDITION naming the coordinator that took over
  // otherwise.
  absl::Status CheckCaller(uint64_t epoch, const char* method) const;

 private:
  const std::shared_ptr<const RpcCredentials> peers_;
  mutable absl::Mutex mu_;
  std::string endpoint_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<v1::Coordinator::Stub> stub_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_COORDINATOR_COORDINATOR_CHANNEL_H_
