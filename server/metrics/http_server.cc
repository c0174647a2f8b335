#include "server/metrics/http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zshard {
namespace {

absl::StatusOr<sockaddr_in> ParseAddress(const std::string& listen,
                                         const std::string& flag) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535 ||
      inet_pton(AF_INET, listen.substr(0, colon).c_str(), &addr.sin_addr) !=
          1) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": expected IPv4:port (port 0-65535), got '", listen, "'"));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

MHD_Result Queue(MHD_Connection* connection, const HttpResponse& r) {
  MHD_Response* response = MHD_create_response_from_buffer(
      r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
  if (!response) return MHD_NO;
  MHD_add_response_header(response, "Content-Type", r.content_type.c_str());
  MHD_add_response_header(response, "Cache-Control", "no-store");
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned>(r.status), response);
  MHD_destroy_response(response);
  return queued;
}

MHD_Result Access(void* cls, MHD_Connection* connection, const char* url,
                  const char* method, const char* /*version*/,
                  const char* /*upload_data*/, size_t* upload_data_size,
                  void** /*con_cls*/) {
  if (*upload_data_size != 0) {
    *upload_data_size = 0;  // a body is ignored
    return MHD_YES;
  }
  HttpResponse r;
  if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
    r.status = 405;
    r.body = "only GET is served\n";
    return Queue(connection, r);
  }
  HttpRequest request;
  request.path = url;
  const char* auth =
      MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "Authorization");
  if (auth) request.authorization = auth;
  return Queue(connection,
               static_cast<const HttpServer*>(cls)->Handle(request));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& listen, std::map<std::string, Handler> handlers,
    const std::string& flag) {
  auto addr = ParseAddress(listen, flag);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->handlers_ = std::move(handlers);
  server->daemon_ = MHD_start_daemon(
      MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION,
      ntohs(addr->sin_port), nullptr, nullptr, &Access, server.get(),
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<const sockaddr*>(&*addr),
      MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_LIMIT, 64u,
      MHD_OPTION_END);
  if (!server->daemon_) {
    return absl::UnavailableError(
        absl::StrCat(flag, ": cannot listen on ", listen,
                     " (the port is in use or the address is not this "
                     "host's)"));
  }
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info ? info->port : ntohs(addr->sin_port);
  return server;
}

HttpServer::~HttpServer() {
  if (daemon_) MHD_stop_daemon(daemon_);
}

HttpResponse HttpServer::Handle(const HttpRequest& request) const {
  auto it = handlers_.find(request.path);
  if (it == handlers_.end()) {
    HttpResponse r;
    r.status = 404;
    r.body = "not found; served: ";
    for (const auto& [path, h] : handlers_) absl::StrAppend(&r.body, path, " ");
    r.body += "\n";
    return r;
  }
  return it->second(request);
}

}  // namespace zshard
