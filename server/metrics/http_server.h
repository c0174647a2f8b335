// HttpServer: a small HTTP/1.1 server for telemetry (GET only), on GNU
// libmicrohttpd (a thread per connection; at most 64 open at once; idle ones
// closed after 10 s). Handlers are registered by exact path before start and
// run on the connection's thread: they may wait (with a deadline of their
// own) but never on the training path. Stopped and joined by the
// destructor. Several can run in one process.
#ifndef ZSHARD_SERVER_METRICS_HTTP_SERVER_H_
#define ZSHARD_SERVER_METRICS_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct MHD_Daemon;

namespace zshard {

struct HttpRequest {
  std::string path;
  // The Authorization header ("" when absent).
  std::string authorization;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds `listen` ("IPv4:port"; port 0 picks a free one) and starts
  // serving. INVALID_ARGUMENT naming `flag` for a malformed address;
  // UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& listen, std::map<std::string, Handler> handlers,
      const std::string& flag);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  // The answer to one GET: its path's handler, or 404. Thread-safe.
  HttpResponse Handle(const HttpRequest& request) const;

 private:
  HttpServer() = default;

  std::map<std::string, Handler> handlers_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_METRICS_HTTP_SERVER_H_
