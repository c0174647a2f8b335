#include "common/transport/inline/inline_transport.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <iostream>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/transport/inline/inline_transport_service.h"
#include "common/transport/inline/region_bytes_sink.h"
#include "common/transport/inline/region_write_chunk.h"
#include "zshard/v1/inline_transport.grpc.pb.h"

namespace zshard {
namespace {

constexpr absl::Duration kMaxTransfer = absl::Minutes(10);

std::string RandomKey() {
  std::random_device rd;
  std::string key(16, '\0');
  for (char& c : key) c = static_cast<char>(rd());
  return key;
}

// One request; the requests of a GetMany share their stream's context.
class InlineRequest : public Request {
 public:
  InlineRequest() : ctx_(std::make_shared<grpc::ClientContext>()) {}
  explicit InlineRequest(std::shared_ptr<grpc::ClientContext> ctx)
      : ctx_(std::move(ctx)) {}

  bool done() const override {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  void Finish(absl::Status st) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(st);
    done_ = true;
  }
  bool WaitUntil(absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
  }
  grpc::ClientContext* context() { return ctx_.get(); }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<grpc::ClientContext> ctx_;
};

// The pair's channel: each stream may run 8 MiB ahead of its reader, fixed
// (gRPC's BDP probing grows the window too slowly for one 16 MiB read: ~15%
// less bandwidth in transport_bench). At most 8 MiB per running read is
// buffered here.
grpc::ChannelArguments PairChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return args;
}

class InlinePair : public Pair {
 public:
  InlinePair(InlineTransport* t, std::string peer)
      : t_(t),
        peer_(std::move(peer)),
        channel_(t->security().channels->Channel(peer_, PairChannelArgs())),
        stub_(v1::InlineTransport::NewStub(channel_)),
        read_method_name_(absl::StrCat(
            "/", v1::InlineTransport::service_full_name(), "/ReadRegion")),
        read_method_(read_method_name_.c_str(),
                     grpc::internal::RpcMethod::SERVER_STREAMING, channel_),
        write_method_name_(absl::StrCat(
            "/", v1::InlineTransport::service_full_name(), "/WriteRegion")),
        write_method_(write_method_name_.c_str(),
                      grpc::internal::RpcMethod::CLIENT_STREAMING, channel_),
        send_pool_(SendBufferPool::Create(InlineTransport::kMessageBytes)) {}

  ~InlinePair() override {
    // Transfers still running hold `this`: wait for them.
    absl::MutexLock lock(&mu_);
    auto idle = [this]()
                    ABSL_NO_THREAD_SAFETY_ANALYSIS { return running_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }

  // A GetMany of one range: one ReadRegion stream.
  absl::StatusOr<std::shared_ptr<Request>> Get(void* local, size_t size,
                                               const RemoteRegion& remote,
                                               uint64_t offset) override {
    ZS_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Request>> one,
                        GetMany({GetRange{local, size, remote, offset}}));
    return one.front();
  }

  absl::StatusOr<std::vector<std::shared_ptr<Request>>> GetMany(
      const std::vector<GetRange>& ranges) override {
    for (const GetRange& r : ranges) {
      ZS_RETURN_IF_ERROR(CheckRange(r.remote, r.offset, r.size));
    }
    if (ranges.size() > InlineTransport::kMaxReadRanges) {
      return absl::InvalidArgumentError(
          absl::StrCat(ranges.size(), " ranges in one GetMany (at most ",
                       InlineTransport::kMaxReadRanges, ")"));
    }
    if (ranges.empty()) return std::vector<std::shared_ptr<Request>>();
    auto ctx = std::make_shared<grpc::ClientContext>();
    std::vector<std::shared_ptr<InlineRequest>> requests;
    for (size_t i = 0; i < ranges.size(); ++i) {
      requests.push_back(std::make_shared<InlineRequest>(ctx));
    }
    ZS_RETURN_IF_ERROR(BeginAll(requests));
    t_->pool().Schedule(
        [this, requests, ranges] { ReadRanges(requests, ranges); });
    return std::vector<std::shared_ptr<Request>>(requests.begin(),
                                                 requests.end());
  }

  absl::StatusOr<std::shared_ptr<Request>> Put(const void* local, size_t size,
                                               const RemoteRegion& remote,
                                               uint64_t offset) override {
    if (absl::Status st = CheckRange(remote, offset, size); !st.ok()) return st;
    return Start([=](InlineRequest* r) {
      return Write(r, local, size, remote, offset, nullptr, nullptr);
    });
  }

  absl::StatusOr<std::shared_ptr<Request>> PutThenCall(
      const void* local, size_t size, const RemoteRegion& remote,
      uint64_t offset, uint16_t id, const std::string& header,
      std::string* reply) override {
    if (absl::Status st = CheckRange(remote, offset, size); !st.ok()) return st;
    if (id > 255)
      return absl::InvalidArgumentError(absl::StrCat("call id ", id, " > 255"));
    auto call = std::make_shared<CallPart>(CallPart{id, header});
    return Start([=](InlineRequest* r) {
      return Write(r, local, size, remote, offset, call.get(), reply);
    });
  }

  absl::StatusOr<std::shared_ptr<Request>> Send(uint16_t id,
                                                const std::string& header,
                                                const void* payload,
                                                size_t size) override {
    if (id > 255)
      return absl::InvalidArgumentError(
          absl::StrCat("message id ", id, " > 255"));
    auto message = std::make_shared<v1::TransportMessage>();
    message->set_id(id);
    message->set_header(header);
    message->set_payload(payload, size);  // copied: the payload is free at once
    return Start([this, message](InlineRequest* r) {
      v1::TransportMessageResponse resp;
      return FromGrpcStatus(stub_->SendMessage(r->context(), *message, &resp));
    });
  }

  absl::StatusOr<std::shared_ptr<Request>> Call(uint16_t id,
                                                const std::string& header,
                                                std::string* reply) override {
    if (id > 255)
      return absl::InvalidArgumentError(absl::StrCat("call id ", id, " > 255"));
    // gRPC's callback API: an answer that waits (a deferred call) holds no
    // thread of the pool, which the transfers it may wait for need.
    struct Call {
      v1::TransportMessage message;
      v1::TransportMessageResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->message.set_id(id);
    call->message.set_header(header);
    call->message.set_call(true);
    ZS_ASSIGN_OR_RETURN(std::shared_ptr<InlineRequest> request, Begin());
    stub_->async()->SendMessage(
        request->context(), &call->message, &call->resp,
        [this, call, request, reply](grpc::Status status) {
          absl::Status st = FromGrpcStatus(status);
          if (st.ok()) *reply = std::move(*call->resp.mutable_reply());
          End(request.get(), std::move(st));
        });
    return std::shared_ptr<Request>(request);
  }

  void Abort(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return;
    aborted_ = why.ok() ? absl::CancelledError("pair given up") : why;
    for (InlineRequest* r : live_) r->context()->TryCancel();
  }

  absl::Status Wait(const std::vector<std::shared_ptr<Request>>& requests,
                    absl::Time deadline) override {
    bool timed_out = false;
    for (const auto& r : requests) {
      if (!static_cast<InlineRequest*>(r.get())->WaitUntil(deadline)) {
        timed_out = true;
        break;
      }
    }
    if (timed_out) {
      for (const auto& r : requests)
        static_cast<InlineRequest*>(r.get())->context()->TryCancel();
      for (const auto& r : requests)
        static_cast<InlineRequest*>(r.get())->WaitUntil(absl::InfiniteFuture());
      return absl::DeadlineExceededError(
          absl::StrCat(t_->label(), ": transfer with ", peer_,
                       " not finished by the deadline"));
    }
    for (const auto& r : requests) {
      absl::Status st = r->status();
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  std::string Lanes() const override { return "grpc"; }

 private:
  // The call a PutThenCall's last chunk carries.
  struct CallPart {
    uint16_t id;
    std::string header;
  };

  // One WriteRegion stream on r's context: `size` bytes from `local` at
  // `offset` of `remote`, in chunks of kMessageBytes (at least one), the
  // last carrying `call` when given, whose answer goes to `*reply`. Blocks
  // the calling thread (a pool's) until the peer answered.
  absl::Status Write(InlineRequest* r, const void* local, size_t size,
                     const RemoteRegion& remote, uint64_t offset,
                     const CallPart* call, std::string* reply) {
    v1::WriteRegionResponse resp;
    std::unique_ptr<grpc::ClientWriter<RegionWriteChunk>> writer(
        grpc::internal::ClientWriterFactory<RegionWriteChunk>::Create(
            channel_.get(), write_method_, r->context(), &resp));
    RegionWriteChunk chunk;
    chunk.region = remote.address;
    chunk.key = remote.key;
    size_t sent = 0;
    do {
      const size_t n = std::min(InlineTransport::kMessageBytes, size - sent);
      chunk.offset = offset + sent;
      chunk.data = send_pool_->Copy(static_cast<const char*>(local) + sent, n);
      if (call && sent + n == size) {
        chunk.call = true;
        chunk.call_id = call->id;
        chunk.call_header = call->header;
      }
      if (!writer->Write(chunk)) break;
      sent += n;
    } while (sent < size);
    chunk.data = grpc::Slice();
    writer->WritesDone();
    ZS_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
    if (resp.bytes_written() != size) {
      return absl::DataLossError(absl::StrCat(
          peer_, " wrote ", resp.bytes_written(), " of ", size, " bytes"));
    }
    if (reply) *reply = std::move(*resp.mutable_reply());
    return absl::OkStatus();
  }

  static absl::Status CheckRange(const RemoteRegion& remote, uint64_t offset,
                                 size_t size) {
    if (offset > remote.size || size > remote.size - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bytes [", offset, ", ", offset + size,
          ") are outside the remote region of ", remote.size, " bytes"));
    }
    return absl::OkStatus();
  }

  // A new request, counted as running (the pair's destructor waits for
  // it) until End; the pair's error once aborted.
  absl::StatusOr<std::shared_ptr<InlineRequest>> Begin() {
    auto request = std::make_shared<InlineRequest>();
    ZS_RETURN_IF_ERROR(BeginAll({request}));
    return request;
  }

  // Counts `requests` (sharing one context) as running, as Begin.
  absl::Status BeginAll(
      const std::vector<std::shared_ptr<InlineRequest>>& requests) {
    // Wait() cancels at its own deadline; this bounds a request nobody waits
    // for, so the pair's destructor never waits without end.
    requests.front()->context()->set_deadline(
        absl::ToChronoTime(absl::Now() + kMaxTransfer));
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return aborted_;
    running_ += static_cast<int>(requests.size());
    for (const auto& r : requests) live_.insert(r.get());
    return absl::OkStatus();
  }

  // GetMany's stream, on a pool thread: request i is ended as soon as range
  // i's bytes are in (once the peer has answered at all: it checks every
  // range before sending), the rest with the stream's outcome.
  void ReadRanges(const std::vector<std::shared_ptr<InlineRequest>>& requests,
                  const std::vector<GetRange>& ranges) {
    v1::ReadRegionRequest req;
    req.set_region(ranges[0].remote.address);
    req.set_key(ranges[0].remote.key);
    req.set_offset(ranges[0].offset);
    req.set_size(ranges[0].size);
    RegionBytesSink sink;
    std::vector<size_t> ends;
    size_t total = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const GetRange& r = ranges[i];
      if (i > 0) {
        v1::RegionRange* more = req.add_more();
        more->set_region(r.remote.address);
        more->set_key(r.remote.key);
        more->set_offset(r.offset);
        more->set_size(r.size);
      }
      sink.spans.push_back({static_cast<char*>(r.local), r.size});
      ends.push_back(total += r.size);
    }
    grpc::ClientContext* ctx = requests.front()->context();
    std::unique_ptr<grpc::ClientReader<RegionBytesSink>> reader(
        grpc::internal::ClientReaderFactory<RegionBytesSink>::Create(
            channel_.get(), read_method_, ctx, req));
    size_t ended = 0;
    while (reader->Read(&sink)) {
      for (; ended < ranges.size() && sink.received >= ends[ended]; ++ended) {
        End(requests[ended].get(), absl::OkStatus());
      }
    }
    if (!sink.error.ok()) ctx->TryCancel();
    absl::Status st = FromGrpcStatus(reader->Finish());
    if (!sink.error.ok()) {
      st = absl::DataLossError(absl::StrCat(peer_, ": ", sink.error.message()));
    } else if (st.ok() && sink.received != total) {
      st = absl::DataLossError(absl::StrCat(peer_, " sent ", sink.received,
                                            " of ", total, " bytes"));
    }
    for (; ended < ranges.size(); ++ended) End(requests[ended].get(), st);
  }

  // Finishes a request Begin made with `st` (or the pair's abort).
  void End(InlineRequest* request, absl::Status st) {
    absl::MutexLock lock(&mu_);
    live_.erase(request);
    request->Finish(aborted_.ok() ? std::move(st) : aborted_);
    --running_;
  }

  absl::StatusOr<std::shared_ptr<Request>> Start(
      std::function<absl::Status(InlineRequest*)> body) {
    ZS_ASSIGN_OR_RETURN(std::shared_ptr<InlineRequest> request, Begin());
    t_->pool().Schedule([this, request, body = std::move(body)] {
      End(request.get(), body(request.get()));
    });
    return std::shared_ptr<Request>(request);
  }

  InlineTransport* const t_;
  const std::string peer_;
  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::InlineTransport::Stub> stub_;
  // ReadRegion read with RegionBytesSink: bytes land in the caller's buffer
  // straight from gRPC's receive slices.
  const std::string read_method_name_;
  const grpc::internal::RpcMethod read_method_;
  // WriteRegion sent as RegionWriteChunk: one copy of the caller's bytes into
  // a pooled buffer per message.
  const std::string write_method_name_;
  const grpc::internal::RpcMethod write_method_;
  const std::shared_ptr<SendBufferPool> send_pool_;
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<InlineRequest*> live_ ABSL_GUARDED_BY(mu_);  // running
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);           // set by Abort
};

}  // namespace

struct InlineTransport::Pin::Count {
  absl::Mutex mu;
  int pins ABSL_GUARDED_BY(mu) = 0;
};

InlineTransport::Pin::~Pin() {
  absl::MutexLock lock(&count_->mu);
  --count_->pins;
}

class InlineTransport::Region : public MemoryRegion {
 public:
  Region(InlineTransport* t, uint64_t id, void* data, size_t size,
         std::string key, std::shared_ptr<Pin::Count> pins,
         std::unique_ptr<char[]> owned)
      : t_(t),
        id_(id),
        data_(data),
        size_(size),
        key_(std::move(key)),
        pins_(std::move(pins)),
        owned_(std::move(owned)) {}
  ~Region() override {
    {
      absl::MutexLock lock(&t_->mu_);
      t_->regions_.erase(id_);  // no new pins from here on
    }
    absl::MutexLock lock(&pins_->mu);
    auto unpinned = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return pins_->pins == 0;
    };
    if (!pins_->mu.AwaitWithTimeout(absl::Condition(&unpinned), kPinWait)) {
      std::cerr
          << t_->label() << ": region " << id_ << " still has " << pins_->pins
          << " reads in gRPC's hands after " << absl::FormatDuration(kPinWait)
          << (owned_ ? "; its memory is leaked rather than freed under them\n"
                     : "; the registered memory goes away under them\n");
      (void)owned_.release();
    }
  }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  RemoteRegion Describe() const override {
    return RemoteRegion{id_, size_, key_};
  }

 private:
  static constexpr absl::Duration kPinWait = absl::Seconds(30);
  InlineTransport* const t_;
  const uint64_t id_;
  void* const data_;
  const size_t size_;
  const std::string key_;
  const std::shared_ptr<Pin::Count> pins_;
  std::unique_ptr<char[]> owned_;
};

InlineTransport::InlineTransport(std::string label, int threads,
                                 TransportSecurity security)
    : label_(std::move(label)),
      security_(std::move(security)),
      pool_(std::make_unique<ThreadPool>(threads, "zs-inline")),
      service_(std::make_unique<InlineTransportService>(this)) {}

InlineTransport::~InlineTransport() { pool_.reset(); }

void InlineTransport::SetServingEndpoint(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  address_ = endpoint;
}

grpc::Service* InlineTransport::GrpcService() { return service_.get(); }

InlineTransport::Served InlineTransport::served() const {
  Served s;
  s.read_region = read_region_.load();
  s.write_region = write_region_.load();
  s.write_region_calls = write_region_calls_.load();
  s.send_message = send_message_.load();
  return s;
}

std::string InlineTransport::address() const {
  absl::MutexLock lock(&mu_);
  return address_;
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> InlineTransport::Add(
    void* data, size_t size, std::unique_ptr<char[]> owned) {
  if (!data || size == 0) {
    return absl::InvalidArgumentError("cannot register an empty memory region");
  }
  auto pins = std::make_shared<Pin::Count>();
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  std::string key = RandomKey();
  regions_[id] = Entry{static_cast<char*>(data), size, key, pins};
  return std::unique_ptr<MemoryRegion>(new Region(
      this, id, data, size, std::move(key), std::move(pins), std::move(owned)));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> InlineTransport::Register(
    void* data, size_t size) {
  return Add(data, size, nullptr);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> InlineTransport::Allocate(
    size_t size) {
  if (size == 0)
    return absl::InvalidArgumentError("cannot allocate an empty memory region");
  std::unique_ptr<char[]> memory(new char[size]());
  char* data = memory.get();
  return Add(data, size, std::move(memory));
}

absl::StatusOr<std::unique_ptr<Pair>> InlineTransport::Connect(
    const std::string& peer) {
  if (peer.empty() || peer.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        "not an inline transport address (host:port): '" + peer + "'");
  }
  return std::unique_ptr<Pair>(new InlinePair(this, peer));
}

absl::Status InlineTransport::SetHandler(uint16_t id, Handler handler) {
  if (id > 255)
    return absl::InvalidArgumentError(
        absl::StrCat("message id ", id, " > 255"));
  absl::MutexLock lock(&mu_);
  if (handlers_.count(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a handler for message id ", id, " is set"));
  }
  handlers_[id] = std::move(handler);
  return absl::OkStatus();
}

absl::StatusOr<InlineTransport::Entry> InlineTransport::Find(
    uint64_t id, const std::string& key, uint64_t offset, uint64_t size) const {
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second.key != key) {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": no region ", id,
                     " with that key (released, or a forged key)"));
  }
  if (offset > it->second.size || size > it->second.size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        label_, ": bytes [", offset, ", ", offset + size,
        ") are outside region ", id, " of ", it->second.size, " bytes"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<const InlineTransport::Pin>>
InlineTransport::PinRange(uint64_t id, const std::string& key, uint64_t offset,
                          uint64_t size) {
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<Entry> e = Find(id, key, offset, size);
  if (!e.ok()) return e.status();
  {
    absl::MutexLock pin_lock(&e->pins->mu);
    ++e->pins->pins;
  }
  return std::shared_ptr<const Pin>(
      new Pin(e->data + offset, static_cast<size_t>(size), e->pins));
}

absl::Status InlineTransport::ServeWrite(uint64_t id, const std::string& key,
                                         uint64_t offset, uint64_t size,
                                         absl::FunctionRef<void(char*)> fill) {
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<Entry> e = Find(id, key, offset, size);
  if (!e.ok()) return e.status();
  fill(e->data + offset);
  return absl::OkStatus();
}

absl::Status InlineTransport::SetDeferredCallHandler(
    uint16_t id, DeferredCallHandler handler) {
  if (id > 255)
    return absl::InvalidArgumentError(absl::StrCat("call id ", id, " > 255"));
  absl::MutexLock lock(&mu_);
  if (call_handlers_.count(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a handler for call id ", id, " is set"));
  }
  call_handlers_[id] = std::move(handler);
  return absl::OkStatus();
}

absl::Status InlineTransport::Answer(
    uint32_t id, const std::string& header,
    std::function<void(absl::StatusOr<std::string>)> done) {
  DeferredCallHandler fn;
  {
    absl::MutexLock lock(&mu_);
    auto it = call_handlers_.find(static_cast<uint16_t>(id));
    if (id > 255 || it == call_handlers_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label_, ": no handler for call id ", id));
    }
    fn = it->second;
  }
  fn(header, std::move(done));
  return absl::OkStatus();
}

absl::Status InlineTransport::Deliver(uint32_t id, const std::string& header,
                                      const std::string& payload) {
  Handler fn;
  {
    absl::MutexLock lock(&mu_);
    auto it = handlers_.find(static_cast<uint16_t>(id));
    if (id > 255 || it == handlers_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label_, ": no handler for message id ", id));
    }
    fn = it->second;
  }
  fn(header, payload.data(), payload.size());
  return absl::OkStatus();
}

}  // namespace zshard
