#include "common/transport/ucx/ucx_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/base/thread_name.h"

namespace zshard {
namespace {

// Keys handed to peers: magic, length of the packed UCX key, its FNV-1a
// hash, then the key.
constexpr uint32_t kKeyMagic = 0x7a55434b;  // "zUCK"
constexpr size_t kKeyFrame = 12;

uint32_t Fnv1a32(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

std::string FrameKey(const void* packed, size_t size) {
  std::string out(kKeyFrame, '\0');
  const uint32_t magic = kKeyMagic, len = static_cast<uint32_t>(size),
                 hash = Fnv1a32(packed, size);
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &len, 4);
  std::memcpy(out.data() + 8, &hash, 4);
  out.append(static_cast<const char*>(packed), size);
  return out;
}

// The packed UCX key inside a framed one, or null when it is damaged.
const void* UnframeKey(const std::string& key) {
  if (key.size() < kKeyFrame) return nullptr;
  uint32_t magic, len, hash;
  std::memcpy(&magic, key.data(), 4);
  std::memcpy(&len, key.data() + 4, 4);
  std::memcpy(&hash, key.data() + 8, 4);
  if (magic != kKeyMagic || len != key.size() - kKeyFrame ||
      hash != Fnv1a32(key.data() + kKeyFrame, len)) {
    return nullptr;
  }
  return key.data() + kKeyFrame;
}

// UCX active-message ids: a message id as is (0-255), a call's request at
// kCallAm + its id, every call's answer at kReplyAm.
constexpr unsigned kCallAm = 256;
constexpr unsigned kReplyAm = 512;

// Longest the progress thread sleeps without an event or a wake.
constexpr absl::Duration kProgressPollTimeout = absl::Milliseconds(100);

absl::Status UcsError(const std::string& what, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(s)));
}

class UcxRequest : public Request {
 public:
  bool done() const override {
    if (!parts_.empty()) return parts_[0]->done() && parts_[1]->done();
    absl::MutexLock lock(&mu_);
    return done_;
  }
  absl::Status status() const override {
    if (!parts_.empty()) {
      absl::Status st = parts_[0]->status();
      return st.ok() ? parts_[1]->status() : st;
    }
    absl::MutexLock lock(&mu_);
    return status_;
  }
  void Complete(ucs_status_t s, const std::string& label) {
    Finish(s == UCS_OK ? absl::OkStatus() : UcsError(label, s));
  }
  void Finish(absl::Status st) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(st);
    done_ = true;
  }
  // True once done; false at the deadline.
  bool WaitUntil(absl::Time deadline) const {
    if (!parts_.empty()) {
      for (const auto& p : parts_) {
        if (!static_cast<const UcxRequest*>(p.get())->WaitUntil(deadline))
          return false;
      }
      return true;
    }
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
  }
  // Makes this request the conjunction of `a` and `b` (both UcxRequests).
  void Chain(std::shared_ptr<Request> a, std::shared_ptr<Request> b) {
    parts_ = {std::move(a), std::move(b)};
  }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Request>>
      parts_;  // set before the request is shared
};

// user_data of a posted operation: keeps the request alive until UCX calls
// back, then goes away.
struct PostHolder {
  std::shared_ptr<UcxRequest> request;
  std::string label;
  std::shared_ptr<const void> keep_alive;  // e.g. a message header
  // Called with a failed operation's status (a call's send: its answer
  // will never come).
  std::function<void(ucs_status_t)> on_error;
};

void OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* h = static_cast<PostHolder*>(user_data);
  if (status != UCS_OK && h->on_error) h->on_error(status);
  h->request->Complete(status, h->label);
  delete h;
  ucp_request_free(request);
}

class UcxTransportImpl;
class LateAnswers;

// One UCP context (memory registration, the transports' resources), shared
// by every UcxTransportImpl made from it; each adds its own worker. Lives
// until its last transport and region are gone.
class UcxContextImpl : public TransportContext,
                       public std::enable_shared_from_this<UcxContextImpl> {
 public:
  ~UcxContextImpl() override {
    if (context_) ucp_cleanup(context_);
  }
  absl::Status Init();
  std::string name() const override { return "ucx"; }
  absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(
      const std::string& label) override;
  ucp_context_h get() const { return context_; }

 private:
  ucp_context_h context_ = nullptr;
};

class UcxRegion : public MemoryRegion {
 public:
  UcxRegion(std::shared_ptr<UcxContextImpl> context, ucp_mem_h memh, void* data,
            size_t size, std::string key)
      : context_(std::move(context)),
        memh_(memh),
        data_(data),
        size_(size),
        key_(std::move(key)) {}
  ~UcxRegion() override { ucp_mem_unmap(context_->get(), memh_); }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  RemoteRegion Describe() const override {
    return RemoteRegion{reinterpret_cast<uint64_t>(data_), size_, key_};
  }

 private:
  const std::shared_ptr<UcxContextImpl> context_;
  ucp_mem_h memh_;
  void* data_;
  size_t size_;
  std::string key_;
};

class UcxPair : public Pair {
 public:
  UcxPair(UcxTransportImpl* transport, std::string label)
      : t_(transport), label_(std::move(label)) {}
  ~UcxPair() override;

  // `peer`: the UCX worker address. On the same host the endpoint may use
  // shared memory, whose UCX 1.13 transports cannot report a failed peer:
  // there, deadlines and the gRPC control plane notice a dead peer. Across
  // hosts the endpoint reports peer failures (tcp, RDMA).
  absl::Status Open(ucp_worker_h worker, const std::string& peer,
                    bool same_host);

  absl::StatusOr<std::shared_ptr<Request>> Get(void* local, size_t size,
                                               const RemoteRegion& remote,
                                               uint64_t offset) override;
  absl::StatusOr<std::shared_ptr<Request>> Put(const void* local, size_t size,
                                               const RemoteRegion& remote,
                                               uint64_t offset) override;
  absl::StatusOr<std::shared_ptr<Request>> Send(uint16_t id,
                                                const std::string& header,
                                                const void* payload,
                                                size_t size) override;
  absl::StatusOr<std::shared_ptr<Request>> Call(uint16_t id,
                                                const std::string& header,
                                                std::string* reply) override;
  absl::Status Wait(const std::vector<std::shared_ptr<Request>>& requests,
                    absl::Time deadline) override;
  void Abort(const absl::Status& why) override {
    SetError(why);
    Close(/*force=*/true);
  }
  std::string Lanes() const override { return lanes_; }

  // Sends the answer to call `seq` of the peer (a call it made on a pair of
  // its own: see LateAnswers). Does not wait for it to arrive.
  absl::Status SendAnswer(uint64_t seq, absl::StatusOr<std::string> answer);

 private:
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Checks the range and unpacks (or finds) the key.
  absl::StatusOr<ucp_rkey_h> Key(const RemoteRegion& remote, uint64_t offset,
                                 size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Key() for an open pair (UNAVAILABLE once it failed or closed).
  absl::StatusOr<ucp_rkey_h> OpenKey(const RemoteRegion& remote,
                                     uint64_t offset, size_t size);
  absl::StatusOr<std::shared_ptr<Request>> Post(
      const std::function<ucs_status_ptr_t(ucp_ep_h,
                                           const ucp_request_param_t*)>& op,
      std::shared_ptr<const void> keep_alive = nullptr,
      std::function<void(ucs_status_t)> on_error = nullptr);
  absl::Status error() const {
    absl::MutexLock lock(&err_mu_);
    return error_;
  }
  // Records the pair's first error and ends its calls waiting for answers
  // with it.
  void SetError(absl::Status st);
  // Closes the endpoint (forcibly with `force`) and waits for it.
  void Close(bool force);

  UcxTransportImpl* const t_;
  const std::string label_;
  std::string lanes_;
  // The endpoint and its keys. Not held by the error callback, which may run
  // inside UCX calls made under it.
  mutable absl::Mutex mu_;
  ucp_ep_h ep_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, ucp_rkey_h> rkeys_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex err_mu_;
  absl::Status error_ ABSL_GUARDED_BY(err_mu_);
};

class UcxTransportImpl : public Transport {
 public:
  explicit UcxTransportImpl(std::shared_ptr<UcxContextImpl> context)
      : context_(std::move(context)) {}
  ~UcxTransportImpl() override;
  absl::Status Init(const std::string& label);

  std::string name() const override { return "ucx"; }
  // Host memory (CUDA memory needs a UCX built with CUDA and is not asked
  // for yet); gets and puts are RMA: the owner's CPU takes no part.
  TransportProperties properties() const override {
    return {{MemoryKind::kHost}, true};
  }
  std::string address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data,
                                                         size_t size) override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Allocate(size_t size) override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Map(void* data, size_t size,
                                                    bool allocate);
  absl::StatusOr<std::unique_ptr<Pair>> Connect(
      const std::string& peer) override;
  absl::Status SetHandler(uint16_t id, Handler handler) override;
  absl::Status SetDeferredCallHandler(uint16_t id,
                                      DeferredCallHandler handler) override;

  // A call of `pair` waits for its answer, which goes into `*reply` and
  // completes `request`; returns the call's number.
  uint64_t AddCall(const UcxPair* pair, std::shared_ptr<UcxRequest> request,
                   std::string* reply);
  // Ends call `seq` (if still waiting) with `st`, or with `answer` when OK.
  void EndCall(uint64_t seq, absl::Status st, const char* answer = nullptr,
               size_t size = 0);
  // Ends every call of `pair` still waiting with `st`.
  void FailCalls(const UcxPair* pair, const absl::Status& st);

  // Makes the progress thread look at the worker soon.
  void Wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  ucp_worker_h worker() const { return worker_; }
  const std::string& label() const { return label_; }

 private:
  struct HandlerEntry {
    UcxTransportImpl* transport;
    uint16_t id;
    Handler fn;
  };
  struct CallEntry {
    UcxTransportImpl* transport;
    DeferredCallHandler fn;
  };
  struct PendingCall {
    const UcxPair* pair;
    std::shared_ptr<UcxRequest> request;
    std::string* reply;
  };
  // A rendezvous message whose data is still to be received.
  struct Rndv {
    HandlerEntry* entry;
    std::string header;
    void* desc;
    size_t length;
  };
  struct RndvRecv {
    HandlerEntry* entry;
    std::string header;
    std::unique_ptr<char[]> data;
    size_t length;
  };

  static ucs_status_t OnMessage(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param);
  static void OnRndvDone(void* request, ucs_status_t status, size_t length,
                         void* user_data);
  // A call's request (header: its number; data: the caller's header):
  // answered at once on `param->reply_ep`.
  static ucs_status_t OnCall(void* arg, const void* header,
                             size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param);
  // A message or call for an id no handler was set for: the message is
  // dropped, the call refused (INVALID_ARGUMENT naming the id, `arg`).
  static ucs_status_t OnUnsetMessage(void* arg, const void* header,
                                     size_t header_length, void* data,
                                     size_t length,
                                     const ucp_am_recv_param_t* param);
  static ucs_status_t OnUnsetCall(void* arg, const void* header,
                                  size_t header_length, void* data,
                                  size_t length,
                                  const ucp_am_recv_param_t* param);
  // A call's answer (header: its number and status code; data: the answer
  // or the error's message).
  static ucs_status_t OnReply(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param);
  // Answers the call whose number is `seq` on the endpoint it came in on
  // (valid during its handler only).
  static void AnswerOn(ucp_ep_h ep, uint64_t seq,
                       absl::StatusOr<std::string> answer);
  // Registers `cb` for UCX active-message id `id` (`arg` passed back).
  absl::Status SetAmHandler(unsigned id, ucp_am_recv_callback_t cb, void* arg,
                            uint32_t flags);
  void Progress();
  void StartRndv();

  std::string label_;
  const std::shared_ptr<UcxContextImpl> context_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  int wake_fd_ = -1;
  std::string host_;
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  absl::Mutex mu_;
  std::map<uint16_t, std::unique_ptr<HandlerEntry>> handlers_
      ABSL_GUARDED_BY(mu_);
  std::map<uint16_t, std::unique_ptr<CallEntry>> call_handlers_
      ABSL_GUARDED_BY(mu_);
  std::deque<Rndv> rndv_;  // progress thread only

  absl::Mutex calls_mu_;
  uint64_t next_call_ ABSL_GUARDED_BY(calls_mu_) = 1;
  std::map<uint64_t, PendingCall> calls_ ABSL_GUARDED_BY(calls_mu_);

  std::shared_ptr<LateAnswers> late_;
};

// Answers given after their call's handler returned. The endpoint a call
// came in on is UCX's (it may go away with an error once the handler
// returned), so these go back on pairs of our own to the callers'
// transports (whose addresses travel with every call), made on a caller's
// first late answer and kept. Shared with the answers, which may outlive
// the transport: Close() makes them drop. Thread-safe.
class LateAnswers {
 public:
  explicit LateAnswers(UcxTransportImpl* transport) : t_(transport) {}

  void Send(const std::string& caller, uint64_t seq,
            absl::StatusOr<std::string> answer) {
    absl::MutexLock lock(&mu_);
    if (!t_) return;
    auto it = pairs_.find(caller);
    if (it == pairs_.end()) {
      // A bound on the callers kept (each one a trainer process): the
      // oldest made goes first.
      if (pairs_.size() >= kMaxCallers) {
        pairs_.erase(order_.front());
        order_.pop_front();
      }
      absl::StatusOr<std::unique_ptr<Pair>> pair = t_->Connect(caller);
      if (!pair.ok()) return;  // the caller's deadline ends its call
      it = pairs_
               .emplace(caller, std::unique_ptr<UcxPair>(
                                    static_cast<UcxPair*>(pair->release())))
               .first;
      order_.push_back(caller);
    }
    if (!it->second->SendAnswer(seq, std::move(answer)).ok()) {
      // Gone: a caller that comes back gets a new pair.
      pairs_.erase(it);
      order_.erase(std::find(order_.begin(), order_.end(), caller));
    }
  }

  // Drops every pair and every later answer. Before the transport's
  // progress thread stops.
  void Close() {
    absl::MutexLock lock(&mu_);
    t_ = nullptr;
    pairs_.clear();
    order_.clear();
  }

 private:
  static constexpr size_t kMaxCallers = 256;
  absl::Mutex mu_;
  UcxTransportImpl* t_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<UcxPair>> pairs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);
};

// ----------------------------------------------------------------- pair

void UcxPair::SetError(absl::Status st) {
  {
    absl::MutexLock lock(&err_mu_);
    if (error_.ok()) error_ = st;
  }
  t_->FailCalls(this, st);
}

void UcxPair::OnError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* p = static_cast<UcxPair*>(arg);
  p->SetError(UcsError(absl::StrCat(p->label_, ": connection lost"), status));
}

absl::Status UcxPair::Open(ucp_worker_h worker, const std::string& peer,
                           bool same_host) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer.data());
  params.err_mode =
      same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxPair::OnError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t s = ucp_ep_create(worker, &params, &ep);
  if (s != UCS_OK) {
    return UcsError(
        absl::StrCat(label_, ": cannot connect",
                     same_host
                         ? ""
                         : " (across hosts UCX_TLS must include tcp or an "
                           "RDMA transport)"),
        s);
  }
  char* text = nullptr;
  size_t text_size = 0;
  if (FILE* f = open_memstream(&text, &text_size)) {
    ucp_ep_print_info(ep, f);
    std::fclose(f);
    // Lines like "lane[1]:  3:posix/memory.0 md[3] ..." name the transports.
    std::set<std::string> lanes;
    const std::string info(text, text_size);
    for (size_t pos = info.find("lane["); pos != std::string::npos;
         pos = info.find("lane[", pos + 1)) {
      const size_t colon = info.find(':', info.find(']', pos) + 2);
      const size_t slash = info.find('/', colon);
      if (colon == std::string::npos || slash == std::string::npos) break;
      size_t begin = slash;
      while (begin > 0 &&
             (std::isalnum(static_cast<unsigned char>(info[begin - 1])) ||
              info[begin - 1] == '_')) {
        --begin;
      }
      size_t end = slash + 1;
      while (end < info.size() &&
             (std::isalnum(static_cast<unsigned char>(info[end])) ||
              info[end] == '_')) {
        ++end;
      }
      lanes.insert(info.substr(begin, end - begin));
    }
    lanes_ = absl::StrJoin(lanes, " ");
  }
  std::free(text);
  absl::MutexLock lock(&mu_);
  ep_ = ep;
  return absl::OkStatus();
}

UcxPair::~UcxPair() { Close(/*force=*/!error().ok()); }

void UcxPair::Close(bool force) {
  ucp_ep_h ep;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, rkey] : rkeys_) ucp_rkey_destroy(rkey);
    rkeys_.clear();
    ep = ep_;
    ep_ = nullptr;
  }
  SetError(absl::UnavailableError(absl::StrCat(label_, ": connection closed")));
  if (!ep) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) return;
  // The progress thread completes the close. Bounded: on shared memory a
  // dead peer never answers (UCX 1.13 cannot tell), and its pending
  // operations touch no buffer of ours any more (copies are synchronous).
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  while (ucp_request_check_status(r) == UCS_INPROGRESS &&
         absl::Now() < deadline) {
    t_->Wake();
    absl::SleepFor(absl::Milliseconds(1));
  }
  // Still in progress: the worker reclaims the endpoint when destroyed.
  ucp_request_free(r);
}

absl::StatusOr<ucp_rkey_h> UcxPair::Key(const RemoteRegion& remote,
                                        uint64_t offset, size_t size) {
  if (offset > remote.size || size > remote.size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        label_, ": bytes [", offset, ", ", offset + size,
        ") are outside the remote region of ", remote.size, " bytes"));
  }
  auto it = rkeys_.find(remote.key);
  if (it != rkeys_.end()) return it->second;
  const void* packed = UnframeKey(remote.key);
  if (!packed) {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": remote key is damaged or forged"));
  }
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t s = ucp_ep_rkey_unpack(ep_, packed, &rkey);
  if (s != UCS_OK) {
    return absl::InvalidArgumentError(absl::StrCat(
        label_, ": remote key does not unpack: ", ucs_status_string(s)));
  }
  rkeys_[remote.key] = rkey;
  return rkey;
}

absl::StatusOr<std::shared_ptr<Request>> UcxPair::Post(
    const std::function<ucs_status_ptr_t(ucp_ep_h, const ucp_request_param_t*)>&
        op,
    std::shared_ptr<const void> keep_alive,
    std::function<void(ucs_status_t)> on_error) {
  auto request = std::make_shared<UcxRequest>();
  auto* holder = new PostHolder{request, label_, std::move(keep_alive),
                                std::move(on_error)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OnSendDone;
  p.user_data = holder;
  ucs_status_ptr_t r;
  {
    absl::MutexLock lock(&mu_);
    absl::Status err = error();
    if (!err.ok() || !ep_) {
      delete holder;
      return err.ok() ? absl::UnavailableError(label_ + ": connection closed")
                      : err;
    }
    r = op(ep_, &p);
  }
  if (r == nullptr) {
    delete holder;
    request->Complete(UCS_OK, label_);
  } else if (UCS_PTR_IS_ERR(r)) {
    if (holder->on_error) holder->on_error(UCS_PTR_STATUS(r));
    delete holder;
    request->Complete(UCS_PTR_STATUS(r), label_);
  } else {
    // Pending: the progress thread moves it on. One that completed in the
    // call (a put or get over shared memory, an eager send) needs no wake,
    // which would cost the progress thread a context switch for nothing.
    t_->Wake();
  }
  return std::shared_ptr<Request>(request);
}

absl::StatusOr<ucp_rkey_h> UcxPair::OpenKey(const RemoteRegion& remote,
                                            uint64_t offset, size_t size) {
  if (absl::Status err = error(); !err.ok()) return err;
  absl::MutexLock lock(&mu_);
  if (!ep_) return absl::UnavailableError(label_ + ": connection closed");
  return Key(remote, offset, size);
}

absl::StatusOr<std::shared_ptr<Request>> UcxPair::Get(
    void* local, size_t size, const RemoteRegion& remote, uint64_t offset) {
  ZS_ASSIGN_OR_RETURN(ucp_rkey_h rkey, OpenKey(remote, offset, size));
  const uint64_t addr = remote.address + offset;
  return Post([=](ucp_ep_h ep, const ucp_request_param_t* p) {
    return ucp_get_nbx(ep, local, size, addr, rkey, p);
  });
}

absl::StatusOr<std::shared_ptr<Request>> UcxPair::Put(
    const void* local, size_t size, const RemoteRegion& remote,
    uint64_t offset) {
  ZS_ASSIGN_OR_RETURN(ucp_rkey_h rkey, OpenKey(remote, offset, size));
  const uint64_t addr = remote.address + offset;
  auto put = Post([=](ucp_ep_h ep, const ucp_request_param_t* p) {
    return ucp_put_nbx(ep, local, size, addr, rkey, p);
  });
  if (!put.ok()) return put;
  // A put completes locally; the flush completes once it is in the peer's
  // memory.
  auto flush = Post([](ucp_ep_h ep, const ucp_request_param_t* p) {
    return ucp_ep_flush_nbx(ep, p);
  });
  if (!flush.ok()) return flush;
  auto both = std::make_shared<UcxRequest>();
  both->Chain(*put, *flush);
  return std::shared_ptr<Request>(both);
}

absl::StatusOr<std::shared_ptr<Request>> UcxPair::Send(
    uint16_t id, const std::string& header, const void* payload, size_t size) {
  if (id > 255)
    return absl::InvalidArgumentError(
        absl::StrCat("message id ", id, " > 255"));
  // The header must outlive the send for rendezvous: keep a copy alive with
  // the request.
  auto copy = std::make_shared<const std::string>(header);
  return Post(
      [=](ucp_ep_h ep, const ucp_request_param_t* p) {
        return ucp_am_send_nbx(ep, id, copy->data(), copy->size(), payload,
                               size, p);
      },
      copy);
}

absl::StatusOr<std::shared_ptr<Request>> UcxPair::Call(
    uint16_t id, const std::string& header, std::string* reply) {
  if (id > 255)
    return absl::InvalidArgumentError(absl::StrCat("call id ", id, " > 255"));
  auto request = std::make_shared<UcxRequest>();
  const uint64_t seq = t_->AddCall(this, request, reply);
  // The caller's header travels as the message's data (eager: it is
  // delivered whole to the handler); the call's number and this
  // transport's address (for an answer given later: LateAnswers) as its
  // header.
  auto call_header = std::make_shared<std::string>(
      reinterpret_cast<const char*>(&seq), sizeof(seq));
  call_header->append(t_->address());
  auto body = std::make_shared<const std::string>(header);
  struct Keep {
    std::shared_ptr<std::string> header;
    std::shared_ptr<const std::string> body;
  };
  auto keep = std::make_shared<Keep>(Keep{call_header, body});
  UcxTransportImpl* t = t_;
  const std::string label = label_;
  auto send = Post(
      [=](ucp_ep_h ep, const ucp_request_param_t* p) {
        ucp_request_param_t q = *p;
        q.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        q.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
        return ucp_am_send_nbx(ep, kCallAm + id, call_header->data(),
                               call_header->size(), body->data(), body->size(),
                               &q);
      },
      keep,
      [t, seq, label](ucs_status_t s) {
        t->EndCall(seq, UcsError(absl::StrCat(label, ": call not sent"), s));
      });
  if (!send.ok()) {
    t_->EndCall(seq, send.status());
    return send.status();
  }
  return std::shared_ptr<Request>(request);
}

absl::Status UcxPair::Wait(
    const std::vector<std::shared_ptr<Request>>& requests,
    absl::Time deadline) {
  // Requests complete on the progress thread, which the worker's events
  // wake (Post wakes it for an operation it leaves pending). One still
  // pending after a while wakes it too, in case an event was missed: after
  // 1 ms, then at doubling intervals up to the thread's poll timeout.
  // Waking it before every wait, as this did before, cost a progress-thread
  // context switch per transfer and call, often a preemption of the compute
  // thread on a busy core.
  bool timed_out = false;
  for (const auto& r : requests) {
    absl::Duration nudge = absl::Milliseconds(1);
    while (!r->done()) {
      if (absl::Now() >= deadline) {
        timed_out = true;
        break;
      }
      const absl::Time until = std::min(deadline, absl::Now() + nudge);
      if (static_cast<UcxRequest*>(r.get())->WaitUntil(until)) break;
      t_->Wake();
      nudge = std::min(2 * nudge, kProgressPollTimeout);
    }
    if (timed_out) break;
  }
  if (timed_out) {
    SetError(absl::UnavailableError(
        absl::StrCat(label_, ": closed after a deadline passed")));
    Close(/*force=*/true);
    // Force-closing ends every pending operation; wait (briefly) for them.
    // Over shared memory a dead peer's operations may never end, but they no
    // longer touch our buffers (the copies themselves are synchronous; what
    // stays pending is the flush), so the wait is bounded.
    const absl::Time drain = absl::Now() + absl::Milliseconds(250);
    for (const auto& r : requests) {
      while (!r->done() && absl::Now() < drain) {
        t_->Wake();
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    return absl::DeadlineExceededError(
        absl::StrCat(label_, ": transfer not finished by the deadline"));
  }
  // A peer lost after the transfers completed does not fail them.
  for (const auto& r : requests) {
    absl::Status st = r->status();
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ transport

absl::Status UcxContextImpl::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcsError("UCX configuration (UCX_* environment)", s);
  // Workers shared by threads lock with a mutex, not UCX's default spinlock
  // (unless UCX_USE_MT_MUTEX says otherwise). A fetch thread's get holds
  // the worker for the whole copy, and a progress thread that wakes then
  // spun for it: 14% of a trainer's CPU samples were in pthread_spin_lock
  // on 2 cores, and the step (step_bench, default shape, ucx) was 1.87-2.39
  // x the compute floor with the spinlock against 1.63-1.81 with the mutex
  // in 5 interleaved pairs of runs.
  if (std::getenv("UCX_USE_MT_MUTEX") == nullptr) {
    s = ucp_config_modify(config, "USE_MT_MUTEX", "y");
    if (s != UCS_OK) {
      ucp_config_release(config);
      return UcsError("UCX configuration (USE_MT_MUTEX)", s);
    }
  }
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // workers of several transports, threads
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK)
    return UcsError("UCX init (check UCX_TLS / UCX_NET_DEVICES)", s);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Transport>> UcxContextImpl::CreateTransport(
    const std::string& label) {
  auto t = std::make_unique<UcxTransportImpl>(shared_from_this());
  ZS_RETURN_IF_ERROR(t->Init(label));
  return std::unique_ptr<Transport>(std::move(t));
}

absl::Status UcxTransportImpl::Init(const std::string& label) {
  label_ = label;
  ucs_status_t s;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  s = ucp_worker_create(context_->get(), &wp, &worker_);
  if (s != UCS_OK) return UcsError("UCX worker", s);
  ucp_worker_attr_t attr{};
  attr.field_mask =
      UCP_WORKER_ATTR_FIELD_THREAD_MODE | UCP_WORKER_ATTR_FIELD_ADDRESS;
  s = ucp_worker_query(worker_, &attr);
  if (s != UCS_OK) return UcsError("UCX worker query", s);
  // Our address: host name, a newline, the worker address.
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  host_ = host;
  address_ = host_ + "\n" + FrameKey(attr.address, attr.address_length);
  ucp_worker_release_address(worker_, attr.address);
  if (attr.thread_mode != UCS_THREAD_MODE_MULTI) {
    return absl::UnavailableError(
        "this UCX build has no multi-threaded workers (--enable-mt)");
  }
  s = ucp_worker_get_efd(worker_, &efd_);
  if (s != UCS_OK) return UcsError("UCX worker event descriptor", s);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::UnavailableError("eventfd failed");
  ZS_RETURN_IF_ERROR(SetAmHandler(kReplyAm, &UcxTransportImpl::OnReply, this,
                                  UCP_AM_FLAG_WHOLE_MSG));
  // UCX 1.13 leaves the handler table's entries between registered ids
  // uninitialized: a message for an id nobody registered ran whatever they
  // held (a crash in ucp_am_handler_reply, about 1 run in 50 of a test that
  // calls an unset id). Every id a peer may send gets a handler before the
  // progress thread starts; SetHandler / SetDeferredCallHandler replace it.
  for (uintptr_t id = 0; id < 256; ++id) {
    ZS_RETURN_IF_ERROR(
        SetAmHandler(id, &UcxTransportImpl::OnUnsetMessage, nullptr, 0));
    ZS_RETURN_IF_ERROR(
        SetAmHandler(kCallAm + id, &UcxTransportImpl::OnUnsetCall,
                     reinterpret_cast<void*>(id), UCP_AM_FLAG_WHOLE_MSG));
  }
  late_ = std::make_shared<LateAnswers>(this);
  thread_ = std::thread([this] {
    NameCurrentThread("zs-ucx-progress");
    Progress();
  });
  return absl::OkStatus();
}

UcxTransportImpl::~UcxTransportImpl() {
  // Its pairs close while the progress thread still runs.
  if (late_) late_->Close();
  if (thread_.joinable()) {
    stop_ = true;
    Wake();
    thread_.join();
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void UcxTransportImpl::Progress() {
  while (!stop_.load()) {
    while (ucp_worker_progress(worker_) != 0) {
    }
    StartRndv();
    if (!rndv_.empty()) continue;
    const ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{efd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(fds, 2, absl::ToInt64Milliseconds(kProgressPollTimeout));
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof(v));
    }
  }
}

ucs_status_t UcxTransportImpl::OnMessage(void* arg, const void* header,
                                         size_t header_length, void* data,
                                         size_t length,
                                         const ucp_am_recv_param_t* param) {
  auto* entry = static_cast<HandlerEntry*>(arg);
  std::string h(static_cast<const char*>(header), header_length);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // Received (into memory of ours) after the callback, by the progress loop.
    entry->transport->rndv_.push_back(Rndv{entry, std::move(h), data, length});
    return UCS_INPROGRESS;
  }
  entry->fn(h, data, length);
  return UCS_OK;
}

void UcxTransportImpl::OnRndvDone(void* request, ucs_status_t status,
                                  size_t /*length*/, void* user_data) {
  auto* r = static_cast<RndvRecv*>(user_data);
  if (status == UCS_OK) r->entry->fn(r->header, r->data.get(), r->length);
  delete r;
  ucp_request_free(request);
}

void UcxTransportImpl::StartRndv() {
  while (!rndv_.empty()) {
    Rndv m = std::move(rndv_.front());
    rndv_.pop_front();
    auto* recv =
        new RndvRecv{m.entry, std::move(m.header),
                     std::unique_ptr<char[]>(new char[m.length]), m.length};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &UcxTransportImpl::OnRndvDone;
    p.user_data = recv;
    ucs_status_ptr_t r =
        ucp_am_recv_data_nbx(worker_, m.desc, recv->data.get(), m.length, &p);
    if (r == nullptr) {
      recv->entry->fn(recv->header, recv->data.get(), recv->length);
      delete recv;
    } else if (UCS_PTR_IS_ERR(r)) {
      delete recv;  // the sender's send fails
    }
  }
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxTransportImpl::Register(
    void* data, size_t size) {
  if (!data || size == 0) {
    return absl::InvalidArgumentError("cannot register an empty memory region");
  }
  return Map(data, size, /*allocate=*/false);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxTransportImpl::Allocate(
    size_t size) {
  if (size == 0)
    return absl::InvalidArgumentError("cannot allocate an empty memory region");
  return Map(nullptr, size, /*allocate=*/true);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxTransportImpl::Map(
    void* data, size_t size, bool allocate) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                 UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.address = data;
  p.length = size;
  p.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(context_->get(), &p, &memh);
  if (s != UCS_OK)
    return UcsError(absl::StrCat(label_, ": cannot register memory"), s);
  if (allocate) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    s = ucp_mem_query(memh, &attr);
    if (s != UCS_OK || attr.length < size) {
      ucp_mem_unmap(context_->get(), memh);
      return UcsError(absl::StrCat(label_, ": allocated memory"), s);
    }
    data = attr.address;
    std::memset(data, 0, size);
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  s = ucp_rkey_pack(context_->get(), memh, &packed, &packed_size);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_->get(), memh);
    return UcsError(absl::StrCat(label_, ": cannot pack a remote key"), s);
  }
  std::string key = FrameKey(packed, packed_size);
  ucp_rkey_buffer_release(packed);
  return std::unique_ptr<MemoryRegion>(
      new UcxRegion(context_, memh, data, size, std::move(key)));
}

absl::StatusOr<std::unique_ptr<Pair>> UcxTransportImpl::Connect(
    const std::string& peer) {
  const size_t newline = peer.find('\n');
  if (newline == std::string::npos || newline + 1 >= peer.size()) {
    return absl::InvalidArgumentError("not a UCX transport address");
  }
  const std::string framed = peer.substr(newline + 1);
  const void* worker_address = UnframeKey(framed);
  if (!worker_address)
    return absl::InvalidArgumentError("damaged UCX transport address");
  auto pair = std::make_unique<UcxPair>(this, label_);
  absl::Status st =
      pair->Open(worker_,
                 std::string(static_cast<const char*>(worker_address),
                             framed.size() - kKeyFrame),
                 peer.compare(0, newline, host_) == 0);
  if (!st.ok()) return st;
  Wake();
  return std::unique_ptr<Pair>(std::move(pair));
}

uint64_t UcxTransportImpl::AddCall(const UcxPair* pair,
                                   std::shared_ptr<UcxRequest> request,
                                   std::string* reply) {
  absl::MutexLock lock(&calls_mu_);
  const uint64_t seq = next_call_++;
  calls_[seq] = PendingCall{pair, std::move(request), reply};
  return seq;
}

void UcxTransportImpl::EndCall(uint64_t seq, absl::Status st,
                               const char* answer, size_t size) {
  absl::MutexLock lock(&calls_mu_);
  auto it = calls_.find(seq);
  if (it == calls_.end()) return;  // ended already (pair failed, deadline)
  if (st.ok()) it->second.reply->assign(answer, size);
  it->second.request->Finish(std::move(st));
  calls_.erase(it);
}

void UcxTransportImpl::FailCalls(const UcxPair* pair, const absl::Status& st) {
  absl::MutexLock lock(&calls_mu_);
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second.pair != pair) {
      ++it;
      continue;
    }
    it->second.request->Finish(st);
    it = calls_.erase(it);
  }
}

// An answer on its way back; freed when UCX is done with it.
struct ReplyHolder {
  std::string header;  // call number, status code
  std::string body;    // answer or error message
};

std::string ReplyHeader(uint64_t seq, const absl::StatusOr<std::string>& a) {
  const uint32_t code = a.ok() ? 0 : static_cast<uint32_t>(a.status().code());
  std::string out(reinterpret_cast<const char*>(&seq), sizeof(seq));
  out.append(reinterpret_cast<const char*>(&code), sizeof(code));
  return out;
}

std::string ReplyBody(absl::StatusOr<std::string>& a) {
  return a.ok() ? std::move(*a) : std::string(a.status().message());
}

void OnReplySent(void* request, ucs_status_t /*status*/, void* user_data) {
  delete static_cast<ReplyHolder*>(user_data);
  ucp_request_free(request);
}

void UcxTransportImpl::AnswerOn(ucp_ep_h ep, uint64_t seq,
                                absl::StatusOr<std::string> answer) {
  auto* reply = new ReplyHolder{ReplyHeader(seq, answer), ReplyBody(answer)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &OnReplySent;
  p.user_data = reply;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(ep, kReplyAm, reply->header.data(), reply->header.size(),
                      reply->body.data(), reply->body.size(), &p);
  // Failed at once: the caller's deadline (or its pair's error) ends it.
  if (r == nullptr || UCS_PTR_IS_ERR(r)) delete reply;
}

absl::Status UcxPair::SendAnswer(uint64_t seq,
                                 absl::StatusOr<std::string> answer) {
  auto reply = std::make_shared<ReplyHolder>(
      ReplyHolder{ReplyHeader(seq, answer), ReplyBody(answer)});
  return Post(
             [reply](ucp_ep_h ep, const ucp_request_param_t* p) {
               ucp_request_param_t q = *p;
               q.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
               q.flags = UCP_AM_SEND_FLAG_EAGER;
               return ucp_am_send_nbx(ep, kReplyAm, reply->header.data(),
                                      reply->header.size(), reply->body.data(),
                                      reply->body.size(), &q);
             },
             reply)
      .status();
}

// A call's number (the first 8 bytes of its header), or nullopt for what
// is not a call of ours: calls are eager only (the caller forces it) and
// come with a reply endpoint.
std::optional<uint64_t> CallNumber(const void* header, size_t header_length,
                                   const ucp_am_recv_param_t* param) {
  if (header_length < sizeof(uint64_t) ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
      !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    return std::nullopt;
  }
  uint64_t seq;
  std::memcpy(&seq, header, sizeof(seq));
  return seq;
}

ucs_status_t UcxTransportImpl::OnCall(void* arg, const void* header,
                                      size_t header_length, void* data,
                                      size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto* entry = static_cast<CallEntry*>(arg);
  const std::optional<uint64_t> call = CallNumber(header, header_length, param);
  if (!call) return UCS_OK;
  const uint64_t seq = *call;
  // An answer given while the handler runs goes back on the endpoint the
  // call came in on; a later one through LateAnswers.
  struct State {
    absl::Mutex mu;
    bool in_handler ABSL_GUARDED_BY(mu) = true;
    bool answered ABSL_GUARDED_BY(mu) = false;
    std::optional<absl::StatusOr<std::string>> early ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  std::string caller(static_cast<const char*>(header) + sizeof(seq),
                     header_length - sizeof(seq));
  entry->fn(
      std::string(static_cast<const char*>(data), length),
      [state, seq, caller = std::move(caller),
       late = entry->transport->late_](absl::StatusOr<std::string> answer) {
        {
          absl::MutexLock lock(&state->mu);
          if (state->answered) return;
          state->answered = true;
          if (state->in_handler) {
            state->early = std::move(answer);
            return;
          }
        }
        late->Send(caller, seq, std::move(answer));
      });
  absl::MutexLock lock(&state->mu);
  state->in_handler = false;
  if (state->early) AnswerOn(param->reply_ep, seq, std::move(*state->early));
  return UCS_OK;
}

ucs_status_t UcxTransportImpl::OnUnsetMessage(
    void* /*arg*/, const void* /*header*/, size_t /*header_length*/,
    void* /*data*/, size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  return UCS_OK;  // dropped (a rendezvous message's data is not fetched)
}

ucs_status_t UcxTransportImpl::OnUnsetCall(void* arg, const void* header,
                                           size_t header_length, void* /*data*/,
                                           size_t /*length*/,
                                           const ucp_am_recv_param_t* param) {
  const std::optional<uint64_t> seq = CallNumber(header, header_length, param);
  if (!seq) return UCS_OK;
  AnswerOn(param->reply_ep, *seq,
           absl::InvalidArgumentError(absl::StrCat(
               "no handler for call id ", reinterpret_cast<uintptr_t>(arg))));
  return UCS_OK;
}

ucs_status_t UcxTransportImpl::OnReply(void* arg, const void* header,
                                       size_t header_length, void* data,
                                       size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransportImpl*>(arg);
  if (header_length != sizeof(uint64_t) + sizeof(uint32_t) ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    return UCS_OK;
  }
  uint64_t seq;
  uint32_t code;
  std::memcpy(&seq, header, sizeof(seq));
  std::memcpy(&code, static_cast<const char*>(header) + sizeof(seq),
              sizeof(code));
  const char* body = static_cast<const char*>(data);
  if (code == 0) {
    t->EndCall(seq, absl::OkStatus(), body, length);
  } else {
    t->EndCall(seq, absl::Status(static_cast<absl::StatusCode>(code),
                                 std::string(body, length)));
  }
  return UCS_OK;
}

absl::Status UcxTransportImpl::SetAmHandler(unsigned id,
                                            ucp_am_recv_callback_t cb,
                                            void* arg, uint32_t flags) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG |
                 UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = cb;
  p.arg = arg;
  p.flags = flags;
  const ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &p);
  if (s != UCS_OK) return UcsError("UCX message handler", s);
  return absl::OkStatus();
}

absl::Status UcxTransportImpl::SetDeferredCallHandler(
    uint16_t id, DeferredCallHandler handler) {
  if (id > 255)
    return absl::InvalidArgumentError(absl::StrCat("call id ", id, " > 255"));
  absl::MutexLock lock(&mu_);
  if (call_handlers_.count(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a handler for call id ", id, " is set"));
  }
  auto entry = std::make_unique<CallEntry>(CallEntry{this, std::move(handler)});
  ZS_RETURN_IF_ERROR(SetAmHandler(kCallAm + id, &UcxTransportImpl::OnCall,
                                  entry.get(), UCP_AM_FLAG_WHOLE_MSG));
  call_handlers_[id] = std::move(entry);
  return absl::OkStatus();
}

absl::Status UcxTransportImpl::SetHandler(uint16_t id, Handler handler) {
  if (id > 255)
    return absl::InvalidArgumentError(
        absl::StrCat("message id ", id, " > 255"));
  absl::MutexLock lock(&mu_);
  if (handlers_.count(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a handler for message id ", id, " is set"));
  }
  auto entry = std::make_unique<HandlerEntry>(
      HandlerEntry{this, id, std::move(handler)});
  ZS_RETURN_IF_ERROR(
      SetAmHandler(id, &UcxTransportImpl::OnMessage, entry.get(), 0));
  handlers_[id] = std::move(entry);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<TransportContext>> CreateUcxContext() {
  auto c = std::make_shared<UcxContextImpl>();
  ZS_RETURN_IF_ERROR(c->Init());
  return std::shared_ptr<TransportContext>(std::move(c));
}

}  // namespace zshard
