// InlineTransport: the Transport whose bytes travel inside gRPC messages
// (the ReadRegion / WriteRegion / SendMessage RPCs of zshard.v1.ShardService).
// It works everywhere gRPC does and costs the serving process's CPU and
// copies; UcxTransport is the fast one.
//
// A serving process registers memory here and its gRPC service hands the
// three RPCs to PinRange (ReadRegion, see inline_read_stream.h) / ServeWrite
// (WriteRegion, see inline_write_stream.h) / Deliver, which check the region
// id, its access token and the byte range (INVALID_ARGUMENT, nothing read or
// written otherwise). A client Connects to the server's gRPC endpoint.
//
// Thread-safe. Regions must be destroyed before the transport; a Pin may
// outlive both.
#ifndef ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_TRANSPORT_H_
#define ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_TRANSPORT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/transport.h"

namespace zshard {

class InlineTransportService;
class ThreadPool;

class InlineTransport : public Transport {
 public:
  // Data bytes per ReadRegion / WriteRegion message, both ways (below gRPC's
  // default 4 MiB receive limit).
  static constexpr size_t kMessageBytes = 3 << 20;
  // Ranges one ReadRegion call may read (the first and its `more`).
  static constexpr size_t kMaxReadRanges = 4097;

  // `label` names this side in errors; `threads` carry clients' transfers;
  // `security`: how pairs call peers and what the service admits.
  explicit InlineTransport(std::string label, int threads = 4,
                           TransportSecurity security = {});
  ~InlineTransport() override;

  // The gRPC endpoint ("host:port") whose server hosts GrpcService().
  void SetServingEndpoint(const std::string& endpoint) override;
  // The InlineTransport service (inline_transport_service.h) serving this
  // process's regions and messages.
  grpc::Service* GrpcService() override;

  std::string name() const override { return "inline"; }
  // Host memory; gets and puts are served by the owner's gRPC handlers; a
  // put and the call after it go in one WriteRegion stream, several ranges'
  // gets in one ReadRegion stream.
  TransportProperties properties() const override {
    return {{MemoryKind::kHost}, false, true, true};
  }
  std::string address() const override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data,
                                                         size_t size) override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Allocate(size_t size) override;
  absl::StatusOr<std::unique_ptr<Pair>> Connect(
      const std::string& peer) override;
  absl::Status SetHandler(uint16_t id, Handler handler) override;
  absl::Status SetDeferredCallHandler(uint16_t id,
                                      DeferredCallHandler handler) override;

  // Server side (called by the gRPC service).
  //
  // Bytes of a registered region that stay valid while the Pin lives, so
  // gRPC can send them without a copy: destroying the region waits for its
  // pins (up to 30 s; past that an Allocate'd region's memory is leaked,
  // never freed under a reader). Pins are cheap and thread-safe.
  class Pin {
   public:
    ~Pin();
    const char* data() const { return data_; }
    size_t size() const { return size_; }

   private:
    friend class InlineTransport;
    struct Count;
    Pin(const char* data, size_t size, std::shared_ptr<Count> count)
        : data_(data), size_(size), count_(std::move(count)) {}
    const char* const data_;
    const size_t size_;
    const std::shared_ptr<Count> count_;
  };
  absl::StatusOr<std::shared_ptr<const Pin>> PinRange(uint64_t id,
                                                      const std::string& key,
                                                      uint64_t offset,
                                                      uint64_t size);
  // Checks the region, key and range [offset, offset + size), then calls
  // `fill` with the destination to copy the `size` bytes into (under the
  // region table's shared lock, so the region stays registered meanwhile);
  // `fill` is not called on an error.
  absl::Status ServeWrite(uint64_t id, const std::string& key, uint64_t offset,
                          uint64_t size, absl::FunctionRef<void(char*)> fill);
  absl::Status Deliver(uint32_t id, const std::string& header,
                       const std::string& payload);
  // Hands a Pair::Call's `header` to the call handler for `id`, with `done`
  // as its CallAnswer: called on the thread that answers (maybe this one,
  // before Answer returns), as often as the handler calls it (once, by
  // contract; the service's reactor keeps only the first). INVALID_ARGUMENT,
  // and `done` is not called, when no handler is set for `id`. Never blocks.
  absl::Status Answer(uint32_t id, const std::string& header,
                      std::function<void(absl::StatusOr<std::string>)> done);

  // Requests this transport's service took, by kind (thread-safe; for
  // tests and stats): ReadRegion and WriteRegion streams, the WriteRegion
  // streams whose last chunk carried a call (Pair::PutThenCall), and
  // SendMessage calls (messages and transport calls).
  struct Served {
    uint64_t read_region = 0;
    uint64_t write_region = 0;
    uint64_t write_region_calls = 0;
    uint64_t send_message = 0;
  };
  Served served() const;
  // Counts one request of a kind (the service's).
  void CountReadRegion() { ++read_region_; }
  void CountWriteRegion() { ++write_region_; }
  void CountWriteRegionCall() { ++write_region_calls_; }
  void CountSendMessage() { ++send_message_; }

  ThreadPool& pool() { return *pool_; }
  const TransportSecurity& security() const { return security_; }
  const std::string& label() const { return label_; }

 private:
  class Region;
  friend class Region;
  struct Entry {
    char* data;
    size_t size;
    std::string key;
    std::shared_ptr<Pin::Count> pins;
  };
  // Registers `data` (owned by the region when `owned` is set).
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Add(
      void* data, size_t size, std::unique_ptr<char[]> owned);
  // Looks up a region, checking its key and the range.
  absl::StatusOr<Entry> Find(uint64_t id, const std::string& key,
                             uint64_t offset, uint64_t size) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string label_;
  const TransportSecurity security_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<InlineTransportService> service_;
  std::atomic<uint64_t> read_region_{0}, write_region_{0},
      write_region_calls_{0}, send_message_{0};
  // Writers hold it shared while they copy into a region; deregistration
  // takes it exclusively, so a region never goes away under a transfer
  // (readers hold Pins instead).
  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> regions_ ABSL_GUARDED_BY(mu_);
  std::map<uint16_t, Handler> handlers_ ABSL_GUARDED_BY(mu_);
  std::map<uint16_t, DeferredCallHandler> call_handlers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_TRANSPORT_H_
