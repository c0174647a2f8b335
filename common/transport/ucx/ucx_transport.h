// UcxTransport: the Transport over UCP (UCX 1.13). One UCP context per
// TransportContext (one per process: a trainer makes a transport per shard
// from one context), one multi-threaded worker per transport, driven by a
// progress thread that sleeps
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

// A UCP context from which any number of transports (each its own worker
// and progress thread) are made. UNAVAILABLE when UCX cannot start (no
// usable transport, bad UCX_TLS).
absl::StatusOr<std::shared_ptr<TransportContext>> CreateUcxContext();

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_UCX_UCX_TRANSPORT_H_
