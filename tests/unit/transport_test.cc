// Transports against their contract, parameterized over every transport
// built (a transport that is not built is skipped, never faked).
#include "common/transport.h"

#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

#ifdef ZSHARD_HAVE_UCX
#include "common/ucx_transport.h"
#endif

namespace zshard {
namespace {

absl::StatusOr<std::unique_ptr<Transport>> Make(const std::string& name,
                                                const std::string& label) {
#ifdef ZSHARD_HAVE_UCX
  if (name == "ucx") {
    UcxTransportOptions o;
    o.label = label;
    return CreateUcxTransport(o);
  }
#endif
  return absl::UnimplementedError(name + " is not built");
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto a = Make(GetParam(), "server");
    if (absl::IsUnimplemented(a.status())) GTEST_SKIP() << a.status().message();
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = Make(GetParam(), "trainer");
    ASSERT_TRUE(b.ok()) << b.status();
    server_ = std::move(*a);
    client_ = std::move(*b);
  }

  std::unique_ptr<Transport> server_, client_;
};

std::vector<uint32_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u) ^ seed;
  return v;
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
  EXPECT_EQ(0, std::memcmp(part.data(), published.data() + 12345, part.size() * 4));

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
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << offset << "+" << size;
    auto w = (*pair)->Put(out.data(), size, remote, offset);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << offset << "+" << size;
  }
  for (size_t i : {size_t{0}, size_t{5}, remote.key.size() - 1}) {
    RemoteRegion forged = remote;
    forged.key[i] ^= 0x20;
    auto r = (*pair)->Get(out.data(), 16, forged, 0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << i;
  }
  RemoteRegion truncated = remote;
  truncated.key.resize(7);
  EXPECT_EQ((*pair)->Get(out.data(), 16, truncated, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(mem.begin(), mem.end()), std::string(4096, 'x'));
  // The pair still works.
  auto ok = (*pair)->Get(out.data(), 4096, remote, 0);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*pair)->Wait({*ok}, absl::Now() + absl::Seconds(10)).ok());
}

TEST_P(TransportTest, MessagesReachTheHandlerSmallAndLarge) {
  absl::Mutex mu;
  std::vector<std::pair<std::string, std::vector<char>>> got;
  ASSERT_TRUE(server_
                  ->SetHandler(3,
                               [&](const std::string& header, const void* payload, size_t size) {
                                 absl::MutexLock lock(&mu);
                                 const char* p = static_cast<const char*>(payload);
                                 got.emplace_back(header, std::vector<char>(p, p + size));
                               })
                  .ok());
  EXPECT_EQ(server_->SetHandler(3, nullptr).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(server_->SetHandler(300, nullptr).code(), absl::StatusCode::kInvalidArgument);
  auto pair = client_->Connect(server_->address());
  ASSERT_TRUE(pair.ok());
  std::vector<char> small(100, 's'), large(8 << 20);
  std::iota(large.begin(), large.end(), 0);
  auto s1 = (*pair)->Send(3, "small", small.data(), small.size());
  auto s2 = (*pair)->Send(3, "large", large.data(), large.size());
  ASSERT_TRUE(s1.ok() && s2.ok());
  ASSERT_TRUE((*pair)->Wait({*s1, *s2}, absl::Now() + absl::Seconds(20)).ok());
  absl::MutexLock lock(&mu);
  auto two = [&got]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return got.size() == 2; };
  ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(&two), absl::Now() + absl::Seconds(20)));
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got[0].first, "large");
  EXPECT_EQ(got[0].second, large);
  EXPECT_EQ(got[1].first, "small");
  EXPECT_EQ(got[1].second, small);
}

TEST_P(TransportTest, DamagedAddressesAreRefused) {
  std::string address = server_->address();
  for (size_t i : {address.size() - 1, address.size() / 2}) {
    std::string bad = address;
    bad[i] ^= 0x11;
    EXPECT_EQ(client_->Connect(bad).status().code(), absl::StatusCode::kInvalidArgument) << i;
  }
  EXPECT_EQ(client_->Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Connect(address.substr(0, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportTest, ManyTransportsInOneProcess) {
  std::vector<std::unique_ptr<Transport>> more;
  for (int i = 0; i < 3; ++i) {
    auto t = Make(GetParam(), "extra");
    ASSERT_TRUE(t.ok());
    more.push_back(std::move(*t));
  }
  std::vector<uint64_t> value = {42};
  auto region = more[0]->Register(value.data(), 8);
  ASSERT_TRUE(region.ok());
  for (int i = 1; i < 3; ++i) {
    auto pair = more[i]->Connect(more[0]->address());
    ASSERT_TRUE(pair.ok());
    uint64_t got = 0;
    auto r = (*pair)->Get(&got, 8, (*region)->Describe(), 0);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE((*pair)->Wait({*r}, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(got, 42u);
  }
  region->reset();
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportTest, ::testing::Values("ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zshard
