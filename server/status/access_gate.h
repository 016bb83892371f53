#ifndef ZEROD_SERVER_STATUS_ACCESS_GATE_H_
#define ZEROD_SERVER_STATUS_ACCESS_GATE_H_

// Who may use zerod's HTTP listener (/metrics, the status page): whoever presents the viewer or
// the admin token, the same gate as the read-only gRPC views over TCP (docs/ARCHITECTURE.md
// "Authentication and authorization"). A job's own token is not enough: the page lists every job.
//
// How a token comes:
//   Authorization: Bearer <token>   an HTTP client; what Prometheus sends from a scrape config's
//                                   authorization.credentials_file
//   GET <path>?token=<token>        a browser, once (or the form a refused / shows): answered 303
//                                   to <path> without the token, setting a cookie that holds it,
//                                   so the token leaves the address bar and the history
//   Cookie: zerod_token_<id>=...    that cookie: HttpOnly (the page's scripts never see it),
//                                   SameSite=Strict (no other site can make the browser send it).
//                                   <id> is a digest prefix of the token: cookies are shared by
//                                   every port of a host, and two zerods tunnelled to localhost
//                                   must not overwrite each other's.
// Anything else is 401 with WWW-Authenticate: Bearer and a line saying what is needed; / gets a
// small HTML page with a form for the token instead.

#include <functional>

#include "absl/strings/string_view.h"
#include "server/http/http_server.h"

namespace zerod::status {

// Whether `token` is the viewer or the admin token; must compare in constant time
// (auth::JobTokens::IsViewerOrAdmin).
using TokenCheck = std::function<bool(absl::string_view token)>;

// The gate for HttpServer::SetGate. `accepts` null: inspection is open (--open-inspection, or
// authentication off) and every request passes.
http::Gate AccessGate(TokenCheck accepts);

}  // namespace zerod::status

#endif  // ZEROD_SERVER_STATUS_ACCESS_GATE_H_
