// Transport: how bulk tensor bytes move between a trainer and a shard
// (DESIGN.md, "Data plane"), modelled on gloo's Device/Pair/Buffer and
// NCCL's net plugin: a process registers memory others may read or write, and
// connects pairs to peers (addressed by opaque bytes exchanged over gRPC) to
// post non-blocking one-sided gets and puts and two-sided messages, each
// completed by a Request that is waited for with a deadline.
//
// Every transport is an object (no global state); several may live in one
// process. Thread-safety: all methods may be called from any thread.
#ifndef ZSHARD_COMMON_TRANSPORT_TRANSPORT_H_
#define ZSHARD_COMMON_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/rpc_authorizer.h"
#include "common/base/rpc_credentials.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace zshard {

// What a peer needs to reach a registered region: its address in the owner's
// memory, its size and the transport's packed access key.
struct RemoteRegion {
  uint64_t address = 0;
  uint64_t size = 0;
  std::string key;
};

// Memory registered with a transport. Deregistered when destroyed; the
// memory itself stays the caller's and must outlive the region.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  // Sent to peers (over gRPC) so they can Get or Put.
  virtual RemoteRegion Describe() const = 0;
};

// One range of a Pair::GetMany: `size` bytes at `offset` of `remote` into
// `local`.
struct GetRange {
  void* local = nullptr;
  size_t size = 0;
  RemoteRegion remote;
  uint64_t offset = 0;
};

// One posted operation. Thread-safe.
class Request {
 public:
  virtual ~Request() = default;
  virtual bool done() const = 0;
  // The outcome once done (OK while pending).
  virtual absl::Status status() const = 0;
};

// A connection to one peer. Operations on a pair that failed (peer gone,
// deadline passed) return UNAVAILABLE from then on.
class Pair {
 public:
  virtual ~Pair() = default;

  // Starts reading `size` bytes at `offset` of the peer's `remote` region
  // into `local`, which must stay valid until the request is done.
  // INVALID_ARGUMENT (nothing posted) when [offset, offset+size) is outside
  // the region or the key is damaged, as far as the transport can tell
  // locally; otherwise the peer's refusal completes the request with it.
  virtual absl::StatusOr<std::shared_ptr<Request>> Get(
      void* local, size_t size, const RemoteRegion& remote,
      uint64_t offset) = 0;
  // Gets of every range in one request stream (inline: one ReadRegion call
  // where Get makes one each): a request per range, in order, each done
  // once its bytes are in (the ranges arrive in order), with the stream's
  // error for the ranges it did not finish. Every range is checked first as
  // Get checks one: INVALID_ARGUMENT, nothing posted. Each `local` must stay
  // valid until its request is done. For transports whose properties() say
  // get_many; the others answer UNIMPLEMENTED and post nothing.
  virtual absl::StatusOr<std::vector<std::shared_ptr<Request>>> GetMany(
      const std::vector<GetRange>& /*ranges*/) {
    return absl::UnimplementedError(
        "this transport has no gets of several ranges in one request");
  }
  // Starts writing `size` bytes from `local` at `offset` of `remote`. Done
  // means the bytes are in the peer's memory (remote completion), so a
  // message sent after it may tell the peer to use them.
  virtual absl::StatusOr<std::shared_ptr<Request>> Put(
      const void* local, size_t size, const RemoteRegion& remote,
      uint64_t offset) = 0;
  // Starts sending a message to the peer's handler for `id`: `header` (small,
  // copied) and `size` bytes of `payload` (valid until done). Done means the
  // payload may be reused, not that the peer processed it.
  virtual absl::StatusOr<std::shared_ptr<Request>> Send(
      uint16_t id, const std::string& header, const void* payload,
      size_t size) = 0;

  // Starts a request to the peer's call handler for `id` (at most 255) with
  // `header` (small: a few KiB; copied): a control message with an answer,
  // without a gRPC round trip. Done once the handler's answer is in `*reply`
  // (which must stay valid until the request is done), or with the
  // handler's error, or UNAVAILABLE when the pair failed first. Wait() bounds
  // it like any other request (the pair is closed on its deadline).
  virtual absl::StatusOr<std::shared_ptr<Request>> Call(
      uint16_t id, const std::string& header, std::string* reply) = 0;

  // Put, then Call once the bytes are in the peer's memory, as one request:
  // done once the answer is in `*reply` (the put's error, the handler's, or
  // UNAVAILABLE otherwise). For transports whose properties() say
  // put_then_call (inline: one WriteRegion stream carries both, one round
  // trip where Put and Call take two); the others answer UNIMPLEMENTED and
  // post nothing. The call should be answered at once: the request may hold
  // one of the transport's threads until it is. Ranges as Put's.
  virtual absl::StatusOr<std::shared_ptr<Request>> PutThenCall(
      const void* /*local*/, size_t /*size*/, const RemoteRegion& /*remote*/,
      uint64_t /*offset*/, uint16_t /*id*/, const std::string& /*header*/,
      std::string* /*reply*/) {
    return absl::UnimplementedError(
        "this transport has no put followed by a call in one request");
  }

  // Blocks until every request is done or `deadline`. On the deadline the
  // pair is closed (its pending operations end with an error before this
  // returns, so their buffers are free again) and DEADLINE_EXCEEDED is
  // returned. Otherwise the first failed request's status (UNAVAILABLE when
  // the peer went away).
  virtual absl::Status Wait(
      const std::vector<std::shared_ptr<Request>>& requests,
      absl::Time deadline) = 0;

  // Gives the pair up: every request in flight ends now with `why` (or
  // another error), and every later operation fails (UNAVAILABLE or `why`).
  // Threads waiting on a peer that stopped answering are free at once
  // instead of at their deadlines. Idempotent; any thread; does not wait
  // for the peer.
  virtual void Abort(const absl::Status& why) = 0;

  // The transport's lanes this pair uses, e.g. "posix/memory cma/memory".
  virtual std::string Lanes() const = 0;
};

// Where memory a transport registers may live.
enum class MemoryKind { kHost, kCuda };

// What a transport can do, declared before use (NCCL's net plugin declares
// its properties the same way): which memory kinds Register and Allocate
// take, and whether Get and Put reach a peer's memory without the peer's CPU
// taking part (RDMA, shared memory) or are served by the peer's threads.
// How a transport that carries its bytes over gRPC (inline) secures them:
// the credentials its pairs call peers with and the check its service runs
// on every call (trainer role). Defaults: plaintext, every call admitted.
// The others ignore it.
struct TransportSecurity {
  std::shared_ptr<const RpcCredentials> channels = RpcCredentials::Plaintext();
  std::shared_ptr<const RpcAuthorizer> auth = RpcAuthorizer::Open();
};

struct TransportProperties {
  std::vector<MemoryKind> memory_kinds;
  bool one_sided = false;
  // Pair::PutThenCall carries a put and a call in one exchange.
  bool put_then_call = false;
  // Pair::GetMany reads several ranges in one exchange.
  bool get_many = false;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string name() const = 0;
  virtual TransportProperties properties() const = 0;
  // A transport that carries its bytes over gRPC (inline) serves them with
  // this service, which the owner registers on its gRPC server before
  // starting it (owned by the transport); null for the others. That server
  // must accept requests of kMaxHostedRequestBytes (a Send's payload rides
  // in one).
  // Caution: a service with gRPC callback methods (the inline one's
  // ReadRegion) makes the server that hosts it "hybrid": gRPC then serves
  // that server's sync methods from non-polling completion queues. When
  // the shard's ShardService lived in such a server, ucx runs (which move no
  // bytes over gRPC) stalled 100-300 ms about every 1.1 s; registering any
  // callback service beside the sync ones brings that back. Inline runs are
  // hybrid today and were measured without stalls; do not add callback
  // methods to a server that serves ucx runs.
  static constexpr int kMaxHostedRequestBytes = 64 << 20;
  virtual grpc::Service* GrpcService() { return nullptr; }
  // The owner's gRPC server that hosts GrpcService() listens at `endpoint`
  // (host:port): peers reach this transport there. Ignored by the others.
  virtual void SetServingEndpoint(const std::string& /*endpoint*/) {}
  // This process's address for peers' Connect (opaque bytes).
  virtual std::string address() const = 0;

  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(
      void* data, size_t size) = 0;
  // Allocates `size` zeroed bytes registered for peers, from the memory the
  // transport serves fastest (UCX: shared memory that peers on the same host
  // map and copy from directly). Owned by the region.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> Allocate(
      size_t size) = 0;
  // Connects to the peer whose address() is `peer`. The pair must be
  // destroyed before the transport.
  virtual absl::StatusOr<std::unique_ptr<Pair>> Connect(
      const std::string& peer) = 0;

  // Called for every message sent with `id` to this process, on the
  // transport's progress thread; `header` and `payload` are valid during the
  // call only. The handler must not block for long.
  using Handler = std::function<void(const std::string& header,
                                     const void* payload, size_t size)>;
  // Set handlers before peers send; ids above 255 are INVALID_ARGUMENT.
  virtual absl::Status SetHandler(uint16_t id, Handler handler) = 0;

  // Answers every Pair::Call made with `id` to this process: its return
  // value is the caller's reply, its error the caller's request's status
  // (code and message). Runs on the transport's progress thread (ucx) or a
  // gRPC thread (inline), possibly several at once; it must not block.
  using CallHandler =
      std::function<absl::StatusOr<std::string>(const std::string& header)>;
  // Set before peers call; ids above 255 are INVALID_ARGUMENT, a second
  // handler for an id ALREADY_EXISTS. Call and message ids are separate.
  // (SetDeferredCallHandler with a handler that answers at once.)
  absl::Status SetCallHandler(uint16_t id, CallHandler handler) {
    return SetDeferredCallHandler(
        id, [handler = std::move(handler)](const std::string& header,
                                           CallAnswer answer) {
          answer(handler(header));
        });
  }

  // The answer to one call a DeferredCallHandler took: the caller's reply
  // (a value) or its request's status (an error). Call it once, from any
  // thread, at once or later; it never blocks for the peer. An answer that
  // comes after the caller gave up (its deadline, its pair closed) or after
  // this transport is destroyed is dropped; one never given leaves the
  // caller to its deadline.
  using CallAnswer = std::function<void(absl::StatusOr<std::string>)>;
  // Takes every Pair::Call made with `id` to this process, where a
  // CallHandler would run (it must not block either), for calls that may
  // have to wait for something (a lease of a version not yet published): it
  // answers at once or hands `answer` to a thread of its own that waits.
  // Ids as SetCallHandler's, which shares their space.
  using DeferredCallHandler =
      std::function<void(const std::string& header, CallAnswer answer)>;
  virtual absl::Status SetDeferredCallHandler(uint16_t id,
                                              DeferredCallHandler handler) = 0;
};

// What the transports of one process share (gloo's Device; UCX: one UCP
// context, with a worker and progress thread per transport made from it).
// Thread-safe. Transports made from a context keep it alive; so do their
// regions.
class TransportContext {
 public:
  virtual ~TransportContext() = default;
  // "ucx" or "inline".
  virtual std::string name() const = 0;
  // A new transport on this context; `label` names its side in errors.
  virtual absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(
      const std::string& label) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_TRANSPORT_H_
