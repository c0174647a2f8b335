#include "server/metrics/http_server.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"

namespace zshard {
namespace {

TEST(HttpServerTest, ServesHandlersByPathAndRefusesTheRest) {
  std::map<std::string, HttpServer::Handler> handlers;
  handlers["/hello"] = [](const HttpRequest& req) {
    HttpResponse r;
    r.body = "hello " + req.authorization;
    return r;
  };
  auto s = HttpServer::Start("127.0.0.1:0", handlers, "--test_listen");
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  ASSERT_GT(port, 0);
  const std::string ok = testing::HttpExchange(
      port, "GET /hello?x=1 HTTP/1.0\r\nAuthorization: Bearer abc\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.0 200") ||
              absl::StartsWith(ok, "HTTP/1.1 200"))
      << ok;
  EXPECT_TRUE(absl::EndsWith(ok, "hello Bearer abc")) << ok;
  EXPECT_TRUE(absl::StrContains(
      testing::HttpExchange(port, "GET /nope HTTP/1.0\r\n\r\n"), " 404 "));
  EXPECT_TRUE(absl::StrContains(
      testing::HttpExchange(
          port, "POST /hello HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc"),
      " 405 "));
  // A request that does not parse gets 400 or a closed connection, and the
  // server goes on serving.
  const std::string garbage = testing::HttpExchange(port, "garbage\r\n\r\n");
  EXPECT_TRUE(garbage.empty() || absl::StrContains(garbage, " 400 "))
      << garbage;
  EXPECT_TRUE(absl::EndsWith(
      testing::HttpExchange(port, "GET /hello HTTP/1.0\r\n\r\n"), "hello "));
}

TEST(HttpServerTest, BadAddressesAndTakenPortsAreRefusedNamingTheFlag) {
  for (const char* bad : {"nonsense", "127.0.0.1", "127.0.0.1:70000",
                          "localhost:80", "127.0.0.1:-1"}) {
    auto s = HttpServer::Start(bad, {}, "--test_listen");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.status().message(), "--test_listen"));
  }
  auto first = HttpServer::Start("127.0.0.1:0", {}, "--test_listen");
  ASSERT_TRUE(first.ok());
  auto second = HttpServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()),
                                  {}, "--test_listen");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace zshard
