// The shard service through gRPC: in-process channels for the contract and
// bad inputs; a second shard on 127.0.0.1:0 announcing itself to shard 0.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <optional>

#include "absl/synchronization/notification.h"
#include "common/transport/inline/inline_transport.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/in_process_shards.h"
#include "tests/test_models.h"
#include "zshard/v1/health.grpc.pb.h"

namespace zshard {
namespace {

using testing::MakeSpec;
using testing::ShardValues;

class ShardServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { EnableGrpcProcessDefaults(); }

  void SetUp() override {
    spec_ = MakeSpec({{10, 7}, {33}, {5}});
    ShardServerOptions o;
    o.service.store.alignment = 4;
    o.service.store.persistence_threshold = 0;
    o.service.store.world_size = 2;
    o.service.wait_timeout = absl::Seconds(5);
    o.transport = "inline";
    auto servers = testing::StartShards(o, 2);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
    stub_ = v1::ShardService::NewStub(servers_[1]->InProcessChannel());
    admin_ = v1::AdminService::NewStub(servers_[1]->InProcessChannel());
    auto map = PartitionMap::Create(spec_, 2, 4, 0);
    ASSERT_TRUE(map.ok());
    map_ = std::make_unique<PartitionMap>(*map);
    client_transport_ =
        std::make_unique<InlineTransport>("shard_service_test trainer");
  }

  grpc::Status Register(const v1::ModelSpec& spec, uint32_t shard) {
    grpc::ClientContext ctx;
    v1::RegisterModelResponse resp;
    auto writer = stub_->RegisterModel(&ctx, &resp);
    v1::RegisterModelChunk head;
    *head.mutable_spec() = spec;
    writer->Write(head);
    for (const ValueChunk& c : ShardValues(*map_, shard)) {
      v1::RegisterModelChunk chunk;
      chunk.set_group(c.group);
      chunk.set_offset(c.offset);
      chunk.set_data(c.values.data(), c.values.size() * sizeof(float));
      writer->Write(chunk);
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // All of shard 1's values, group by group (read in process).
  std::vector<std::vector<float>> Snapshot() {
    std::vector<std::vector<float>> out;
    for (uint32_t g = 0; g < 3; ++g) {
      auto snap = servers_[1]->service().store().ReadSlice(
          g, 0, absl::Now() + absl::Seconds(5), {});
      EXPECT_TRUE(snap.ok()) << snap.status();
      out.push_back(snap.ok() ? snap->values : std::vector<float>{});
    }
    return out;
  }

  grpc::Status Lease(uint32_t group, uint64_t min_version, uint32_t rank,
                     v1::LeaseResponse* resp,
                     absl::Duration timeout = absl::Seconds(5),
                     v1::DType dtype = v1::FLOAT32) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1::LeaseRequest req;
    req.set_group(group);
    req.set_min_version(min_version);
    req.set_dtype(dtype);
    req.set_trainer_rank(rank);
    return stub_->Lease(&ctx, req, resp);
  }

  grpc::Status Landed(uint32_t group, uint64_t step, uint32_t rank,
                      v1::DType dtype = v1::FLOAT32,
                      std::optional<uint32_t> slot = std::nullopt) {
    grpc::ClientContext ctx;
    v1::LandedRequest req;
    req.set_group(group);
    req.set_step(step);
    req.set_trainer_rank(rank);
    req.set_dtype(dtype);
    if (slot) req.set_slot(*slot);
    v1::LandedResponse resp;
    return stub_->Landed(&ctx, req, &resp);
  }

  grpc::Status Reserve(uint32_t group, uint64_t step, uint32_t rank,
                       v1::ReserveLandingResponse* resp,
                       absl::Duration timeout = absl::Seconds(5)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1::ReserveLandingRequest req;
    req.set_group(group);
    req.set_step(step);
    req.set_trainer_rank(rank);
    req.set_dtype(v1::FLOAT32);
    return stub_->ReserveLanding(&ctx, req, resp);
  }

  // What a trainer does for its contribution: a landing slot, a put of
  // `value` everywhere into it over the inline transport, then Landed.
  grpc::Status Push(uint32_t group, uint64_t step, uint32_t rank, float value) {
    v1::ReserveLandingResponse grant;
    grpc::Status st = Reserve(group, step, rank, &grant);
    if (!st.ok()) return st;
    auto pair = client_transport_->Connect(servers_[1]->transport()->address());
    EXPECT_TRUE(pair.ok()) << pair.status();
    std::vector<float> grad(grant.landing_elements(), value);
    RemoteRegion landing{grant.region().address(), grant.region().size(),
                         grant.region().key()};
    auto put = (*pair)->Put(grad.data(), grad.size() * sizeof(float), landing,
                            grant.offset());
    EXPECT_TRUE(put.ok()) << put.status();
    EXPECT_TRUE((*pair)->Wait({*put}, absl::Now() + absl::Seconds(5)).ok());
    return Landed(group, step, rank, v1::FLOAT32, grant.slot());
  }

  v1::ModelSpec spec_;
  std::vector<std::unique_ptr<ShardServer>> servers_;
  std::unique_ptr<v1::ShardService::Stub> stub_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<PartitionMap> map_;
  std::unique_ptr<InlineTransport> client_transport_;
};

TEST_F(ShardServiceTest, JoinAssignsRanksAndListsShards) {
  auto stub0 = v1::ShardService::NewStub(servers_[0]->InProcessChannel());
  for (int expect = 0; expect < 2; ++expect) {
    grpc::ClientContext ctx;
    v1::JoinRequest req;
    req.set_requested_rank(-1);
    req.set_instance_id(100 + expect);
    v1::JoinResponse resp;
    ASSERT_TRUE(stub0->Join(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.rank(), static_cast<uint32_t>(expect));
    EXPECT_EQ(resp.world_size(), 2u);
    EXPECT_GT(resp.heartbeat_interval_ms(), 0u);
    ASSERT_EQ(resp.shards_size(), 2);
    EXPECT_EQ(resp.shards(1).endpoint(), servers_[1]->endpoint());
  }
  v1::JoinRequest req;
  req.set_requested_rank(-1);
  req.set_instance_id(200);
  v1::JoinResponse resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub0->Join(&ctx, req, &resp).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  {
    // A rank a live process holds is not taken over.
    grpc::ClientContext ctx;
    req.set_requested_rank(1);
    grpc::Status st = stub0->Join(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_NE(st.error_message().find("trainer rank 1 is held by"),
              std::string::npos)
        << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    req.set_requested_rank(5);
    EXPECT_EQ(stub0->Join(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    // Every process names itself.
    grpc::ClientContext ctx;
    req.set_requested_rank(-1);
    req.set_instance_id(0);
    EXPECT_EQ(stub0->Join(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    // A heartbeat from a process that holds no rank is refused.
    grpc::ClientContext ctx;
    v1::HeartbeatRequest hb;
    hb.set_trainer_rank(0);
    hb.set_instance_id(999);
    v1::HeartbeatResponse hr;
    EXPECT_EQ(stub0->Heartbeat(&ctx, hb, &hr).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
}

TEST_F(ShardServiceTest, HealthServiceAnswers) {
  auto health =
      grpc::health::v1::Health::NewStub(servers_[0]->InProcessChannel());
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  for (const std::string service : {"", "zshard.v1.ShardService"}) {
    grpc::ClientContext ctx;
    req.set_service(service);
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok()) << service;
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  grpc::ClientContext unknown_ctx;
  req.set_service("no.such.Service");
  const grpc::Status unknown = health->Check(&unknown_ctx, req, &resp);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(unknown.error_message().find("no.such.Service"), std::string::npos);
  // The wire bytes of a SERVING answer to an empty request, as any probe
  // sends them.
  grpc::GenericStub generic(servers_[0]->InProcessChannel());
  grpc::ClientContext ctx;
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request_bytes(&empty, 1), response_bytes;
  grpc::Status result;
  absl::Notification done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                    &request_bytes, &response_bytes, [&](grpc::Status s) {
                      result = s;
                      done.Notify();
                    });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(result.ok()) << result.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response_bytes.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

// Server reflection (what grpcurl uses): list_services names our service.
TEST_F(ShardServiceTest, ReflectionListsTheService) {
  grpc::GenericStub generic(servers_[0]->InProcessChannel());
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto next = [&cq](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    auto st = cq.AsyncNext(
        &tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(5));
    return st == grpc::CompletionQueue::GOT_EVENT && ok &&
           reinterpret_cast<intptr_t>(tag) == want;
  };
  auto call = generic.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(next(1));
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited.
  grpc::Slice request_slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&request_slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(next(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(next(3));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(next(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(next(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (auto& sl : slices) {
    bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  EXPECT_NE(bytes.find("zshard.v1.ShardService"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(ShardServiceTest, RegisterIsIdempotentAndRefusesAnotherSpec) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  ASSERT_TRUE(Register(spec_, 1).ok());
  const auto before = Snapshot();
  auto other = MakeSpec({{10, 7}, {34}, {5}});
  grpc::Status st = Register(other, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("tensor 't2' has shape [33] vs [34]"),
            std::string::npos)
      << st.error_message();
  EXPECT_EQ(Snapshot(), before);
}

TEST_F(ShardServiceTest, BadLeasesAndLandingClaimsChangeNothing) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  const auto before = Snapshot();
  v1::LeaseResponse lease;
  EXPECT_EQ(Lease(9, 0, 0, &lease).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Lease(1, 0, 7, &lease).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // A quantized copy from a shard that publishes none; a dtype that never
  // travels on the data plane.
  grpc::Status quantized =
      Lease(1, 0, 0, &lease, absl::Seconds(5), v1::INT8_BLOCKS);
  EXPECT_EQ(quantized.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(quantized.error_message().find("zero_quantized_weights"),
            std::string::npos)
      << quantized.error_message();
  EXPECT_EQ(Lease(1, 0, 0, &lease, absl::Seconds(5), v1::FLOAT16).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Landed(1, 0, 0, v1::FP8_E4M3_BLOCKS).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Steps from the future; unknown group; rank out of range; a dtype the
  // shard does not land.
  EXPECT_EQ(Landed(1, 1, 0).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Landed(9, 0, 0).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Landed(1, 0, 7).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Landed(1, 0, 0, v1::FLOAT16).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Landed(1, 0, 0, v1::BFLOAT16).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Landed with no slot reserved, or another slot than the one reserved.
  grpc::Status bare = Landed(1, 0, 0);
  EXPECT_EQ(bare.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(bare.error_message().find("without a landing slot"),
            std::string::npos)
      << bare.error_message();
  v1::ReserveLandingResponse grant;
  EXPECT_EQ(Reserve(1, 1, 0, &grant).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // future step
  EXPECT_EQ(Reserve(1, 0, 7, &grant).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Reserve(9, 0, 0, &grant).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Reserve(1, 0, 0, &grant).ok());
  EXPECT_EQ(Reserve(1, 0, 0, &grant).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // reserved already
  grpc::Status wrong = Landed(1, 0, 0, v1::FLOAT32, grant.slot() + 1);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(wrong.error_message().find("but reserved slot"), std::string::npos)
      << wrong.error_message();
  // The reservation is given up again (what a broken push leaves behind).
  servers_[1]->service().store().AbortContribution(1, 0, 0, 0);
  EXPECT_EQ(Snapshot(), before);

  // Both trainers push: version 1. A push for step 0 is then from the past.
  ASSERT_TRUE(Push(1, 0, 0, 0.5f).ok());
  EXPECT_EQ(Landed(1, 0, 0).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // twice
  ASSERT_TRUE(Push(1, 0, 1, -0.25f).ok());
  ASSERT_TRUE(Lease(1, 1, 0, &lease).ok());  // waits for the update engine
  EXPECT_EQ(lease.version(), 1u);
  const auto after_step = Snapshot();
  EXPECT_NE(after_step[1], before[1]);
  grpc::Status past = Landed(1, 0, 0);
  EXPECT_EQ(past.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(past.error_message().find("past"), std::string::npos);
  EXPECT_EQ(Snapshot(), after_step);

  grpc::ClientContext ctx;
  v1::GetStatusResponse status;
  ASSERT_TRUE(admin_->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.groups(1).version(), 1u);
  EXPECT_EQ(status.groups(0).version(), 0u);
  EXPECT_EQ(status.bytes_pushed(), 2 * map_->slice(1, 1).size() * 4);
}

// A Landed answer may carry a landing credit: a slot for the trainer's next
// contribution to the shard, whatever its group, used without a
// reservation, and only by that trainer.
TEST_F(ShardServiceTest, LandingCreditsStandInForAReservationOnce) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  auto pair = client_transport_->Connect(servers_[1]->transport()->address());
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto put = [&](const v1::TransportRegion& r, uint64_t offset, size_t n) {
    std::vector<float> grad(n, 0.5f);
    auto p = (*pair)->Put(grad.data(), n * sizeof(float),
                          RemoteRegion{r.address(), r.size(), r.key()}, offset);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE((*pair)->Wait({*p}, absl::Now() + absl::Seconds(5)).ok());
  };
  auto landed = [&](uint32_t group, uint32_t rank, uint32_t slot, bool credit,
                    v1::LandedResponse* resp) {
    grpc::ClientContext ctx;
    v1::LandedRequest req;
    req.set_group(group);
    req.set_trainer_rank(rank);
    req.set_dtype(v1::FLOAT32);
    req.set_slot(slot);
    req.set_credit(credit);
    req.set_want_credit(true);
    return stub_->Landed(&ctx, req, resp);
  };
  v1::ReserveLandingResponse grant;
  ASSERT_TRUE(Reserve(1, 0, 0, &grant).ok());
  put(grant.region(), grant.offset(), grant.landing_elements());
  v1::LandedResponse resp;
  ASSERT_TRUE(landed(1, 0, grant.slot(), false, &resp).ok());
  ASSERT_TRUE(resp.has_credit());
  const v1::LandingCredit credit = resp.credit();
  EXPECT_GE(credit.capacity_elements(), map_->slice(0, 1).size());
  // Not rank 1's credit; then rank 0 uses it for another group.
  grpc::Status other = landed(0, 1, credit.slot(), true, &resp);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(other.error_message().find("is not trainer 1's landing credit"),
            std::string::npos)
      << other.error_message();
  put(credit.region(), credit.offset(), map_->slice(0, 1).size());
  resp.Clear();
  ASSERT_TRUE(landed(0, 0, credit.slot(), true, &resp).ok());
  EXPECT_TRUE(resp.has_credit());  // the next one (once is LandingPoolTest's)
  EXPECT_EQ(servers_[1]->service().store().Progress()[0].waiting_for_ranks,
            std::vector<uint32_t>{1});
}

// Landed over the transport: a header that does not parse, or a token that
// is not the rank's from its last Join, is refused naming it and changes
// nothing.
TEST_F(ShardServiceTest, TransportLandedCallsNeedTheRanksToken) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  auto pair = client_transport_->Connect(servers_[1]->transport()->address());
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto call = [&](const std::string& header) {
    std::string reply;
    auto r = (*pair)->Call(v1::TRANSPORT_CALL_LANDED, header, &reply);
    if (!r.ok()) return r.status();
    return (*pair)->Wait({*r}, absl::Now() + absl::Seconds(10));
  };
  const auto before = servers_[1]->service().store().Progress();
  absl::Status garbage = call("\xff\xff not a LandedCall");
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument) << garbage;
  v1::LandedCall landed;
  landed.mutable_request()->set_group(1);
  landed.mutable_request()->set_trainer_rank(0);
  landed.mutable_request()->set_dtype(v1::FLOAT32);
  landed.set_token(12345);
  absl::Status forged = call(landed.SerializeAsString());
  EXPECT_EQ(forged.code(), absl::StatusCode::kPermissionDenied) << forged;
  EXPECT_NE(forged.message().find("call token"), std::string::npos) << forged;
  const auto after = servers_[1]->service().store().Progress();
  ASSERT_EQ(before.size(), after.size());
  for (size_t g = 0; g < before.size(); ++g) {
    EXPECT_EQ(before[g].waiting_for_ranks, after[g].waiting_for_ranks);
  }
}

// Reservations and heartbeats over the transport are checked as Landed is:
// a header that does not parse, or a token that is not the rank's, is
// refused naming it and takes no slot; a heartbeat to a shard other than the
// coordinator is UNAVAILABLE (the trainer then heartbeats over gRPC).
TEST_F(ShardServiceTest, TransportReservationsAndHeartbeatsNeedTheRanksToken) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  auto call = [&](uint32_t shard, v1::TransportCall id,
                  const std::string& header) {
    auto pair =
        client_transport_->Connect(servers_[shard]->transport()->address());
    if (!pair.ok()) return pair.status();
    std::string reply;
    auto r = (*pair)->Call(id, header, &reply);
    if (!r.ok()) return r.status();
    return (*pair)->Wait({*r}, absl::Now() + absl::Seconds(10));
  };
  const v1::TransportCall reserve = v1::TRANSPORT_CALL_RESERVE_LANDING;
  const v1::TransportCall beat = v1::TRANSPORT_CALL_HEARTBEAT;
  absl::Status garbage = call(1, reserve, "\xff\xff not a call");
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument) << garbage;
  EXPECT_NE(garbage.message().find("ReserveLandingCall"), std::string::npos)
      << garbage;
  garbage = call(0, beat, "\xff\xff not a call");
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument) << garbage;

  v1::ReserveLandingCall reservation;
  reservation.mutable_request()->set_group(1);
  reservation.mutable_request()->set_trainer_rank(0);
  reservation.mutable_request()->set_dtype(v1::FLOAT32);
  reservation.set_token(12345);
  absl::Status forged = call(1, reserve, reservation.SerializeAsString());
  EXPECT_EQ(forged.code(), absl::StatusCode::kPermissionDenied) << forged;
  EXPECT_NE(forged.message().find("call token"), std::string::npos) << forged;
  EXPECT_EQ(servers_[1]->service().store().Memory().landing_slots_peak, 0u);

  v1::HeartbeatCall heartbeat;
  heartbeat.mutable_request()->set_trainer_rank(0);
  heartbeat.mutable_request()->set_instance_id(7);
  heartbeat.set_token(12345);
  forged = call(0, beat, heartbeat.SerializeAsString());
  EXPECT_EQ(forged.code(), absl::StatusCode::kPermissionDenied) << forged;
  absl::Status elsewhere = call(1, beat, heartbeat.SerializeAsString());
  EXPECT_EQ(elsewhere.code(), absl::StatusCode::kUnavailable) << elsewhere;
  EXPECT_NE(elsewhere.message().find("coordinator"), std::string::npos)
      << elsewhere;
}

TEST_F(ShardServiceTest, StatusShowsWhichTrainersAStepWaitsFor) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  ASSERT_TRUE(Push(0, 0, 1, 1.0f).ok());
  grpc::ClientContext ctx;
  v1::GetStatusResponse status;
  ASSERT_TRUE(admin_->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok());
  ASSERT_EQ(status.groups(0).waiting_for_ranks_size(), 1);
  EXPECT_EQ(status.groups(0).waiting_for_ranks(0), 0u);
}

// One Lease call for several groups (a prefetch batch): the grants come in
// the order asked; a call naming an unknown group holds nothing; the number
// of groups per call is bounded.
TEST_F(ShardServiceTest, LeaseOfSeveralGroupsIsAllOrNothing) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  auto lease_many = [this](const std::vector<uint32_t>& groups,
                           v1::LeaseResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::LeaseRequest req;
    req.set_group(groups[0]);
    for (size_t i = 1; i < groups.size(); ++i) req.add_more_groups(groups[i]);
    req.set_dtype(v1::FLOAT32);
    req.set_trainer_rank(0);
    return stub_->Lease(&ctx, req, resp);
  };
  auto active = [this]() -> uint64_t {
    uint64_t n = 0;
    for (const auto& [rank, stats] :
         servers_[1]->service().store().LeaseStats()) {
      n += stats.active;
    }
    return n;
  };
  v1::LeaseResponse resp;
  ASSERT_TRUE(lease_many({2, 0, 1}, &resp).ok());
  ASSERT_EQ(resp.more_size(), 2);
  const uint32_t order[] = {2, 0, 1};
  for (int i = 0; i < 3; ++i) {
    const v1::LeaseResponse& grant = i == 0 ? resp : resp.more(i - 1);
    EXPECT_EQ(grant.elements(), map_->slice(order[i], 1).size()) << i;
    EXPECT_EQ(grant.version(), 0u);
    EXPECT_EQ(grant.values().size(), grant.elements() * 4);
  }
  EXPECT_EQ(active(), 3u);
  grpc::Status unknown = lease_many({0, 1, 9}, &resp);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(active(), 3u);  // the call's first two grants were given back
  std::vector<uint32_t> too_many(4097, 0);
  EXPECT_EQ(lease_many(too_many, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(active(), 3u);
}

TEST_F(ShardServiceTest, LeaseOfAFutureVersionEndsAtTheDeadline) {
  ASSERT_TRUE(Register(spec_, 1).ok());
  v1::LeaseResponse lease;
  const absl::Time start = absl::Now();
  EXPECT_EQ(Lease(0, 3, 0, &lease, absl::Milliseconds(300)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

TEST(ShardServiceCheckpointTest, ShardsWithOtherCheckpointSettingsAreRefused) {
  char tmpl[] = "/tmp/zshard_settings_XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  ShardServerOptions o;
  o.service.store.num_shards = 2;
  o.service.store.checkpoint.root = root;
  o.service.store.checkpoint_interval = 10;
  auto coordinator = ShardServer::Start(o);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ShardServerOptions other = o;
  other.service.store.shard_id = 1;
  other.coordinator = (*coordinator)->endpoint();
  other.announce_timeout = absl::Seconds(5);
  other.service.store.checkpoint_interval = 20;
  auto refused = ShardServer::Start(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("interval_steps=20"),
            std::string::npos)
      << refused.status();
  other.service.store.checkpoint.root.clear();
  refused = ShardServer::Start(other);
  EXPECT_NE(refused.status().message().find("'off'"), std::string::npos)
      << refused.status();
  other.service.store.checkpoint = o.service.store.checkpoint;
  other.service.store.checkpoint_interval = 10;
  auto same = ShardServer::Start(other);
  EXPECT_TRUE(same.ok()) << same.status();
  std::system(("rm -rf " + root).c_str());
}

}  // namespace
}  // namespace zshard
