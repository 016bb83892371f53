#include "server/http/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/internal/listen_address.h"
#include "server/logging.h"

namespace zerod::http {
namespace {

// What one request carries between libmicrohttpd's callbacks: the raw URI (its query is taken from
// here, undecoded, as the client sent it).
struct RequestState {
  std::string uri;
};

void* RememberUri(void* /*cls*/, const char* uri, MHD_Connection* /*connection*/) {
  return new RequestState{uri == nullptr ? "" : uri};
}

void ForgetRequest(void* /*cls*/, MHD_Connection* /*connection*/, void** req_cls,
                   MHD_RequestTerminationCode /*code*/) {
  delete static_cast<RequestState*>(*req_cls);
  *req_cls = nullptr;
}

void LogToSpdlog(void* /*cls*/, const char* format, va_list args) {
  char line[512];
  std::vsnprintf(line, sizeof(line), format, args);
  std::string text(line);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  server::Logger("http")->warn("{}", text);
}

MHD_Result Queue(MHD_Connection* connection, const Response& response) {
  MHD_Response* r = MHD_create_response_from_buffer(
      response.body.size(), const_cast<char*>(response.body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, response.content_type.c_str());
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  for (const auto& [name, value] : response.headers) {
    // libmicrohttpd refuses a value with a line break in it; the response goes out without it.
    if (MHD_add_response_header(r, name.c_str(), value.c_str()) != MHD_YES) {
      server::Logger("http")->error("response header {} not sent: refused by libmicrohttpd", name);
    }
  }
  if (response.status == MHD_HTTP_METHOD_NOT_ALLOWED) {
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned int>(response.status), r);
  MHD_destroy_response(r);
  return queued;
}

// A request announcing a body (a length above zero, or chunks of unknown length).
bool AnnouncesBody(MHD_Connection* connection) {
  if (MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) !=
      nullptr) {
    return true;
  }
  const char* length =
      MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t bytes = 0;
  return length != nullptr && (!absl::SimpleAtoi(length, &bytes) || bytes > 0);
}

MHD_Result CollectHeader(void* cls, MHD_ValueKind /*kind*/, const char* key, const char* value) {
  if (key == nullptr) return MHD_YES;
  auto& headers = *static_cast<std::map<std::string, std::string>*>(cls);
  const std::string name = absl::AsciiStrToLower(key);
  const std::string text = value == nullptr ? "" : value;
  auto [it, added] = headers.emplace(name, text);
  if (!added) absl::StrAppend(&it->second, name == "cookie" ? "; " : ", ", text);
  return MHD_YES;
}

MHD_Result Answer(void* cls, MHD_Connection* connection, const char* url, const char* method,
                  const char* /*version*/, const char* /*upload_data*/, size_t* upload_data_size,
                  void** req_cls) {
  const auto* server = static_cast<const HttpServer*>(cls);
  Request request;
  request.method = method;
  request.path = url;
  if (const auto* state = static_cast<const RequestState*>(*req_cls); state != nullptr) {
    if (const size_t q = state->uri.find('?'); q != std::string::npos) {
      request.query = state->uri.substr(q + 1);
    }
  }
  // Bounded by libmicrohttpd's per-connection memory, which a request's headers must fit in.
  MHD_get_connection_values(connection, MHD_HEADER_KIND, &CollectHeader, &request.headers);
  // Answered on the first call, before any body is read: libmicrohttpd then closes the connection
  // instead of reading what the client meant to send.
  if (*upload_data_size != 0 || AnnouncesBody(connection)) {
    const bool known_method = request.method == "GET" || request.method == "HEAD";
    return Queue(connection, known_method ? Response{413, "text/plain; charset=utf-8",
                                                     "a request body is not accepted\n"}
                                          : server->Dispatch(request));
  }
  return Queue(connection, server->Dispatch(request));
}

}  // namespace

absl::Status CheckListenAddress(const std::string& address) {
  return internal::ParseListenAddress(address).status();
}

std::string Request::Header(absl::string_view lower_case_name) const {
  auto it = headers.find(std::string(lower_case_name));
  return it == headers.end() ? std::string() : it->second;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::SetGate(Gate gate) { gate_ = std::move(gate); }

void HttpServer::Route(std::string path, Handler handler) {
  routes_[std::move(path)] = std::move(handler);
}

Response HttpServer::Dispatch(const Request& request) const {
  try {
    if (gate_) {
      if (std::optional<Response> refused = gate_(request)) return *std::move(refused);
    }
    return FromRoutes(request);
  } catch (const std::exception& e) {
    // A handler's failure answers one request; it must not end the daemon.
    server::Logger("http")->error("{} {}: {}", request.method, request.path, e.what());
    return Response{500, "text/plain; charset=utf-8", "internal error\n"};
  }
}

Response HttpServer::FromRoutes(const Request& request) const {
  if (request.method != "GET" && request.method != "HEAD") {
    return Response{405, "text/plain; charset=utf-8",
                    absl::StrCat("method ", request.method, " not allowed: GET or HEAD only\n")};
  }
  const Handler* best = nullptr;
  size_t best_length = 0;
  for (const auto& [route, handler] : routes_) {
    const bool matches = request.path == route ||
                         (!route.empty() && route.back() == '/' && request.path.starts_with(route));
    if (matches && (best == nullptr || route.size() > best_length)) {
      best = &handler;
      best_length = route.size();
    }
  }
  if (best == nullptr) {
    return Response{404, "text/plain; charset=utf-8",
                    absl::StrCat("no such path: ", request.path, "\n")};
  }
  return (*best)(request);
}

absl::Status HttpServer::Start(const std::string& address) {
  if (daemon_ != nullptr) return absl::FailedPreconditionError("HTTP server already started");
  auto parsed = internal::ParseListenAddress(address);
  if (!parsed.ok()) return parsed.status();
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
  if (parsed->family == AF_INET6) flags |= MHD_USE_IPv6;
  if (parsed->any) flags |= MHD_USE_DUAL_STACK;
  std::vector<MHD_OptionItem> items = {
      {MHD_OPTION_SOCK_ADDR, 0, &parsed->storage},
      {MHD_OPTION_CONNECTION_LIMIT, options_.max_connections, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT,
       static_cast<intptr_t>(
           std::max<int64_t>(1, absl::ToInt64Seconds(options_.connection_timeout))),
       nullptr},
      {MHD_OPTION_URI_LOG_CALLBACK, reinterpret_cast<intptr_t>(&RememberUri), nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&ForgetRequest), nullptr},
  };
  if (options_.threads > 1) {
    items.push_back({MHD_OPTION_THREAD_POOL_SIZE, options_.threads, nullptr});
  }
  items.push_back({MHD_OPTION_END, 0, nullptr});
  // The logger first, or libmicrohttpd prints the options' errors to stderr itself.
  daemon_ = MHD_start_daemon(flags, 0, nullptr, nullptr, &Answer, this, MHD_OPTION_EXTERNAL_LOGGER,
                             &LogToSpdlog, nullptr, MHD_OPTION_ARRAY, items.data(), MHD_OPTION_END);
  if (daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", address, " (address in use or not permitted?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
  port_ = info == nullptr ? 0 : info->port;
  server::Logger("http")->info("HTTP listening on {}:{}", parsed->host, port_);
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (daemon_ == nullptr) return;
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
}

}  // namespace zerod::http
