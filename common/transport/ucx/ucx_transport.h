// UcxTransport: the Transport over UCP (UCX 1.13). One UCP context and one
// multi-threaded worker per object, driven by a progress thread that sleeps
// on the worker's event descriptor when idle (no busy polling). Peers connect
// by worker address (exchanged over gRPC), so no listener and no tcp lane are
// needed: on one machine UCX picks shared memory (posix/sysv/cma); across
// machines RDMA or tcp. The user's UCX_TLS and UCX_NET_DEVICES are honoured
// (UCX reads them). Gets and puts use remote keys packed by Register; the
// keys handed out are framed and checksummed so a damaged one is refused
// instead of parsed.
//
// Destroy pairs and memory regions before the transport.
#ifndef ZSHARD_COMMON_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define ZSHARD_COMMON_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"

namespace zshard {

struct UcxTransportOptions {
  // Name in errors and logs ("shard 2", "trainer 0").
  std::string label = "ucx";
};

// UNAVAILABLE when UCX cannot start (no usable transport, bad UCX_TLS).
absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(
    const UcxTransportOptions& options);

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_UCX_UCX_TRANSPORT_H_
