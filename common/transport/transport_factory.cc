#include "common/transport/transport_factory.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/base/status_macros.h"
#include "common/transport/inline/inline_transport.h"
#ifdef ZSHARD_HAVE_UCX
#include "common/transport/ucx/ucx_transport.h"
#endif

namespace zshard {
namespace {

// The inline transport shares nothing between transports.
class InlineTransportContext : public TransportContext {
 public:
  explicit InlineTransportContext(TransportSecurity security)
      : security_(std::move(security)) {}
  std::string name() const override { return "inline"; }
  absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(
      const std::string& label) override {
    return std::unique_ptr<Transport>(
        new InlineTransport(label, /*threads=*/4, security_));
  }

 private:
  const TransportSecurity security_;
};

}  // namespace

std::string DefaultTransportName() {
#ifdef ZSHARD_HAVE_UCX
  return "ucx";
#else
  return "inline";
#endif
}

void SetTransportProcessDefaults() {
#ifdef ZSHARD_HAVE_UCX
  // ucp_config_modify does not reach the tcp transport in UCX 1.13; a value
  // the user set wins.
  const char* tls = std::getenv("UCX_TLS");
  if (!tls || std::strstr(tls, "tcp") || std::strstr(tls, "all")) {
    ::setenv("UCX_TCP_TX_SEG_SIZE", "512k", /*overwrite=*/0);
    ::setenv("UCX_TCP_RX_SEG_SIZE", "512k", /*overwrite=*/0);
  }
  // libucs takes SIGHUP for itself when it loads (its debug signal: it
  // turns on debug logging and swallows the signal); the process keeps
  // SIGHUP's own meaning. (UCX_DEBUG_SIGNO=0 would too, but UCP then warns
  // that the variable is unused.)
  if (!std::getenv("UCX_DEBUG_SIGNO")) ::signal(SIGHUP, SIG_DFL);
#endif
}

absl::StatusOr<std::shared_ptr<TransportContext>> CreateTransportContext(
    const std::string& name, const TransportSecurity& security) {
  if (name == "inline") {
    return std::make_shared<InlineTransportContext>(security);
  }
  if (name == "ucx") {
#ifdef ZSHARD_HAVE_UCX
    return CreateUcxContext();
#else
    return absl::UnimplementedError(
        "--transport=ucx: this build has no UCX (install libucx-dev and "
        "rebuild)");
#endif
  }
  return absl::InvalidArgumentError(
      "--transport: expected ucx or inline, got '" + name + "'");
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(
    const std::string& name, const std::string& label,
    const TransportSecurity& security) {
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<TransportContext> context,
                      CreateTransportContext(name, security));
  return context->CreateTransport(label);
}

}  // namespace zshard
