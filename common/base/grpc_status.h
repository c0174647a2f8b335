// One-to-one mapping between absl::Status and grpc::Status (the canonical
// codes are numerically identical).
#ifndef ZSHARD_COMMON_BASE_GRPC_STATUS_H_
#define ZSHARD_COMMON_BASE_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace zshard {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_GRPC_STATUS_H_
