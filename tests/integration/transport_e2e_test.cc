// The data plane with real processes (zshard-server, zshard-train,
// zshardctl) on 127.0.0.1: the same bits over ucx and inline; a server
// killed mid-run is reported as UNAVAILABLE naming it within the deadline; a
// killed trainer's leases end at their deadline and show in status; forged
// keys, lease ids and landing claims are refused with INVALID_ARGUMENT.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/transport/transport_factory.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"
#include "tests/integration/tiny_run.h"
#include "zshard/v1/inline_transport.grpc.pb.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {
namespace {

using testing::Process;
namespace fs = std::filesystem;

std::string MakeTempDir() {
  std::string tmpl =
      (fs::temp_directory_path() / "zstransport.XXXXXX").string();
  return mkdtemp(tmpl.data());
}

class Cluster {
 public:
  Cluster(std::string dir, std::string tag)
      : dir_(std::move(dir)), tag_(std::move(tag)) {
    config_ = dir_ + "/config-" + tag_ + ".json";
    std::ofstream(config_) << testing::TinyRunConfig();
  }

  void Start(int shards, int trainers, const std::vector<std::string>& extra) {
    for (int s = 0; s < shards; ++s) {
      const std::string port_file = absl::StrCat(dir_, "/port-", tag_, "-", s);
      std::vector<std::string> argv = {ZSHARD_SERVER_BIN,
                                       "--listen=127.0.0.1:0",
                                       "--port_file=" + port_file,
                                       absl::StrCat("--shard_id=", s),
                                       absl::StrCat("--num_shards=", shards),
                                       absl::StrCat("--trainers=", trainers),
                                       "--config=" + config_};
      if (s > 0) argv.push_back("--coordinator=" + coordinator_);
      for (const auto& f : extra) argv.push_back(f);
      servers_.push_back(std::make_unique<Process>(
          argv, absl::StrCat(dir_, "/server-", tag_, "-", s)));
      const int port = testing::WaitForPortFile(port_file, *servers_.back(),
                                                absl::Seconds(60));
      ASSERT_GT(port, 0) << servers_.back()->Stderr();
      if (s == 0) coordinator_ = absl::StrCat("127.0.0.1:", port);
    }
  }

  Process& StartTrainer(int rank, int steps,
                        const std::vector<std::string>& extra) {
    std::vector<std::string> argv = testing::TinyTrainerArgv(
        ZSHARD_TRAIN_BIN, coordinator_, config_, rank, steps, params_path());
    for (const auto& f : extra) argv.push_back(f);
    trainers_.push_back(std::make_unique<Process>(
        argv, absl::StrCat(dir_, "/trainer-", tag_, "-", rank)));
    return *trainers_.back();
  }

  std::string params_path() const { return dir_ + "/params-" + tag_ + ".bin"; }
  const std::string& coordinator() const { return coordinator_; }
  Process& server(int s) { return *servers_[s]; }

 private:
  std::string dir_, tag_, config_, coordinator_;
  std::vector<std::unique_ptr<Process>> servers_, trainers_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

bool UcxBuilt() { return DefaultTransportName() == "ucx"; }

TEST(TransportE2ETest, UcxShmUcxTcpAndInlineGiveBitIdenticalParameters) {
  if (!UcxBuilt()) GTEST_SKIP() << "ucx is not built";
  const std::string dir = MakeTempDir();
  std::string params[3], out[3];
  const char* planes[3] = {"ucx", "inline", "ucx"};
  for (int i = 0; i < 3; ++i) {
    // The third run: ucx restricted to tcp (servers and trainers inherit it).
    if (i == 2) setenv("UCX_TLS", "tcp", 1);
    Cluster c(dir, absl::StrCat(planes[i], i));
    c.Start(4, 2, {absl::StrCat("--transport=", planes[i])});
    if (HasFatalFailure()) return;
    std::vector<Process*> t;
    for (int r = 0; r < 2; ++r) t.push_back(&c.StartTrainer(r, 20, {}));
    for (int r = 0; r < 2; ++r) {
      auto code = t[r]->Wait(absl::Seconds(300));
      ASSERT_TRUE(code.has_value());
      ASSERT_EQ(*code, 0) << t[r]->Stderr();
    }
    params[i] = ReadAll(c.params_path());
    out[i] = t[0]->Stdout();
    if (i == 2) unsetenv("UCX_TLS");
  }
  EXPECT_NE(out[0].find("data plane ucx over shard 0: "), std::string::npos)
      << out[0];
  // On one machine UCX ends up on shared memory.
  EXPECT_NE(out[0].find("posix/memory"), std::string::npos) << out[0];
  EXPECT_EQ(out[0].find("tcp/"), std::string::npos) << out[0];
  EXPECT_NE(out[1].find("data plane inline over shard 0: grpc"),
            std::string::npos)
      << out[1];
  EXPECT_NE(out[2].find("data plane ucx over shard 0: tcp/"), std::string::npos)
      << out[2];
  ASSERT_GT(params[0].size(), 0u);
  EXPECT_EQ(params[0].size(), params[1].size());
  EXPECT_TRUE(params[0] == params[1])
      << "final parameters differ between ucx and inline";
  EXPECT_TRUE(params[0] == params[2])
      << "final parameters differ between ucx on shm and on tcp";
  fs::remove_all(dir);
}

class TransportFailureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "ucx" && !UcxBuilt()) GTEST_SKIP() << "ucx is not built";
    dir_ = MakeTempDir();
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_P(TransportFailureTest,
       KilledServerIsUnavailableNamingTheShardWithinTheDeadline) {
  Cluster c(dir_, "kill");
  c.Start(2, 1, {"--transport=" + GetParam()});
  if (HasFatalFailure()) return;
  // Without a rejoin: no replacement is coming (with one, the trainer would
  // wait --rejoin_timeout_s for it; shard_replace_e2e_test).
  Process& trainer =
      c.StartTrainer(0, 100000, {"--rpc_timeout_s=2", "--rejoin_timeout_s=0"});
  // Let it train, then kill -9 shard 1 while fetches and pushes run.
  for (int i = 0;
       i < 500 && trainer.Stdout().find("data plane") == std::string::npos;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::SleepFor(absl::Milliseconds(300));
  c.server(1).Kill();
  const absl::Time killed = absl::Now();
  auto code = trainer.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.has_value()) << "the trainer hangs after its shard died";
  const absl::Duration took = absl::Now() - killed;
  EXPECT_NE(*code, 0);
  const std::string err = trainer.Stderr();
  EXPECT_NE(err.find("UNAVAILABLE"), std::string::npos) << err;
  EXPECT_NE(err.find("shard 1"), std::string::npos) << err;
  EXPECT_LT(took, absl::Seconds(8)) << err;
  std::printf("%s: trainer stopped %.2f s after shard 1 was killed: %s",
              GetParam().c_str(), absl::ToDoubleSeconds(took), err.c_str());
}

// (active, expired) leases of trainer `rank` in zshardctl status output.
std::pair<long, long> Leases(const std::string& status, int rank) {
  const std::string tag = absl::StrCat("trainer ", rank, ":");
  const size_t line = status.find(tag);
  if (line == std::string::npos) return {-1, -1};
  const size_t at = status.find("leases ", line);
  long active = -1, expired = -1;
  if (at != std::string::npos) {
    std::sscanf(status.c_str() + at, "leases %ld active, %ld expired", &active,
                &expired);
  }
  return {active, expired};
}

TEST_P(TransportFailureTest,
       KilledTrainersLeasesEndAtTheirDeadlineAndShowInStatus) {
  Cluster c(dir_, "leases");
  c.Start(2, 2, {"--transport=" + GetParam(), "--lease_timeout_s=2"});
  if (HasFatalFailure()) return;
  Process& t0 =
      c.StartTrainer(0, 100000, {"--rpc_timeout_s=60", "--d_model=128"});
  Process& t1 =
      c.StartTrainer(1, 100000, {"--rpc_timeout_s=60", "--d_model=128"});
  auto status = [&] {
    Process p({ZSHARDCTL_BIN, "status", "--server=" + c.coordinator()},
              dir_ + "/ctl");
    p.Wait(absl::Seconds(30));
    return p.Stdout();
  };
  // Freeze trainer 1 mid-step while it holds leases, then kill -9 it.
  bool held = false;
  for (int i = 0; i < 400 && !held; ++i) {
    if (Leases(status(), 1).first > 0) {
      t1.Signal(SIGSTOP);
      held = Leases(status(), 1).first > 0;
      if (!held) t1.Signal(SIGCONT);
    }
    if (!held) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(held) << status() << t1.Stderr();
  const long had = Leases(status(), 1).first;
  t1.Kill();
  absl::SleepFor(absl::Seconds(3));  // the lease deadline is 2 s
  const std::string s = status();
  const auto [active, expired] = Leases(s, 1);
  EXPECT_EQ(active, 0) << s;
  EXPECT_GE(expired, had) << s;
  EXPECT_NE(s.find("expired (trainer gone, stalled"), std::string::npos) << s;
  std::printf("%s: trainer 1 killed holding %ld leases; status after 3 s:\n%s",
              GetParam().c_str(), had, s.c_str());
  t0.Kill();
}

TEST_P(TransportFailureTest, ForgedLeasesAndLandingClaimsAreInvalidArgument) {
  Cluster c(dir_, "forged");
  c.Start(1, 1, {"--transport=" + GetParam()});
  if (HasFatalFailure()) return;
  Process& trainer = c.StartTrainer(0, 2, {});
  auto code = trainer.Wait(absl::Seconds(120));
  ASSERT_TRUE(code.has_value() && *code == 0) << trainer.Stderr();
  auto stub = v1::ShardService::NewStub(
      grpc::CreateChannel(c.coordinator(), grpc::InsecureChannelCredentials()));
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return FromGrpcStatus(((*stub).*method)(&ctx, req, resp));
  };
  v1::ReleaseRequest release;
  release.set_trainer_rank(0);
  release.add_lease_ids(123456789);
  v1::ReleaseResponse release_resp;
  EXPECT_EQ(
      call(&v1::ShardService::Stub::Release, release, &release_resp).code(),
      absl::StatusCode::kInvalidArgument);
  v1::LandedRequest landed;
  landed.set_group(0);
  landed.set_step(2);
  landed.set_trainer_rank(7);  // no such rank
  landed.set_dtype(v1::FLOAT32);
  v1::LandedResponse landed_resp;
  EXPECT_EQ(call(&v1::ShardService::Stub::Landed, landed, &landed_resp).code(),
            absl::StatusCode::kInvalidArgument);
  landed.set_trainer_rank(0);
  landed.set_micro_step(3);  // one accumulation step
  EXPECT_EQ(call(&v1::ShardService::Stub::Landed, landed, &landed_resp).code(),
            absl::StatusCode::kInvalidArgument);
  // A real lease, then its key forged (inline checks it on the server).
  v1::LeaseRequest lease;
  lease.set_group(0);
  lease.set_min_version(2);
  lease.set_dtype(v1::FLOAT32);
  v1::LeaseResponse granted;
  ASSERT_TRUE(call(&v1::ShardService::Stub::Lease, lease, &granted).ok());
  if (GetParam() == "inline") {
    grpc::ClientContext ctx;
    v1::ReadRegionRequest read;
    read.set_region(granted.values().address());
    read.set_key(granted.values().key() + "x");
    read.set_size(16);
    auto bytes_stub = v1::InlineTransport::NewStub(grpc::CreateChannel(
        c.coordinator(), grpc::InsecureChannelCredentials()));
    auto reader = bytes_stub->ReadRegion(&ctx, read);
    v1::RegionBytes bytes;
    EXPECT_FALSE(reader->Read(&bytes));
    EXPECT_EQ(FromGrpcStatus(reader->Finish()).code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Another trainer's lease cannot be released by this one.
  release.set_trainer_rank(0);
  release.clear_lease_ids();
  release.add_lease_ids(granted.lease_id());
  v1::ReleaseRequest wrong = release;
  wrong.set_trainer_rank(1);
  EXPECT_EQ(call(&v1::ShardService::Stub::Release, wrong, &release_resp).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      call(&v1::ShardService::Stub::Release, release, &release_resp).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportFailureTest,
                         ::testing::Values("inline", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zshard
