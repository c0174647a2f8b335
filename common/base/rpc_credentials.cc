#include "common/base/rpc_credentials.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace zshard {

void DefineRpcClientSecurityFlags(const std::string& token_flag,
                                  const std::string& role, Flags* flags) {
  flags->Define("tls_ca", "",
                "PEM CA the servers' certificates are checked against (set: "
                "TLS)");
  flags->Define("tls_cert", "",
                "PEM client certificate, for servers started with --tls_ca");
  flags->Define("tls_key", "", "PEM private key of --tls_cert");
  flags->Define(token_flag, "",
                "file holding the " + role + " token the servers require");
}

RpcClientSecurity RpcClientSecurityFromFlags(const std::string& token_flag,
                                             const Flags& flags) {
  RpcClientSecurity security;
  security.tls_ca = flags.GetString("tls_ca");
  security.tls_cert = flags.GetString("tls_cert");
  security.tls_key = flags.GetString("tls_key");
  security.token_file = flags.GetString(token_flag);
  security.token_flag = "--" + token_flag;
  return security;
}
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  return text.str();
}

// Adds the bearer token to every call's initial metadata.
class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header)
      : header_(header) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory
};

class BearerTokenFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

}  // namespace

absl::Status CheckKeyPair(const std::string& cert_pem,
                          const std::string& key_pem,
                          const std::string& cert_path,
                          const std::string& key_path) {
  auto cert_bio = MemoryBio(cert_pem);
  std::unique_ptr<X509, X509Free> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert: '", cert_path, "' holds no certificate"));
  }
  auto key_bio = MemoryBio(key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: '", key_path, "' holds no unencrypted private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key: '", key_path,
                     "' is not the private key of the certificate in '",
                     cert_path, "' (--tls_cert)"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert: the certificate in '", cert_path, "' has expired"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view flag) {
  auto text = ReadWholeFile(path, flag);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' is not PEM (no -----BEGIN block)"));
  }
  return text;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path,
                                          absl::string_view flag) {
  auto text = ReadWholeFile(path, flag);
  if (!text.ok()) return text.status();
  absl::string_view token = absl::StripTrailingAsciiWhitespace(*text);
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' holds no token"));
  }
  for (char c : token) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": the token in '", path,
          "' has a byte that is not printable ASCII (gRPC metadata carries "
          "only those)"));
    }
  }
  return std::string(token);
}

absl::StatusOr<std::shared_ptr<const RpcCredentials>> RpcCredentials::Load(
    const RpcClientSecurity& s) {
  if (s.tls_ca.empty() && !(s.tls_cert.empty() && s.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--tls_cert / --tls_key: a client certificate needs --tls_ca (the CA "
        "the servers' certificates are checked against)");
  }
  if (s.tls_cert.empty() != s.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key: give both or neither");
  }
  std::string ca, cert, key, token;
  if (!s.tls_ca.empty()) {
    auto r = ReadPemFile(s.tls_ca, "--tls_ca");
    if (!r.ok()) return r.status();
    ca = std::move(*r);
  }
  if (!s.tls_cert.empty()) {
    auto c = ReadPemFile(s.tls_cert, "--tls_cert");
    if (!c.ok()) return c.status();
    auto k = ReadPemFile(s.tls_key, "--tls_key");
    if (!k.ok()) return k.status();
    if (absl::Status st = CheckKeyPair(*c, *k, s.tls_cert, s.tls_key);
        !st.ok()) {
      return st;
    }
    cert = std::move(*c);
    key = std::move(*k);
  }
  if (!s.token_file.empty()) {
    auto t = ReadTokenFile(s.token_file, s.token_flag);
    if (!t.ok()) return t.status();
    token = std::move(*t);
  }
  const bool tls = !ca.empty();
  return Make(tls, std::move(ca), std::move(cert), std::move(key),
              std::move(token));
}

std::shared_ptr<const RpcCredentials> RpcCredentials::Plaintext() {
  return Make(false, "", "", "", "");
}

std::shared_ptr<const RpcCredentials> RpcCredentials::Make(bool tls,
                                                           std::string ca_pem,
                                                           std::string cert_pem,
                                                           std::string key_pem,
                                                           std::string token) {
  std::shared_ptr<RpcCredentials> c(new RpcCredentials());
  c->tls_ = tls;
  if (tls) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = std::move(ca_pem);
    o.pem_cert_chain = std::move(cert_pem);
    o.pem_private_key = std::move(key_pem);
    c->channel_credentials_ = grpc::SslCredentials(o);
  } else {
    c->channel_credentials_ = grpc::InsecureChannelCredentials();
  }
  c->token_ = std::move(token);
  return c;
}

std::shared_ptr<grpc::Channel> RpcCredentials::Channel(
    const std::string& target, const grpc::ChannelArguments& args,
    InterceptorFactories extra) const {
  if (token_.empty() && extra.empty()) {
    return grpc::CreateCustomChannel(target, channel_credentials_, args);
  }
  InterceptorFactories interceptors;
  if (!token_.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenFactory>(token_));
  }
  for (auto& f : extra) interceptors.push_back(std::move(f));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, channel_credentials_, args, std::move(interceptors));
}

}  // namespace zshard
