// RpcCredentials: how a process calls zshard's gRPC ports — plaintext or TLS
// (the server's certificate checked against a CA, optionally a client
// certificate presented), with or without a bearer token sent as
// `authorization: Bearer <token>` metadata on every call. The token is never
// logged or put in an error message.
#ifndef ZSHARD_COMMON_BASE_RPC_CREDENTIALS_H_
#define ZSHARD_COMMON_BASE_RPC_CREDENTIALS_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/flags.h"

namespace zshard {

// File paths, as the flags of the same names give them.
struct RpcClientSecurity {
  // PEM CA bundle the servers' certificates are verified against; set, the
  // calls use TLS.
  std::string tls_ca;
  // A client certificate and its key (PEM), for servers that require one
  // (started with --tls_ca). Both or neither; only with tls_ca.
  std::string tls_cert;
  std::string tls_key;
  // A file holding the bearer token (trailing whitespace dropped); empty:
  // no token.
  std::string token_file;
  // The flag errors about token_file name.
  std::string token_flag = "--auth_token_file";
};

// Declares a client binary's --tls_ca, --tls_cert, --tls_key and
// --`token_flag` (e.g. "auth_token_file"), the file holding `role`'s token.
void DefineRpcClientSecurityFlags(const std::string& token_flag,
                                  const std::string& role, Flags* flags);

// What those flags say (after Parse).
RpcClientSecurity RpcClientSecurityFromFlags(const std::string& token_flag,
                                             const Flags& flags);

// The PEM text of one file, INVALID_ARGUMENT naming `flag` and the path when
// it cannot be read or holds no "-----BEGIN" block.
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view flag);
// The token in `path` without trailing whitespace; INVALID_ARGUMENT naming
// `flag` and the path (never the content) when unreadable, empty, or not
// printable ASCII (gRPC metadata carries only that).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path,
                                          absl::string_view flag);

// OK when `key_pem` (from `key_path`) is the private key of the first
// certificate in `cert_pem` (from `cert_path`) and that certificate has not
// expired; INVALID_ARGUMENT naming --tls_cert or --tls_key and the path
// otherwise.
absl::Status CheckKeyPair(const std::string& cert_pem,
                          const std::string& key_pem,
                          const std::string& cert_path,
                          const std::string& key_path);

// Immutable once made; thread-safe; shared by every channel of a process.
class RpcCredentials {
 public:
  // Reads the files; INVALID_ARGUMENT naming the flag that is wrong.
  static absl::StatusOr<std::shared_ptr<const RpcCredentials>> Load(
      const RpcClientSecurity& security);
  // Plaintext, no token.
  static std::shared_ptr<const RpcCredentials> Plaintext();
  // From contents already read (a server calling its peers): `tls` false is
  // plaintext; `token` empty sends none.
  static std::shared_ptr<const RpcCredentials> Make(bool tls,
                                                    std::string ca_pem,
                                                    std::string cert_pem,
                                                    std::string key_pem,
                                                    std::string token);

  // A new channel to `target` with these credentials and `args`; `extra`
  // interceptor factories (e.g. a call counter) run after the token's.
  using InterceptorFactories = std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>;
  std::shared_ptr<grpc::Channel> Channel(
      const std::string& target,
      const grpc::ChannelArguments& args = grpc::ChannelArguments(),
      InterceptorFactories extra = {}) const;

  bool tls() const { return tls_; }
  bool has_token() const { return !token_.empty(); }

 private:
  RpcCredentials() = default;

  bool tls_ = false;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;
  std::string token_;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_RPC_CREDENTIALS_H_
