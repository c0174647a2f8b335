#include "common/base/rpc_authorizer.h"

#include <grpcpp/security/server_credentials.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace zshard {
namespace {

// Whether `given` equals `expected`, in a time that depends only on
// given's length.
bool SameToken(absl::string_view given, const std::string& expected) {
  volatile unsigned char diff = given.size() != expected.size() ? 1 : 0;
  for (size_t i = 0; i < given.size(); ++i) {
    const char e = i < expected.size() ? expected[i] : '\0';
    diff = diff | static_cast<unsigned char>(given[i] ^ e);
  }
  return diff == 0;
}

// The call's bearer token; empty when it has none.
absl::string_view BearerToken(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return {};
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) return {};
  return value;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const RpcAuthorizer>> RpcAuthorizer::Load(
    const RpcServerSecurity& s) {
  if (s.tls_cert.empty() != s.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key: give both or neither");
  }
  if (!s.tls_ca.empty() && s.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca: requiring client certificates needs TLS (--tls_cert and "
        "--tls_key)");
  }
  if (!s.auth_token_file.empty() && s.admin_token_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth_token_file needs --admin_token_file: operator calls and the "
        "shards' calls to each other use the admin token");
  }
  std::shared_ptr<RpcAuthorizer> a(new RpcAuthorizer());
  if (!s.tls_cert.empty()) {
    auto cert = ReadPemFile(s.tls_cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPemFile(s.tls_key, "--tls_key");
    if (!key.ok()) return key.status();
    if (absl::Status st = CheckKeyPair(*cert, *key, s.tls_cert, s.tls_key);
        !st.ok()) {
      return st;
    }
    a->cert_pem_ = std::move(*cert);
    a->key_pem_ = std::move(*key);
  }
  if (!s.tls_ca.empty()) {
    auto ca = ReadPemFile(s.tls_ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    a->ca_pem_ = std::move(*ca);
  }
  if (!s.admin_token_file.empty()) {
    auto t = ReadTokenFile(s.admin_token_file, "--admin_token_file");
    if (!t.ok()) return t.status();
    a->admin_token_ = std::move(*t);
  }
  if (!s.auth_token_file.empty()) {
    auto t = ReadTokenFile(s.auth_token_file, "--auth_token_file");
    if (!t.ok()) return t.status();
    a->trainer_token_ = std::move(*t);
    if (SameToken(a->trainer_token_, a->admin_token_)) {
      return absl::InvalidArgumentError(
          "--auth_token_file and --admin_token_file hold the same token: "
          "trainers would get the admin role");
    }
  }
  a->peers_ = RpcCredentials::Make(
      a->tls(), a->ca_pem_.empty() ? a->cert_pem_ : a->ca_pem_, a->cert_pem_,
      a->key_pem_, a->admin_token_);
  return std::shared_ptr<const RpcAuthorizer>(std::move(a));
}

std::shared_ptr<const RpcAuthorizer> RpcAuthorizer::Open() {
  std::shared_ptr<RpcAuthorizer> a(new RpcAuthorizer());
  a->peers_ = RpcCredentials::Plaintext();
  return a;
}

grpc::Status RpcAuthorizer::Check(const grpc::ServerContextBase& ctx,
                                  RpcRole role,
                                  absl::string_view method) const {
  if (admin_token_.empty()) return grpc::Status::OK;
  const absl::string_view token = BearerToken(ctx);
  if (token.empty()) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat(method,
                     ": this server requires a bearer token (trainers: "
                     "--auth_token_file; operators: --admin_token_file)"));
  }
  if (SameToken(token, admin_token_)) return grpc::Status::OK;
  const bool trainer =
      !trainer_token_.empty() && SameToken(token, trainer_token_);
  if (!trainer) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat(method,
                     ": the bearer token is not one this server "
                     "accepts"));
  }
  if (role == RpcRole::kTrainer) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat(method,
                   " is an admin call: the trainer token does not admit it "
                   "(use the admin token, --admin_token_file)"));
}

bool RpcAuthorizer::AdmitsAdmin(absl::string_view authorization) const {
  if (admin_token_.empty()) return true;
  return absl::ConsumePrefix(&authorization, "Bearer ") &&
         SameToken(authorization, admin_token_);
}

std::shared_ptr<grpc::ServerCredentials> RpcAuthorizer::ServerCredentials()
    const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      ca_pem_.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = ca_pem_;
  o.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(o);
}

}  // namespace zshard
