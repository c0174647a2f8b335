// What `zshardctl tensor` does: one tensor's current values, read over RPC
// from the shards that hold parts of it (AdminService.ReadValues, at most
// ShardStore's per-call limit each) and consolidated, with statistics.
#ifndef ZSHARD_CLIENT_CTL_TENSOR_READ_H_
#define ZSHARD_CLIENT_CTL_TENSOR_READ_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/rpc_credentials.h"

namespace zshard {

struct TensorReadOptions {
  std::string server;  // shard 0, host:port
  std::string name;    // the tensor, as in the model spec
  // Element range [begin, end) of the tensor's flat values; end 0: to the
  // end.
  uint64_t begin = 0;
  uint64_t end = 0;
  // The version (step) to read; 0: the newest all shards hold.
  uint64_t step = 0;
  bool bf16 = false;  // read the shards' bf16 copy
  absl::Duration timeout = absl::Seconds(10);
  std::shared_ptr<const RpcCredentials> credentials;
};

struct TensorValues {
  std::string name;
  std::vector<int64_t> shape;
  uint32_t group = 0;
  uint64_t version = 0;
  uint64_t begin = 0, end = 0;  // the range read
  std::vector<float> values;    // bf16 widened exactly
  // Statistics of the finite values, and the non-finite counts.
  double min = 0, max = 0, mean = 0, norm = 0;
  uint64_t nan = 0, inf = 0;
};

// NOT_FOUND naming the tensor (and listing a few that exist); OUT_OF_RANGE
// for a range beyond the tensor; FAILED_PRECONDITION for a step no shard
// holds any more; UNAVAILABLE naming an unreachable shard.
absl::StatusOr<TensorValues> ReadTensor(const TensorReadOptions& options);

// Parses --range "A:B" (either side may be empty: 0 and the end).
absl::Status ParseRange(const std::string& text, uint64_t* begin,
                        uint64_t* end);

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CTL_TENSOR_READ_H_
