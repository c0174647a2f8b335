// Creates the data plane transport named on the command line.
#ifndef ZSHARD_COMMON_TRANSPORT_TRANSPORT_FACTORY_H_
#define ZSHARD_COMMON_TRANSPORT_TRANSPORT_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"

namespace zshard {

// "ucx" when this build has UCX, else "inline".
std::string DefaultTransportName();

// Process-wide transport settings zshard's binaries want (UCX: 512 KiB tcp
// segments, several times faster for megabyte tensors, unless
// UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE are set; SIGHUP back to its
// default unless UCX_DEBUG_SIGNO is set). UCX reads them only
// from the environment, so this sets environment variables: call it from
// main before any transport exists and before other threads start.
// Libraries never call it.
void SetTransportProcessDefaults();

// The shared part of the transports named "ucx" or "inline"
// (INVALID_ARGUMENT otherwise; UNIMPLEMENTED for "ucx" in a build without
// UCX; UNAVAILABLE when UCX cannot start). A process makes one and every
// transport from it.
// `security` reaches the inline transports made from the context.
absl::StatusOr<std::shared_ptr<TransportContext>> CreateTransportContext(
    const std::string& name, const TransportSecurity& security = {});

// One transport on a context of its own (a process that needs only one):
// CreateTransportContext(name), then its CreateTransport(label).
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(
    const std::string& name, const std::string& label,
    const TransportSecurity& security = {});

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_TRANSPORT_FACTORY_H_
