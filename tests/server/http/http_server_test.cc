// HttpServer on a real loopback socket: routing, the methods and bodies it refuses, its bounds.

#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/test_time.h"

namespace zerod::http {
namespace {

using ::testing::HasSubstr;

Handler Says(std::string text) {
  return [text](const Request& r) {
    return Response{200, "text/plain",
                    absl::StrCat(text, " ", r.method, " ", r.path, " ?", r.query)};
  };
}

// A raw TCP connection, for what an HTTP library would not send.
class RawConnection {
 public:
  explicit RawConnection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawConnection() { close(fd_); }
  bool connected() const { return connected_; }
  void Send(const std::string& text) {
    ASSERT_EQ(write(fd_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  // Whether something (or the end) arrives within `wait`.
  bool Readable(absl::Duration wait) {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) > 0;
  }
  // Everything until the server closes the connection.
  std::string ReadAll() {
    std::string out;
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd_, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
    return out;
  }

 private:
  int fd_;
  bool connected_ = false;
};

TEST(HttpServer, ExactAndPrefixRoutesTheLongestWinning) {
  HttpServer server;
  server.Route("/metrics", Says("metrics"));
  server.Route("/", Says("root"));
  server.Route("/api/", Says("api"));
  server.Route("/api/jobs/", Says("jobs"));
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  ASSERT_GT(server.port(), 0);
  httplib::Client client("127.0.0.1", server.port());
  const auto body = [&client](const std::string& path) {
    auto r = client.Get(path.c_str());
    return r ? absl::StrCat(r->status, " ", r->body) : std::string("no answer");
  };
  EXPECT_EQ(body("/metrics"), "200 metrics GET /metrics ?");
  EXPECT_EQ(body("/metrics?x=1&y=%20"), "200 metrics GET /metrics ?x=1&y=%20");
  EXPECT_EQ(body("/"), "200 root GET / ?");
  EXPECT_EQ(body("/anything/below"), "200 root GET /anything/below ?");
  EXPECT_EQ(body("/api/jobs/llama"), "200 jobs GET /api/jobs/llama ?");
  EXPECT_EQ(body("/api/other"), "200 api GET /api/other ?");
  EXPECT_EQ(body("/metrics/x"), "200 root GET /metrics/x ?") << "/metrics is exact";
}

TEST(HttpServer, UnknownPathsAre404AndHeadHasNoBody) {
  HttpServer server;
  server.Route("/metrics", Says("metrics"));
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  httplib::Client client("127.0.0.1", server.port());
  auto missing = client.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("no such path: /nope"));
  auto head = client.Head("/metrics");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
}

TEST(HttpServer, OnlyGetAndHeadAreAllowed) {
  HttpServer server;
  server.Route("/", Says("root"));
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  httplib::Client client("127.0.0.1", server.port());
  std::vector<httplib::Result> answers;
  answers.push_back(client.Post("/", "", "text/plain"));
  answers.push_back(client.Put("/", "", "text/plain"));
  answers.push_back(client.Delete("/"));
  answers.push_back(client.Options("/"));
  for (const httplib::Result& r : answers) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD");
  }
}

TEST(HttpServer, ARequestBodyIsRefusedUnread) {
  HttpServer server;
  std::atomic<int> calls{0};
  server.Route("/", [&calls](const Request&) {
    ++calls;
    return Response{};
  });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  {
    RawConnection c(server.port());
    ASSERT_TRUE(c.connected());
    c.Send("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    EXPECT_THAT(c.ReadAll(), HasSubstr("HTTP/1.1 413"));
  }
  {
    RawConnection c(server.port());
    c.Send(
        "GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    EXPECT_THAT(c.ReadAll(), HasSubstr("HTTP/1.1 413"));
  }
  {
    RawConnection c(server.port());
    c.Send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    EXPECT_THAT(c.ReadAll(), HasSubstr("HTTP/1.1 405"));
  }
  EXPECT_EQ(calls.load(), 0);
}

TEST(HttpServer, AnIdleConnectionIsClosedAtTheTimeout) {
  HttpServer server(HttpServerOptions{.connection_timeout = absl::Seconds(1)});
  server.Route("/", Says("root"));
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  RawConnection c(server.port());
  ASSERT_TRUE(c.connected());
  c.Send("GET / HTTP/1.1\r\nHost: x\r\n");  // never finished
  const absl::Time start = absl::Now();
  EXPECT_EQ(c.ReadAll(), "") << "closed, with nothing answered";
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a generous bound for a loaded machine";
}

// Past the limit, connections wait in the kernel's backlog, costing the daemon nothing, and are
// served once a slot frees.
TEST(HttpServer, ConnectionsBeyondTheLimitWaitUntilOneEnds) {
  HttpServer server(HttpServerOptions{.threads = 1, .max_connections = 1});
  server.Route("/", Says("root"));
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  RawConnection a(server.port());
  a.Send("GET / HTTP/1.1\r\nHost: x\r\n");  // held open, unfinished
  // Accepted before the second arrives (else the second would be served first).
  absl::SleepFor(zerod::testing::Scaled(absl::Milliseconds(200)));
  RawConnection b(server.port());
  ASSERT_TRUE(b.connected());
  b.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_FALSE(b.Readable(absl::Milliseconds(500))) << "not served while a holds the only slot";
  a.Send("\r\n");
  EXPECT_THAT(a.ReadAll(), HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(b.ReadAll(), HasSubstr("HTTP/1.1 200"));
}

TEST(HttpServer, AHandlerThatThrowsAnswers500AndTheServerGoesOn) {
  HttpServer server;
  server.Route("/boom", [](const Request&) -> Response { throw std::runtime_error("boom"); });
  server.Route("/ok", Says("ok"));
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  httplib::Client client("127.0.0.1", server.port());
  auto boom = client.Get("/boom");
  ASSERT_TRUE(boom);
  EXPECT_EQ(boom->status, 500);
  auto ok = client.Get("/ok");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(HttpServer, RequestHeadersReachTheRoutesAndResponseHeadersGoOut) {
  HttpServer server;
  server.Route("/echo", [](const Request& r) {
    Response response{200, "text/plain",
                      absl::StrCat(r.Header("authorization"), "|", r.Header("cookie"), "|",
                                   r.Header("x-absent"))};
    response.headers = {{"Location", "/elsewhere"}, {"Set-Cookie", "a=1; HttpOnly"}};
    return response;
  });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  {
    httplib::Client client("127.0.0.1", server.port());
    auto r = client.Get("/echo", {{"Authorization", "Bearer t0k"}, {"Cookie", "a=1; b=2"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "Bearer t0k|a=1; b=2|");
    EXPECT_EQ(r->get_header_value("Location"), "/elsewhere");
    EXPECT_EQ(r->get_header_value("Set-Cookie"), "a=1; HttpOnly");
  }
  // Names in any case; a cookie header sent twice is one list.
  RawConnection c(server.port());
  c.Send(
      "GET /echo HTTP/1.1\r\nHost: x\r\nAUTHORIZATION: Bearer b\r\nCookie: a=1\r\n"
      "cookie: b=2\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(c.ReadAll(), HasSubstr("Bearer b|a=1; b=2|"));
}

TEST(HttpServer, TheGateAnswersBeforeAnyRouteAndLetsThroughWhatItPasses) {
  HttpServer server;
  std::atomic<int> routed{0};
  server.Route("/", [&routed](const Request&) {
    ++routed;
    return Response{200, "text/plain", "in\n"};
  });
  server.SetGate([](const Request& r) -> std::optional<Response> {
    if (r.Header("authorization") == "Bearer good") return std::nullopt;
    Response refused{401, "text/plain", "no\n"};
    refused.headers = {{"WWW-Authenticate", "Bearer"}};
    return refused;
  });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  httplib::Client client("127.0.0.1", server.port());
  auto refused = client.Get("/anything");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(refused->get_header_value("WWW-Authenticate"), "Bearer");
  auto post = client.Post("/", "", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 401) << "before the method is looked at";
  EXPECT_EQ(routed.load(), 0);
  auto passed = client.Get("/", {{"Authorization", "Bearer good"}});
  ASSERT_TRUE(passed);
  EXPECT_EQ(passed->status, 200);
  EXPECT_EQ(routed.load(), 1);
}

TEST(HttpServer, BadAddressesAreNamedAndAPortInUseIsUnavailable) {
  HttpServer server;
  for (const char* bad : {"nocolon", "127.0.0.1:http", "127.0.0.1:70000", "::1:80"}) {
    const absl::Status s = server.Start(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr(bad));
  }
  HttpServer first;
  ASSERT_TRUE(first.Start("127.0.0.1:0").ok());
  const absl::Status taken = server.Start(absl::StrCat("127.0.0.1:", first.port()));
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable) << taken;
  EXPECT_THAT(std::string(taken.message()), HasSubstr("cannot listen for HTTP"));
}

TEST(HttpServer, ListensOnIpv6LoopbackAndStopIsIdempotent) {
  HttpServer server;
  server.Route("/", Says("root"));
  const absl::Status started = server.Start("[::1]:0");
  if (!started.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << started;
  httplib::Client client("::1", server.port());
  auto r = client.Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  server.Stop();
  server.Stop();
}

}  // namespace
}  // namespace zerod::http
