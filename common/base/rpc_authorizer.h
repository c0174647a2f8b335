// RpcAuthorizer: a server's side of RPC security — the credentials its
// ports are served with (plaintext or TLS, optionally requiring client
// certificates) and the bearer-token check every handler runs before it
// touches any state. Roles: the trainer token (--auth_token_file) admits the
// trainer calls (ShardService, the inline data plane); the admin token
// (--admin_token_file) admits every call, including the admin ones
// (AdminService: status, checkpoints) and shard-to-shard ones (Coordinator,
// ShardControl). grpc.health.v1 and reflection stay open. Without token
// files every call is admitted.
#ifndef ZSHARD_COMMON_BASE_RPC_AUTHORIZER_H_
#define ZSHARD_COMMON_BASE_RPC_AUTHORIZER_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/rpc_credentials.h"

namespace zshard {

// File paths, as the flags of the same names give them.
struct RpcServerSecurity {
  // PEM certificate chain and key the ports serve TLS with (both or
  // neither).
  std::string tls_cert;
  std::string tls_key;
  // PEM CA bundle: clients must present a certificate it signed. It is also
  // what this server checks its peers' certificates against; without it,
  // peers must present tls_cert itself (one self-signed certificate for the
  // cluster).
  std::string tls_ca;
  std::string auth_token_file;   // trainer token
  std::string admin_token_file;  // admin token (needed with any token)
};

enum class RpcRole { kTrainer, kAdmin };

// Immutable once loaded; thread-safe.
class RpcAuthorizer {
 public:
  // Reads the files; INVALID_ARGUMENT naming the flag that is wrong (an
  // --auth_token_file without --admin_token_file, a key without a
  // certificate, the same token for both roles, ...).
  static absl::StatusOr<std::shared_ptr<const RpcAuthorizer>> Load(
      const RpcServerSecurity& security);
  // Plaintext, every call admitted.
  static std::shared_ptr<const RpcAuthorizer> Open();

  // OK when the call's bearer token admits `role`. UNAUTHENTICATED when the
  // call has no token or one this server does not know; PERMISSION_DENIED
  // for the trainer token on an admin call. `method` only names the call in
  // the message. Tokens are compared in constant time and never echoed.
  grpc::Status Check(const grpc::ServerContextBase& ctx, RpcRole role,
                     absl::string_view method) const;

  // For the HTTP telemetry port: whether an Authorization header value
  // ("Bearer <token>") admits the admin role (always, without tokens).
  bool AdmitsAdmin(absl::string_view authorization) const;

  // What the gRPC ports are served with.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // How this server calls its peers: TLS when it serves TLS (presenting its
  // own certificate), with the admin token when it has one.
  std::shared_ptr<const RpcCredentials> PeerCredentials() const {
    return peers_;
  }

  bool tls() const { return !cert_pem_.empty(); }
  bool tokens() const { return !admin_token_.empty(); }

 private:
  RpcAuthorizer() = default;

  std::string cert_pem_, key_pem_, ca_pem_;
  std::string trainer_token_, admin_token_;
  std::shared_ptr<const RpcCredentials> peers_;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_RPC_AUTHORIZER_H_
