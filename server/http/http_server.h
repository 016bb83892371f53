#ifndef ZEROD_SERVER_HTTP_HTTP_SERVER_H_
#define ZEROD_SERVER_HTTP_HTTP_SERVER_H_

// HttpServer: zerod's read-only HTTP listener (/metrics, the status page), libmicrohttpd
// underneath.
//
// Defended for a listener that may face a network: GET and HEAD only (405 otherwise), no request
// body accepted (413), a bounded number of connections, a per-connection timeout, 404 for a path no
// route covers, and a gate (SetGate: who may ask at all) in front of every route. Handlers run on
// libmicrohttpd's thread pool, concurrently: they must be thread-safe and must not block for long.
//
// Owns libmicrohttpd's threads: started by Start, stopped (after in-flight handlers return) by Stop
// or the destructor.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct MHD_Daemon;

namespace zerod::http {

struct Request {
  std::string method;
  std::string path;  // without the query
  std::string query;
  // By lower-case name; a header sent more than once has its values joined by ", " (by "; " for
  // cookie, as RFC 6265 joins them).
  std::map<std::string, std::string> headers;

  // The value of the header `lower_case_name`, "" when it was not sent.
  std::string Header(absl::string_view lower_case_name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // Sent besides Content-Type and the ones every response carries (Cache-Control: no-store, ...):
  // Location, Set-Cookie, WWW-Authenticate.
  std::vector<std::pair<std::string, std::string>> headers;
};

using Handler = std::function<Response(const Request&)>;

// Asked before the routes about every request: a response is the answer and no route runs;
// nullopt lets the request through. Runs on the handlers' threads, so it must be thread-safe.
using Gate = std::function<std::optional<Response>(const Request&)>;

struct HttpServerOptions {
  int threads = 2;
  int max_connections = 64;
  absl::Duration connection_timeout = absl::Seconds(10);
};

// INVALID_ARGUMENT naming what is wrong with `address` (HttpServer::Start's syntax); for checking
// a flag before anything starts.
absl::Status CheckListenAddress(const std::string& address);

class HttpServer {
 public:
  HttpServer() = default;
  explicit HttpServer(HttpServerOptions options) : options_(options) {}
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes must be added before Start. A route matches its exact path, or any path below it
  // when it ends in '/'; the longest match wins.
  void Route(std::string path, Handler handler);
  // The gate every request passes first (405 and 404 included: a stranger learns nothing about
  // the routes). Set before Start; none by default.
  void SetGate(Gate gate);
  // "127.0.0.1:9464", "[::1]:0", ":9464" (every address). Port 0 picks a free port.
  absl::Status Start(const std::string& address);
  int port() const { return port_; }  // the bound port (useful with :0)
  void Stop();                        // idempotent; also in the destructor

  // The response for `request` from the gate and the routes (404/405 included); what a
  // connection gets.
  Response Dispatch(const Request& request) const;

 private:
  // Dispatch past the gate: 405, 404, or the route's answer.
  Response FromRoutes(const Request& request) const;

  HttpServerOptions options_;
  std::map<std::string, Handler> routes_;
  Gate gate_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace zerod::http

#endif  // ZEROD_SERVER_HTTP_HTTP_SERVER_H_
