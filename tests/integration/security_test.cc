// TLS and tokens against real zshard-server processes (2 shards, inline data
// plane, TLS requiring client certificates, trainer and admin tokens): every
// method of every service is called with no token, a wrong token and the
// trainer token; TLS is tried with the wrong CA, without a client
// certificate, with one from another CA, and in plaintext. Each is refused
// with its code and leaves the state as it was; health stays open; the
// shards reach each other through TLS with the admin token (shard 1
// announced itself). zshardctl and zshard-server's bad security flags are
// checked as processes. A table of the cases is printed.
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"
#include "tests/integration/process.h"
#include "tests/integration/test_certificates.h"
#include "zshard/v1/admin.grpc.pb.h"
#include "zshard/v1/coordinator.grpc.pb.h"
#include "zshard/v1/health.grpc.pb.h"
#include "zshard/v1/inline_transport.grpc.pb.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {
namespace {

using testing::Process;

std::string TempDir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "zssec.XXXXXX").string();
  return mkdtemp(tmpl.data());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Method {
  std::string path;  // "/zshard.v1.ShardService/Join"
  bool admin;        // needs the admin token
};

// Every method of the services a shard hosts, with its role.
std::vector<Method> AllMethods() {
  // A message of each file loads the file's descriptors.
  const struct {
    const google::protobuf::FileDescriptor* file;
    const char* service;
    bool admin;
  } services[] = {
      {v1::JoinRequest::descriptor()->file(),
       v1::ShardService::service_full_name(), false},
      {v1::ReadRegionRequest::descriptor()->file(),
       v1::InlineTransport::service_full_name(), false},
      {v1::GetStatusRequest::descriptor()->file(),
       v1::AdminService::service_full_name(), true},
      {v1::RegisterShardRequest::descriptor()->file(),
       v1::Coordinator::service_full_name(), true},
      {v1::RegisterShardRequest::descriptor()->file(),
       v1::ShardControl::service_full_name(), true},
  };
  std::vector<Method> out;
  for (const auto& s : services) {
    const auto* d = s.file->pool()->FindServiceByName(s.service);
    EXPECT_NE(d, nullptr) << s.service;
    if (!d) continue;
    for (int i = 0; i < d->method_count(); ++i) {
      out.push_back(
          {absl::StrCat("/", s.service, "/", d->method(i)->name()), s.admin});
    }
  }
  return out;
}

// One call of `method` with one empty message, whatever its kind (a generic
// bidi call is what every kind looks like on the wire); its status.
grpc::Status CallRaw(const std::shared_ptr<grpc::Channel>& channel,
                     const std::string& method, const std::string& token,
                     const std::string& payload = "") {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (step(1)) {
    grpc::Slice bytes(payload);
    grpc::ByteBuffer message(&bytes, 1);
    call->Write(message, reinterpret_cast<void*>(2));
    if (step(2)) {
      call->WritesDone(reinterpret_cast<void*>(3));
      step(3);
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  step(4);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& port,
                                          const std::string& ca,
                                          const std::string& cert,
                                          const std::string& key) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadFile(ca);
  if (!cert.empty()) {
    o.pem_cert_chain = ReadFile(cert);
    o.pem_private_key = ReadFile(key);
  }
  return grpc::CreateChannel("127.0.0.1:" + port, grpc::SslCredentials(o));
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir());
    certs_ = new testing::TestCertificates();
    ASSERT_TRUE(testing::MakeTestCertificates(*dir_, certs_));
    admin_token_ = new std::string(ReadFile(certs_->admin_token));
    admin_token_->pop_back();  // the newline
    trainer_token_ = new std::string(ReadFile(certs_->trainer_token));
    trainer_token_->pop_back();
    ports_ = new std::string[2];
    for (int s = 0; s < 2; ++s) {
      std::vector<std::string> argv = {
          ZSHARD_SERVER_BIN,
          "--listen=127.0.0.1:0",
          absl::StrCat("--port_file=", *dir_, "/port", s),
          absl::StrCat("--shard_id=", s),
          "--num_shards=2",
          "--trainers=1",
          "--transport=inline",
          "--tls_cert=" + certs_->server_cert,
          "--tls_key=" + certs_->server_key,
          "--tls_ca=" + certs_->ca,
          "--auth_token_file=" + certs_->trainer_token,
          "--admin_token_file=" + certs_->admin_token,
          absl::StrCat("--metrics_listen=127.0.0.1:0"),
          absl::StrCat("--metrics_port_file=", *dir_, "/metrics", s)};
      if (s == 1) argv.push_back("--coordinator=127.0.0.1:" + ports_[0]);
      servers_[s] = new Process(argv, absl::StrCat(*dir_, "/server", s));
      const int port = testing::WaitForPortFile(
          absl::StrCat(*dir_, "/port", s), *servers_[s], absl::Seconds(30));
      ASSERT_GT(port, 0) << servers_[s]->Stderr();
      ports_[s] = std::to_string(port);
      metrics_ports_[s] = testing::WaitForPortFile(
          absl::StrCat(*dir_, "/metrics", s), *servers_[s], absl::Seconds(30));
    }
  }
  static void TearDownTestSuite() {
    for (Process*& p : servers_) {
      delete p;
      p = nullptr;
    }
    std::filesystem::remove_all(*dir_);
  }

  static std::shared_ptr<grpc::Channel> Good(int shard = 0) {
    return TlsChannel(ports_[shard], certs_->ca, certs_->client_cert,
                      certs_->client_key);
  }
  static void Row(const std::string& what, const std::string& call,
                  const grpc::Status& got) {
    std::printf("| %-44s | %-42s | %s |\n", what.c_str(), call.c_str(),
                absl::StatusCodeToString(
                    static_cast<absl::StatusCode>(got.error_code()))
                    .c_str());
  }
  // The state a refused call must not change, as the admin sees it.
  static v1::GetStatusResponse AdminStatus(int shard) {
    auto stub = v1::AdminService::NewStub(Good(shard));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + *admin_token_);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetStatusResponse resp;
    grpc::Status st = stub->GetStatus(&ctx, v1::GetStatusRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }
  static grpc::Status Health(const std::shared_ptr<grpc::Channel>& ch) {
    auto stub = grpc::health::v1::Health::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st =
        stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    if (st.ok()) {
      EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    }
    return st;
  }
  // zshardctl with `args`: exit code and stderr.
  static std::pair<int, std::string> Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), ZSHARDCTL_BIN);
    Process p(args, *dir_ + "/ctl");
    auto code = p.Wait(absl::Seconds(30));
    EXPECT_TRUE(code.has_value());
    return {code.value_or(-1), p.Stderr() + p.Stdout()};
  }

  static std::string* dir_;
  static testing::TestCertificates* certs_;
  static std::string* admin_token_;
  static std::string* trainer_token_;
  static std::string* ports_;
  static Process* servers_[2];
  static int metrics_ports_[2];
};

std::string* SecurityTest::dir_ = nullptr;
testing::TestCertificates* SecurityTest::certs_ = nullptr;
std::string* SecurityTest::admin_token_ = nullptr;
std::string* SecurityTest::trainer_token_ = nullptr;
std::string* SecurityTest::ports_ = nullptr;
Process* SecurityTest::servers_[2] = {nullptr, nullptr};
int SecurityTest::metrics_ports_[2] = {0, 0};

TEST_F(SecurityTest, EveryCallChecksItsRoleAndRefusalsChangeNothing) {
  const v1::GetStatusResponse before = AdminStatus(0);
  // Shard 1 reached shard 0 through TLS with the admin token.
  ASSERT_EQ(before.shards_size(), 2) << before.DebugString();
  std::printf("| %-44s | %-42s | %s |\n", "case", "call", "answer");
  const std::vector<Method> methods = AllMethods();
  ASSERT_GE(methods.size(), 17u);
  for (int shard = 0; shard < 2; ++shard) {
    auto channel = Good(shard);
    for (const Method& m : methods) {
      const bool coordinator = absl::StrContains(m.path, ".Coordinator/");
      if (coordinator && shard != 0) continue;  // hosted by shard 0 only
      const grpc::Status none = CallRaw(channel, m.path, "");
      EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << m.path << ": " << none.error_message();
      const grpc::Status wrong = CallRaw(channel, m.path, "not-the-token");
      EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << m.path << ": " << wrong.error_message();
      // The token never comes back in an answer.
      EXPECT_EQ(wrong.error_message().find("not-the-token"), std::string::npos);
      if (shard == 0) {
        Row("TLS + client cert, no token", m.path, none);
        Row("TLS + client cert, wrong token", m.path, wrong);
      }
      if (m.admin) {
        const grpc::Status trainer = CallRaw(channel, m.path, *trainer_token_);
        EXPECT_EQ(trainer.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << m.path << ": " << trainer.error_message();
        if (shard == 0)
          Row("TLS + client cert, trainer token", m.path, trainer);
      }
    }
  }
  const std::string join = "/zshard.v1.ShardService/Join";
  struct Transport {
    const char* what;
    std::shared_ptr<grpc::Channel> channel;
  } refused[] = {
      {"plaintext against the TLS port",
       grpc::CreateChannel("127.0.0.1:" + ports_[0],
                           grpc::InsecureChannelCredentials())},
      {"TLS, wrong CA (server not trusted)",
       TlsChannel(ports_[0], certs_->other_ca, certs_->client_cert,
                  certs_->client_key)},
      {"TLS, no client certificate", TlsChannel(ports_[0], certs_->ca, "", "")},
      {"TLS, client certificate of another CA",
       TlsChannel(ports_[0], certs_->ca, certs_->other_client_cert,
                  certs_->other_client_key)},
  };
  for (auto& r : refused) {
    const grpc::Status st = CallRaw(r.channel, join, *admin_token_);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << r.what;
    Row(r.what, join + " (admin token)", st);
    const grpc::Status health = Health(r.channel);
    EXPECT_EQ(health.error_code(), grpc::StatusCode::UNAVAILABLE) << r.what;
  }
  const grpc::Status open = Health(Good(0));
  EXPECT_TRUE(open.ok()) << open.error_message();
  Row("TLS + client cert, no token", "/grpc.health.v1.Health/Check", open);

  // Nothing the refused calls carried reached the state.
  for (int shard = 0; shard < 2; ++shard) {
    const v1::GetStatusResponse after = AdminStatus(shard);
    EXPECT_FALSE(after.registered());
    EXPECT_EQ(after.trainers_size(), 0) << after.DebugString();
    EXPECT_EQ(after.bytes_pushed(), 0u);
    EXPECT_EQ(after.bytes_fetched(), 0u);
    EXPECT_EQ(after.checkpoint().DebugString(),
              shard == 0 ? before.checkpoint().DebugString()
                         : after.checkpoint().DebugString());
  }
}

// With the admin token (which admits every call), a message that does not
// parse is refused by every method and changes nothing.
TEST_F(SecurityTest, UnparseableMessagesAreRefusedByEveryMethod) {
  const std::string garbage("\xff\xff\xff\xff\x0f", 5);  // a bad varint
  for (const Method& m : AllMethods()) {
    const grpc::Status st = CallRaw(Good(0), m.path, *admin_token_, garbage);
    EXPECT_FALSE(st.ok()) << m.path;
    EXPECT_NE(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << m.path;
    Row("admin token, unparseable message", m.path, st);
  }
  for (int shard = 0; shard < 2; ++shard) {
    const v1::GetStatusResponse after = AdminStatus(shard);
    EXPECT_FALSE(after.registered());
    EXPECT_EQ(after.trainers_size(), 0) << after.DebugString();
  }
}

TEST_F(SecurityTest, ZshardctlNeedsTheAdminTokenAndHealthStaysOpen) {
  const std::vector<std::string> tls = {
      "--server=127.0.0.1:" + ports_[0], "--tls_ca=" + certs_->ca,
      "--tls_cert=" + certs_->client_cert, "--tls_key=" + certs_->client_key};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = tls;
    a.insert(a.begin(), extra.begin(), extra.end());
    return a;
  };
  auto [ok_code, ok_out] =
      Ctl(with({"status", "--admin_token_file=" + certs_->admin_token}));
  EXPECT_EQ(ok_code, 0) << ok_out;
  EXPECT_NE(ok_out.find("2 shards"), std::string::npos) << ok_out;
  EXPECT_EQ(ok_out.find(*admin_token_), std::string::npos);

  auto [t_code, t_out] =
      Ctl(with({"status", "--admin_token_file=" + certs_->trainer_token}));
  EXPECT_EQ(t_code, 1);
  EXPECT_NE(t_out.find("PERMISSION_DENIED"), std::string::npos) << t_out;

  auto [n_code, n_out] = Ctl(with({"checkpoint"}));
  EXPECT_EQ(n_code, 1);
  EXPECT_NE(n_out.find("UNAUTHENTICATED"), std::string::npos) << n_out;

  auto [h_code, h_out] = Ctl(with({"health"}));
  EXPECT_EQ(h_code, 0) << h_out;

  auto [p_code, p_out] =
      Ctl({"health", "--server=127.0.0.1:" + ports_[0]});  // plaintext
  EXPECT_EQ(p_code, 1) << p_out;

  auto [b_code, b_out] =
      Ctl(with({"status", "--admin_token_file=/nonexistent"}));
  EXPECT_EQ(b_code, 2);
  EXPECT_NE(b_out.find("--admin_token_file"), std::string::npos) << b_out;
}

// The telemetry port needs the admin token too.
TEST_F(SecurityTest, TelemetryNeedsTheAdminToken) {
  for (int shard = 0; shard < 2; ++shard) {
    const int port = metrics_ports_[shard];
    ASSERT_GT(port, 0);
    for (const std::string& path :
         std::vector<std::string>{"/metrics", "/status.json", "/"}) {
      if (shard == 1 && path != "/metrics") continue;  // shard 0 only
      auto get = [&](const std::string& header) {
        return testing::HttpExchange(
            port, "GET " + path + " HTTP/1.0\r\n" + header + "\r\n");
      };
      EXPECT_TRUE(absl::StrContains(get(""), " 401 ")) << path;
      EXPECT_TRUE(absl::StrContains(
          get("Authorization: Bearer " + *trainer_token_ + "\r\n"), " 401 "))
          << path;
      const std::string ok =
          get("Authorization: Bearer " + *admin_token_ + "\r\n");
      EXPECT_TRUE(absl::StrContains(ok, " 200 ")) << path << ok;
      if (path == "/metrics") {
        EXPECT_TRUE(absl::StrContains(ok, "zshard_steps_total{shard="));
      }
    }
  }
}

// One line naming the flag, exit non-zero.
void ExpectServerRefuses(const std::string& dir,
                         const std::vector<std::string>& args,
                         const std::string& named) {
  std::vector<std::string> argv = {ZSHARD_SERVER_BIN, "--listen=127.0.0.1:0"};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, dir + "/bad");
  auto code = p.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value())
      << "server with bad security flags kept running";
  EXPECT_NE(*code, 0);
  const std::string err = p.Stderr();
  std::vector<std::string> lines = absl::StrSplit(err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_NE(lines[0].find(named), std::string::npos) << lines[0];
}

TEST_F(SecurityTest, BadSecurityFlagsAreRefusedNamingTheFlag) {
  const std::string empty = *dir_ + "/empty.token";
  std::ofstream(empty) << "\n";
  ExpectServerRefuses(*dir_, {"--auth_token_file=" + certs_->trainer_token},
                      "--admin_token_file");
  ExpectServerRefuses(*dir_, {"--tls_cert=" + certs_->server_cert},
                      "--tls_key");
  ExpectServerRefuses(*dir_, {"--tls_ca=" + certs_->ca}, "--tls_ca");
  ExpectServerRefuses(
      *dir_, {"--tls_cert=/nonexistent.pem", "--tls_key=" + certs_->server_key},
      "--tls_cert");
  ExpectServerRefuses(*dir_,
                      {"--tls_cert=" + certs_->trainer_token,
                       "--tls_key=" + certs_->server_key},
                      "not PEM");
  ExpectServerRefuses(*dir_, {"--admin_token_file=" + empty},
                      "--admin_token_file");
  ExpectServerRefuses(*dir_,
                      {"--auth_token_file=" + certs_->admin_token,
                       "--admin_token_file=" + certs_->admin_token},
                      "same token");
  // A certificate and a key that do not belong together.
  ExpectServerRefuses(
      *dir_,
      {"--tls_cert=" + certs_->server_cert, "--tls_key=" + certs_->client_key},
      "--tls_key");
}

}  // namespace
}  // namespace zshard
