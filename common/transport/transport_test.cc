// Transports against their contract, parameterized over every transport
// built (a transport that is not built is skipped, never faked).
#include "common/transport/transport.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_transport.h"
#include "common/transport/transport_factory.h"
#include "gtest/gtest.h"
#include "zshard/v1/inline_transport.grpc.pb.h"

namespace zshard {
namespace {

// A transport that can be read from, on its own: one that carries its bytes
// over gRPC (inline) gets a bare gRPC server on 127.0.0.1:0 hosting its
// service; no shard server is involved.
struct Host {
  std::unique_ptr<Transport> own;
  std::unique_ptr<grpc::Server> server;  // destroyed before `own`
  Transport* t = nullptr;
  Host() = default;
  Host(Host&&) = default;
  Host& operator=(Host&&) = default;
  ~Host() {
    if (server) server->Shutdown(std::chrono::system_clock::now());
  }
};

// `context`: make the transport from it (default: a context of its own).
absl::StatusOr<Host> MakeHost(const std::string& name,
                              TransportContext* context = nullptr) {
  Host h;
  auto t = context ? context->CreateTransport("server")
                   : CreateTransport(name, "server");
  if (!t.ok()) return t.status();
  h.own = std::move(*t);
  h.t = h.own.get();
  if (grpc::Service* service = h.t->GrpcService()) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service);
    builder.SetMaxReceiveMessageSize(Transport::kMaxHostedRequestBytes);
    h.server = builder.BuildAndStart();
    if (!h.server || port == 0)
      return absl::UnavailableError("no port for the inline host");
    h.t->SetServingEndpoint("127.0.0.1:" + std::to_string(port));
  }
  return h;
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto a = MakeHost(GetParam());
    if (absl::IsUnimplemented(a.status())) GTEST_SKIP() << a.status().message();
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = CreateTransport(GetParam(), "trainer");
    ASSERT_TRUE(b.ok()) << b.status();
    host_ = std::move(*a);
    server_ = host_.t;
    client_ = std::move(*b);
  }

  Host host_;
  Transport* server_ = nullptr;
  std::unique_ptr<Transport> client_;
};

std::vector<uint32_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<uint32_t>(i * 2654435761u) ^ seed;
  return v;
}

TEST_P(TransportTest, PropertiesAreDeclaredAlikeOnBothEnds) {
  const TransportProperties p = server_->properties();
  ASSERT_FALSE(p.memory_kinds.empty());
  EXPECT_EQ(p.memory_kinds.front(),
            MemoryKind::kHost);  // what the shards register
  EXPECT_EQ(p.one_sided,
            GetParam() == "ucx");  // inline: served by the owner's gRPC threads
  EXPECT_EQ(client_->properties().memory_kinds, p.memory_kinds);
  EXPECT_EQ(client_->properties().one_sided, p.one_sided);
}

TEST_P(TransportTest, GetAndPutMoveExactBytes) {
  const size_t n = (4 << 20) / 4 + 3;  // not a round size
  std::vector<uint32_t> published = Pattern(n, 1);
  auto region = server_->Register(published.data(), n * 4);
  ASSERT_TRUE(region.ok()) << region.status();
  const RemoteRegion remote = (*region)->Describe();
  EXPECT_EQ(remote.size, n * 4);
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_FALSE((*pair)->Lanes().empty());
  std::printf("%s lanes: %s\n", GetParam().c_str(), (*pair)->Lanes().c_str());

  // The whole region, and a range at an odd offset, in parallel.
  std::vector<uint32_t> all(n, 0), part(1000, 0);
  auto r1 = (*pair)->Get(all.data(), n * 4, remote, 0);
  auto r2 = (*pair)->Get(part.data(), part.size() * 4, remote, 4 * 12345);
  ASSERT_TRUE(r1.ok() && r2.ok());
  ASSERT_TRUE((*pair)->Wait({*r1, *r2}, absl::Now() + absl::Seconds(20)).ok());
  EXPECT_EQ(all, published);
  EXPECT_EQ(
      0, std::memcmp(part.data(), published.data() + 12345, part.size() * 4));

  std::vector<uint32_t> update = Pattern(500, 7);
  auto w = (*pair)->Put(update.data(), update.size() * 4, remote, 4 * 100);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*pair)->Wait({*w}, absl::Now() + absl::Seconds(20)).ok());
  // A get after the put sees it (same pair, ordered by the wait).
  std::vector<uint32_t> back(500);
  auto r3 = (*pair)->Get(back.data(), back.size() * 4, remote, 4 * 100);
  ASSERT_TRUE(r3.ok());
  ASSERT_TRUE((*pair)->Wait({*r3}, absl::Now() + absl::Seconds(20)).ok());
  EXPECT_EQ(back, update);
  pair->reset();
}

TEST_P(TransportTest, RangesOutsideTheRegionAndDamagedKeysAreRefused) {
  std::vector<char> mem(4096, 'x');
  auto region = server_->Register(mem.data(), mem.size());
  ASSERT_TRUE(region.ok());
  RemoteRegion remote = (*region)->Describe();
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok());
  std::vector<char> out(8192);
  for (auto [offset, size] : {std::pair<uint64_t, size_t>{4000, 200},
                              {4097, 0},
                              {0, 4097},
                              {UINT64_MAX - 5, 10}}) {
    auto r = (*pair)->Get(out.data(), size, remote, offset);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << offset << "+" << size;
    auto w = (*pair)->Put(out.data(), size, remote, offset);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument)
        << offset << "+" << size;
  }
  // A damaged key is refused where it is checked: when posting (UCX) or by
  // the peer (inline).
  auto refused = [&](const RemoteRegion& bad) {
    auto r = (*pair)->Get(out.data(), 16, bad, 0);
    if (!r.ok()) return r.status().code();
    return (*pair)->Wait({*r}, absl::Now() + absl::Seconds(10)).code();
  };
  for (size_t i : {size_t{0}, size_t{5}, remote.key.size() - 1}) {
    RemoteRegion forged = remote;
    forged.key[i] ^= 0x20;
    EXPECT_EQ(refused(forged), absl::StatusCode::kInvalidArgument) << i;
  }
  RemoteRegion truncated = remote;
  truncated.key.resize(7);
  EXPECT_EQ(refused(truncated), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(mem.begin(), mem.end()), std::string(4096, 'x'));
  // The pair still works.
  auto ok = (*pair)->Get(out.data(), 4096, remote, 0);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*pair)->Wait({*ok}, absl::Now() + absl::Seconds(10)).ok());
}

TEST_P(TransportTest, MessagesReachTheHandlerSmallAndLarge) {
  absl::Mutex mu;
  std::vector<std::pair<std::string, std::vector<char>>> got;
  ASSERT_TRUE(
      server_
          ->SetHandler(
              3,
              [&](const std::string& header, const void* payload, size_t size) {
                absl::MutexLock lock(&mu);
                const char* p = static_cast<const char*>(payload);
                got.emplace_back(header, std::vector<char>(p, p + size));
              })
          .ok());
  EXPECT_EQ(server_->SetHandler(3, nullptr).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(server_->SetHandler(300, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok());
  std::vector<char> small(100, 's'), large(8 << 20);
  std::iota(large.begin(), large.end(), 0);
  auto s1 = (*pair)->Send(3, "small", small.data(), small.size());
  auto s2 = (*pair)->Send(3, "large", large.data(), large.size());
  ASSERT_TRUE(s1.ok() && s2.ok());
  ASSERT_TRUE((*pair)->Wait({*s1, *s2}, absl::Now() + absl::Seconds(20)).ok());
  absl::MutexLock lock(&mu);
  auto two = [&got]()
                 ABSL_NO_THREAD_SAFETY_ANALYSIS { return got.size() == 2; };
  ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(&two),
                                   absl::Now() + absl::Seconds(20)));
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got[0].first, "large");
  EXPECT_EQ(got[0].second, large);
  EXPECT_EQ(got[1].first, "small");
  EXPECT_EQ(got[1].second, small);
}

TEST_P(TransportTest, CallsAreAnsweredWithTheHandlersReplyOrError) {
  std::atomic<int> calls{0};
  ASSERT_TRUE(
      server_
          ->SetCallHandler(
              7,
              [&](const std::string& header) -> absl::StatusOr<std::string> {
                ++calls;
                if (header == "refuse") {
                  return absl::FailedPreconditionError("refused as asked");
                }
                return "re:" + header;
              })
          .ok());
  EXPECT_EQ(server_->SetCallHandler(7, nullptr).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(server_->SetCallHandler(256, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  // Many in flight at once, each matched to its own answer; one as large
  // as a trainer's resume state may be.
  std::vector<std::string> replies(64);
  std::vector<std::shared_ptr<Request>> requests;
  for (size_t i = 0; i < replies.size(); ++i) {
    const std::string header =
        i == 5 ? std::string(64 << 10, 'x') : absl::StrCat("n", i);
    auto r = (*pair)->Call(7, header, &replies[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    requests.push_back(*r);
  }
  ASSERT_TRUE((*pair)->Wait(requests, deadline).ok());
  for (size_t i = 0; i < replies.size(); ++i) {
    if (i == 5) {
      EXPECT_EQ(replies[i], "re:" + std::string(64 << 10, 'x'));
    } else {
      EXPECT_EQ(replies[i], absl::StrCat("re:n", i));
    }
  }
  std::string reply;
  auto refused = (*pair)->Call(7, "refuse", &reply);
  ASSERT_TRUE(refused.ok());
  absl::Status st = (*pair)->Wait({*refused}, deadline);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("refused as asked"), std::string::npos) << st;
  EXPECT_EQ(calls.load(), 65);
  // A call with no handler at the peer is refused, naming the id (over ucx
  // it once ran whatever UCX's handler table held for it: a crash).
  for (int i = 0; i < 3; ++i) {
    auto unknown = (*pair)->Call(8, "x", &reply);
    ASSERT_TRUE(unknown.ok());
    st = (*pair)->Wait({*unknown}, deadline);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("no handler for call id 8"), std::string::npos)
        << st;
  }
  EXPECT_EQ((*pair)->Call(300, "x", &reply).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportTest, DeferredCallsAreAnsweredLaterFromAnotherThread) {
  // Answers held until the test releases them, then given by a thread of
  // its own (as a shard's waits do); "now" is answered inside the handler.
  absl::Mutex mu;
  std::vector<std::pair<std::string, Transport::CallAnswer>> held;
  ASSERT_TRUE(
      server_
          ->SetDeferredCallHandler(
              9,
              [&](const std::string& header, Transport::CallAnswer answer) {
                if (header == "now") {
                  answer(std::string("at once"));
                  return;
                }
                absl::MutexLock lock(&mu);
                held.emplace_back(header, std::move(answer));
              })
          .ok());
  EXPECT_EQ(server_->SetCallHandler(9, nullptr).code(),
            absl::StatusCode::kAlreadyExists);
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string now_reply;
  auto now = (*pair)->Call(9, "now", &now_reply);
  ASSERT_TRUE(now.ok());
  ASSERT_TRUE((*pair)->Wait({*now}, deadline).ok());
  EXPECT_EQ(now_reply, "at once");

  std::vector<std::string> replies(3);
  std::vector<std::shared_ptr<Request>> requests;
  for (size_t i = 0; i < replies.size(); ++i) {
    auto r = (*pair)->Call(9, absl::StrCat("later", i), &replies[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    requests.push_back(*r);
  }
  {
    absl::MutexLock lock(&mu);
    auto all_held = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
      return held.size() == replies.size();
    };
    ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(&all_held), deadline));
  }
  // Not answered yet: still pending after a while.
  absl::SleepFor(absl::Milliseconds(100));
  for (const auto& r : requests) EXPECT_FALSE(r->done());
  // Answered in reverse order of arrival by another thread, one with an
  // error; a second answer to a call is ignored.
  std::thread answerer([&] {
    absl::MutexLock lock(&mu);
    for (size_t i = held.size(); i-- > 0;) {
      if (held[i].first == "later1") {
        held[i].second(absl::ResourceExhaustedError("no slot for later1"));
      } else {
        held[i].second("re:" + held[i].first);
      }
      held[i].second(std::string("second answer"));
    }
  });
  answerer.join();
  absl::Status st = (*pair)->Wait({requests[0], requests[2]}, deadline);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(replies[0], "re:later0");
  EXPECT_EQ(replies[2], "re:later2");
  st = (*pair)->Wait({requests[1]}, deadline);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("no slot for later1"), std::string::npos) << st;

  // An answer that comes after the caller's deadline is dropped, and one
  // that outlives the server's transport does nothing.
  std::string late_reply;
  auto late = (*pair)->Call(9, "too late", &late_reply);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(
      (*pair)->Wait({*late}, absl::Now() + absl::Milliseconds(200)).code(),
      absl::StatusCode::kDeadlineExceeded);
  Transport::CallAnswer kept;
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(held.size(), replies.size() + 1);
    kept = held.back().second;
    held.clear();
  }
  kept(std::string("after the deadline"));
  EXPECT_EQ(late_reply, "");
  pair->reset();
  host_ = Host();
  kept(std::string("after the transport"));
}

// GetMany (inline only): ranges of several regions, of several messages, of
// one byte and of none, in any order, each lands where asked and is reported
// done (one ReadRegion stream for all); a bad range anywhere refuses the
// whole call before anything is posted. Other transports refuse it.
TEST_P(TransportTest, GetManyReadsEveryRangeInOneStream) {
  const size_t n = (7 << 20) / 4 + 5;  // three ReadRegion messages
  std::vector<uint32_t> a = Pattern(n, 11), b = Pattern(1000, 12);
  auto ra = server_->Register(a.data(), n * 4);
  auto rb = server_->Register(b.data(), b.size() * 4);
  ASSERT_TRUE(ra.ok() && rb.ok());
  const RemoteRegion A = (*ra)->Describe(), B = (*rb)->Describe();
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok());
  const bool supported = server_->properties().get_many;
  EXPECT_EQ(supported, GetParam() == "inline");
  EXPECT_EQ(client_->properties().get_many, supported);
  std::vector<uint32_t> all(n, 0), tail(10, 0), one(1, 0), mid(500, 0);
  const std::vector<GetRange> ranges = {{tail.data(), 40, B, 4 * 990},
                                        {one.data(), 4, A, 4 * 7},
                                        {nullptr, 0, B, 0},
                                        {all.data(), n * 4, A, 0},
                                        {mid.data(), 500 * 4, A, 4 * 100000}};
  if (!supported) {
    EXPECT_EQ((*pair)->GetMany(ranges).status().code(),
              absl::StatusCode::kUnimplemented);
    return;
  }
  const uint64_t streams_before =
      static_cast<InlineTransport*>(server_)->served().read_region;
  auto gets = (*pair)->GetMany(ranges);
  ASSERT_TRUE(gets.ok()) << gets.status();
  ASSERT_EQ(gets->size(), ranges.size());
  absl::Status st = (*pair)->Wait(*gets, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(static_cast<InlineTransport*>(server_)->served().read_region,
            streams_before + 1);
  EXPECT_EQ(all, a);
  EXPECT_EQ(tail, std::vector<uint32_t>(b.begin() + 990, b.end()));
  EXPECT_EQ(one[0], a[7]);
  EXPECT_EQ(mid, std::vector<uint32_t>(a.begin() + 100000, a.begin() + 100500));
  auto none = (*pair)->GetMany({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  // A range outside its region, caught here: nothing posted.
  std::vector<GetRange> bad = ranges;
  bad[4].offset = n * 4 - 4;
  EXPECT_EQ((*pair)->GetMany(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A damaged key, caught by the peer before it sends a byte: every range
  // fails, the buffers are untouched.
  bad = ranges;
  bad[3].remote.key[0] ^= 1;
  std::fill(all.begin(), all.end(), 0);
  std::fill(tail.begin(), tail.end(), 0);
  gets = (*pair)->GetMany(bad);
  ASSERT_TRUE(gets.ok()) << gets.status();
  for (const auto& r : *gets) {
    EXPECT_EQ((*pair)->Wait({r}, absl::Now() + absl::Seconds(20)).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(all, std::vector<uint32_t>(n, 0));
  EXPECT_EQ(tail, std::vector<uint32_t>(10, 0));
}

// PutThenCall (inline only): the call's handler runs once every byte is in
// the region (checked there, for a put of one message, of several and of
// none), its answer or error is the request's; a call nobody answers ends
// at the caller's deadline, and its late answer is dropped. Other transports
// refuse it, posting nothing.
TEST_P(TransportTest, PutThenCallRunsTheCallOnceTheBytesAreIn) {
  const size_t n = (7 << 20) / 4 + 5;  // three WriteRegion messages
  std::vector<uint32_t> mem(n, 0);
  auto region = server_->Register(mem.data(), n * 4);
  ASSERT_TRUE(region.ok());
  const RemoteRegion remote = (*region)->Describe();
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok());
  const bool supported = server_->properties().put_then_call;
  EXPECT_EQ(supported, GetParam() == "inline");
  EXPECT_EQ(client_->properties().put_then_call, supported);
  std::vector<uint32_t> data = Pattern(n, 3);
  std::string reply;
  if (!supported) {
    EXPECT_EQ((*pair)
                  ->PutThenCall(data.data(), 64, remote, 0, 7, "x", &reply)
                  .status()
                  .code(),
              absl::StatusCode::kUnimplemented);
    return;
  }
  // The handler's header names a range; it answers with a hash of what the
  // region holds there (a reply stays small).
  auto hash = [](const void* p, size_t bytes) {
    return std::to_string(std::hash<std::string>()(
        std::string(static_cast<const char*>(p), bytes)));
  };
  absl::Mutex mu;
  Transport::CallAnswer held;
  ASSERT_TRUE(
      server_
          ->SetDeferredCallHandler(
              7,
              [&](const std::string& header, Transport::CallAnswer answer) {
                if (header == "hold") {
                  absl::MutexLock lock(&mu);
                  held = std::move(answer);
                  return;
                }
                if (header == "refuse") {
                  answer(absl::FailedPreconditionError("refused as asked"));
                  return;
                }
                size_t begin = 0, count = 0;
                std::sscanf(header.c_str(), "%zu %zu", &begin, &count);
                answer(hash(mem.data() + begin, count * 4));
              })
          .ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  struct Case {
    size_t begin, count;
  };
  for (const Case& c : {Case{0, n}, Case{17, 1000}, Case{40, 0}}) {
    auto r = (*pair)->PutThenCall(data.data() + c.begin, c.count * 4, remote,
                                  c.begin * 4, 7,
                                  absl::StrCat(c.begin, " ", c.count), &reply);
    ASSERT_TRUE(r.ok()) << r.status();
    absl::Status st = (*pair)->Wait({*r}, deadline);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(reply, hash(data.data() + c.begin, c.count * 4))
        << c.begin << " " << c.count;
  }
  // One WriteRegion stream each, the call on it: no SendMessage.
  const InlineTransport::Served served =
      static_cast<InlineTransport*>(server_)->served();
  EXPECT_EQ(served.write_region, 3u);
  EXPECT_EQ(served.write_region_calls, 3u);
  EXPECT_EQ(served.send_message, 0u);
  auto refused =
      (*pair)->PutThenCall(data.data(), 8, remote, 0, 7, "refuse", &reply);
  ASSERT_TRUE(refused.ok());
  absl::Status st = (*pair)->Wait({*refused}, deadline);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("refused as asked"), std::string::npos) << st;
  auto unknown =
      (*pair)->PutThenCall(data.data(), 8, remote, 0, 8, "x", &reply);
  ASSERT_TRUE(unknown.ok());
  st = (*pair)->Wait({*unknown}, deadline);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("no handler for call id 8"), std::string::npos)
      << st;
  EXPECT_EQ((*pair)
                ->PutThenCall(data.data(), 8, remote, n * 4 - 4, 7, "x", &reply)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pair)
                ->PutThenCall(data.data(), 8, remote, 0, 300, "x", &reply)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  reply = "untouched";
  auto late =
      (*pair)->PutThenCall(data.data(), 8, remote, 0, 7, "hold", &reply);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(
      (*pair)->Wait({*late}, absl::Now() + absl::Milliseconds(300)).code(),
      absl::StatusCode::kDeadlineExceeded);
  Transport::CallAnswer kept;
  {
    absl::MutexLock lock(&mu);
    kept = std::move(held);
  }
  ASSERT_TRUE(kept);
  kept(std::string("after the deadline"));
  EXPECT_EQ(reply, "untouched");
}

TEST_P(TransportTest, DamagedAddressesAreRefused) {
  EXPECT_EQ(client_->Connect("").status().code(),
            absl::StatusCode::kInvalidArgument);
  if (GetParam() != "ucx") return;  // an inline address is host:port
  std::string address = server_->address();
  for (size_t i : {address.size() - 1, address.size() / 2}) {
    std::string bad = address;
    bad[i] ^= 0x11;
    EXPECT_EQ(client_->Connect(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << i;
  }
  EXPECT_EQ(client_->Connect("").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Connect(address.substr(0, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportTest, ManyTransportsInOneProcess) {
  auto host = MakeHost(GetParam());
  ASSERT_TRUE(host.ok());
  std::vector<std::unique_ptr<Transport>> more;
  for (int i = 0; i < 2; ++i) {
    auto t = CreateTransport(GetParam(), "extra");
    ASSERT_TRUE(t.ok());
    more.push_back(std::move(*t));
  }
  std::vector<uint64_t> value = {42};
  auto region = host->t->Register(value.data(), 8);
  ASSERT_TRUE(region.ok());
  for (int i = 0; i < 2; ++i) {
    auto pair = more[i]->Connect(host->t->address());
    ASSERT_TRUE(pair.ok());
    uint64_t got = 0;
    auto r = (*pair)->Get(&got, 8, (*region)->Describe(), 0);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE((*pair)->Wait({*r}, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(got, 42u);
  }
  region->reset();
}

// One context, several transports (a trainer's per-shard workers): each
// reaches the others' memory both ways, and they keep the context alive.
TEST_P(TransportTest, TransportsOfOneContextReachEachOther) {
  auto context = CreateTransportContext(GetParam());
  ASSERT_TRUE(context.ok()) << context.status();
  EXPECT_EQ((*context)->name(), GetParam());
  auto a = MakeHost(GetParam(), context->get());
  auto b = MakeHost(GetParam(), context->get());
  ASSERT_TRUE(a.ok() && b.ok());
  context->reset();  // the transports hold it
  std::vector<uint64_t> in_a = {42, 0}, in_b = {7, 0};
  auto region_a = a->t->Register(in_a.data(), 16);
  auto region_b = b->t->Register(in_b.data(), 16);
  ASSERT_TRUE(region_a.ok() && region_b.ok());
  auto ab = a->t->Connect(b->t->address());
  auto ba = b->t->Connect(a->t->address());
  ASSERT_TRUE(ab.ok() && ba.ok());
  uint64_t got = 0;
  auto r = (*ba)->Get(&got, 8, (*region_a)->Describe(), 0);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*ba)->Wait({*r}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(got, 42u);
  const uint64_t put = 99;
  auto w = (*ab)->Put(&put, 8, (*region_b)->Describe(), 8);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*ab)->Wait({*w}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(in_b[1], 99u);
  ab->reset();
  ba->reset();
  region_a->reset();
  region_b->reset();
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportTest,
                         ::testing::Values("inline", "ucx"),
                         [](const auto& info) { return info.param; });

// The inline transport's server side checks what clients send: a forged key,
// a region id never issued, a range outside the region. Nothing is read or
// written then.
TEST(InlineTransportServerTest, ForgedKeysAndRangesAreInvalidArgument) {
  auto host = MakeHost("inline");
  ASSERT_TRUE(host.ok());
  std::vector<char> mem(1000, 'a');
  auto region = host->t->Register(mem.data(), mem.size());
  ASSERT_TRUE(region.ok());
  const RemoteRegion r = (*region)->Describe();
  auto stub = v1::InlineTransport::NewStub(grpc::CreateChannel(
      host->t->address(), grpc::InsecureChannelCredentials()));
  auto read = [&](uint64_t id, const std::string& key, uint64_t offset,
                  uint64_t size) {
    grpc::ClientContext ctx;
    v1::ReadRegionRequest req;
    req.set_region(id);
    req.set_key(key);
    req.set_offset(offset);
    req.set_size(size);
    auto reader = stub->ReadRegion(&ctx, req);
    v1::RegionBytes b;
    size_t got = 0;
    while (reader->Read(&b)) got += b.data().size();
    absl::Status st = FromGrpcStatus(reader->Finish());
    return std::make_pair(st, got);
  };
  std::string forged = r.key;
  forged[0] ^= 1;
  for (auto [st, got] :
       {read(r.address, forged, 0, 10), read(r.address + 99, r.key, 0, 10),
        read(r.address, r.key, 990, 11),
        read(r.address, r.key, UINT64_MAX, 2)}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(got, 0u);
  }
  EXPECT_TRUE(read(r.address, r.key, 990, 10).first.ok());
  // Further ranges: one bad one, or more than 4096, refuse the whole read.
  auto read_more = [&](const std::vector<v1::RegionRange>& more) {
    grpc::ClientContext ctx;
    v1::ReadRegionRequest req;
    req.set_region(r.address);
    req.set_key(r.key);
    req.set_size(10);
    for (const auto& m : more) *req.add_more() = m;
    auto reader = stub->ReadRegion(&ctx, req);
    v1::RegionBytes b;
    size_t got = 0;
    while (reader->Read(&b)) got += b.data().size();
    return std::make_pair(FromGrpcStatus(reader->Finish()), got);
  };
  v1::RegionRange good_range;
  good_range.set_region(r.address);
  good_range.set_key(r.key);
  good_range.set_offset(500);
  good_range.set_size(20);
  v1::RegionRange bad_range = good_range;
  bad_range.set_key(forged);
  auto [more_st, more_got] = read_more({good_range, good_range});
  EXPECT_TRUE(more_st.ok()) << more_st;
  EXPECT_EQ(more_got, 50u);
  for (auto [st, got] :
       {read_more({good_range, bad_range}),
        read_more(std::vector<v1::RegionRange>(4097, good_range))}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(got, 0u);
  }
  // Writes: refused the same way, memory untouched.
  for (auto [key, offset, size] :
       {std::make_tuple(forged, uint64_t{0}, size_t{5}),
        std::make_tuple(r.key, uint64_t{998}, size_t{5})}) {
    grpc::ClientContext ctx;
    v1::WriteRegionResponse resp;
    auto writer = stub->WriteRegion(&ctx, &resp);
    v1::WriteRegionChunk c;
    c.set_region(r.address);
    c.set_key(key);
    c.set_offset(offset);
    c.set_data(std::string(size, 'z'));
    writer->Write(c);
    writer->WritesDone();
    EXPECT_EQ(FromGrpcStatus(writer->Finish()).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(std::string(mem.begin(), mem.end()), std::string(1000, 'a'));
  // After deregistration the region is gone.
  region->reset();
  EXPECT_EQ(read(r.address, r.key, 0, 10).first.code(),
            absl::StatusCode::kInvalidArgument);
}

// WriteRegion chunks are parsed by hand from gRPC's slices: fields in any
// order and unknown fields are read as protobuf would; a chunk that does not
// parse (truncated, a bad wire type, data past its end) ends the call with
// INVALID_ARGUMENT before a byte of it moves, and so does a stream without
// a chunk, a call the stream cannot make (no deadline, an id past 255, a
// header over 1 MiB) and a chunk after the call's; chunks before a refused
// one stay written.
TEST(InlineTransportServerTest, WriteRegionChunksAreParsedStrictly) {
  auto host = MakeHost("inline");
  ASSERT_TRUE(host.ok());
  std::vector<char> mem(64, '.');
  auto region = host->t->Register(mem.data(), mem.size());
  ASSERT_TRUE(region.ok());
  const RemoteRegion r = (*region)->Describe();
  auto channel = grpc::CreateChannel(host->t->address(),
                                     grpc::InsecureChannelCredentials());
  const std::string method = absl::StrCat(
      "/", v1::InlineTransport::service_full_name(), "/WriteRegion");
  const grpc::internal::RpcMethod rpc(
      method.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
  // Sends each string as one raw message; the call's status and reply.
  auto write = [&](const std::vector<std::string>& messages,
                   bool with_deadline) {
    grpc::ClientContext ctx;
    if (with_deadline) {
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    }
    grpc::ByteBuffer reply;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channel.get(), rpc, &ctx, &reply));
    for (const std::string& m : messages) {
      grpc::Slice slice(m);
      grpc::ByteBuffer b(&slice, 1);
      if (!writer->Write(b)) break;
    }
    writer->WritesDone();
    absl::Status st = FromGrpcStatus(writer->Finish());
    v1::WriteRegionResponse resp;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (st.ok() && reply.Dump(&slices).ok()) {
      for (const auto& s : slices)
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    resp.ParseFromString(bytes);
    return std::make_pair(st, resp.bytes_written());
  };
  auto varint = [](uint64_t v) {
    std::string out;
    for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>(v | 0x80));
    out.push_back(static_cast<char>(v));
    return out;
  };
  auto region_field = [&] {
    std::string out(1, (1 << 3) | 1);
    for (int i = 0; i < 8; ++i)
      out.push_back(static_cast<char>(r.address >> (8 * i)));
    return out;
  };
  auto key_field = [&](const std::string& key) {
    return std::string(1, (2 << 3) | 2) + varint(key.size()) + key;
  };
  auto offset_field = [&](uint64_t offset) {
    return std::string(1, 3 << 3) + varint(offset);
  };
  auto data_field = [&](const std::string& data) {
    return std::string(1, (4 << 3) | 2) + varint(data.size()) + data;
  };
  auto call_fields = [&](uint32_t id, const std::string& header) {
    return std::string(1, 5 << 3) + varint(1) + std::string(1, 6 << 3) +
           varint(id) + std::string(1, (7 << 3) | 2) + varint(header.size()) +
           header;
  };
  // Data first, then the rest backwards, with an unknown varint field 9.
  auto [st, written] =
      write({data_field("abc") + std::string(1, 9 << 3) + varint(300) +
             offset_field(2) + key_field(r.key) + region_field()},
            false);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(written, 3u);
  EXPECT_EQ(std::string(mem.begin(), mem.begin() + 6), "..abc.");
  const std::string good =
      region_field() + key_field(r.key) + offset_field(10) + data_field("XY");
  std::string forged = r.key;
  forged[0] ^= 1;
  const std::string head = region_field() + key_field(r.key) + offset_field(20);
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{
           {},  // no chunk
           {head + std::string(1, (4 << 3) | 2) + varint(10) + "short"},
           {head + std::string(1, (5 << 3) | 7)},          // wire 7
           {head + std::string(1, (4 << 3) | 2)},          // no length
           {std::string(1, 0) + head + data_field("zz")},  // field 0
           {head + key_field(std::string(2000, 'k')) + data_field("zz")},
           {good, region_field() + key_field(forged) + offset_field(30) +
                      data_field("zz")},
           // A call on a stream without a deadline (this one's), with an
           // id past 255, with an oversized header.
           {good + call_fields(7, "h")},
           {good + call_fields(300, "h")},
           {good + call_fields(7, std::string((1 << 20) + 1, 'h'))},
       }) {
    auto [st, written] = write(bad, false);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  // With a deadline: a chunk after the one that carried the call.
  {
    auto [st, written] = write({good + call_fields(7, "h"), good}, true);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("after the one that carried the call"),
              std::string::npos)
        << st;
  }
  EXPECT_EQ(std::string(mem.begin(), mem.end()),
            "..abc.....XY" + std::string(52, '.'));
}

// ReadRegion's replies are encoded by hand (the bytes go out of the region
// without a copy): the stock protobuf parser must read them as RegionBytes,
// for reads of several messages, of one byte and of none.
TEST(InlineTransportServerTest, ReadRegionRepliesParseAsRegionBytes) {
  auto host = MakeHost("inline");
  ASSERT_TRUE(host.ok());
  std::vector<char> mem(7 << 20);
  for (size_t i = 0; i < mem.size(); ++i)
    mem[i] = static_cast<char>(i * 131 + (i >> 13));
  auto region = host->t->Register(mem.data(), mem.size());
  ASSERT_TRUE(region.ok());
  const RemoteRegion r = (*region)->Describe();
  auto stub = v1::InlineTransport::NewStub(grpc::CreateChannel(
      host->t->address(), grpc::InsecureChannelCredentials()));
  for (auto [offset, size] : {std::make_pair(size_t{3}, mem.size() - 5),
                              std::make_pair(size_t{9}, size_t{1}),
                              std::make_pair(size_t{100}, size_t{0})}) {
    grpc::ClientContext ctx;
    v1::ReadRegionRequest req;
    req.set_region(r.address);
    req.set_key(r.key);
    req.set_offset(offset);
    req.set_size(size);
    auto reader = stub->ReadRegion(&ctx, req);
    v1::RegionBytes b;
    std::string got;
    int messages = 0;
    while (reader->Read(&b)) {
      got += b.data();
      ++messages;
    }
    ASSERT_TRUE(FromGrpcStatus(reader->Finish()).ok());
    EXPECT_EQ(got, std::string(mem.data() + offset, size))
        << "offset " << offset;
    EXPECT_GE(messages, size > (3 << 20) ? 2 : 1);
  }
}

// A pinned range keeps its region: destroying the region waits until the
// last pin is dropped (gRPC may still be sending from it).
TEST(InlineTransportServerTest, RegionDestructionWaitsForPins) {
  InlineTransport t("test");
  auto region = t.Allocate(4096);
  ASSERT_TRUE(region.ok());
  std::memset((*region)->data(), 'q', 4096);
  const RemoteRegion r = (*region)->Describe();
  auto pin = t.PinRange(r.address, r.key, 100, 50);
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_EQ(std::string((*pin)->data(), (*pin)->size()), std::string(50, 'q'));
  EXPECT_EQ(t.PinRange(r.address, r.key, 4000, 97).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    region->reset();
    destroyed = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(destroyed.load());
  // No new pins once destruction began.
  EXPECT_EQ(t.PinRange(r.address, r.key, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pin)->data()[0], 'q');  // still readable
  pin->reset();
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

}  // namespace
}  // namespace zshard
