// Creates the data plane transport named on the command line.
#ifndef ZSHARD_COMMON_TRANSPORT_FACTORY_H_
#define ZSHARD_COMMON_TRANSPORT_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport.h"

namespace zshard {

// "ucx" when this build has UCX, else "inline".
std::string DefaultTransportName();

// "ucx" or "inline" (INVALID_ARGUMENT otherwise; UNIMPLEMENTED for "ucx" in
// a build without UCX). `label` names this side in errors.
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                           const std::string& label);

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_FACTORY_H_
