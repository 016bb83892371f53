#include "server/status/access_gate.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/auth/token_digest.h"
#include "server/http/query_string.h"

namespace zerod::status {
namespace {

constexpr absl::string_view kCookiePrefix = "zerod_token_";
// Cookies looked at per request: a browser sends a handful; each costs a SHA-256.
constexpr int kMaxCookies = 16;

constexpr char kNeeds[] =
    "zerod's HTTP listener needs the viewer token (DATA_DIR/viewer.token) or the admin token: "
    "send 'Authorization: Bearer <token>' (Prometheus: authorization.credentials_file), or open "
    "/?token=<token> once in a browser (or zerod runs with --open-inspection)\n";

// The login page a refused / gets. Static: nothing from the request is put in it.
constexpr char kLoginPage[] = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>zerod status: token needed</title>
<style>
  body { font: 15px/1.5 system-ui, sans-serif; margin: 3em auto; max-width: 40em; padding: 0 1em; }
  input { font: inherit; width: 28em; max-width: 100%; }
  .muted { color: #666; }
</style>
</head>
<body>
<h1>zerod status</h1>
<p id="reason">REASON</p>
<form method="get" action="/">
  <label>Token <input name="token" type="password" autocomplete="off" autofocus required></label>
  <button type="submit">Open</button>
</form>
<p class="muted">The viewer token is in zerod's DATA_DIR/viewer.token (readable by the group
zerod's --viewer-group names); the admin token works too. This browser keeps it in a cookie until it
closes. Tools send it as <code>Authorization: Bearer &lt;token&gt;</code>.</p>
</body>
</html>
)html";

std::string LoginPage(bool presented) {
  std::string page = kLoginPage;
  page.replace(page.find("REASON"), 6,
               presented ? "The token given is neither this zerod's viewer token nor its admin "
                           "token."
                         : "This page needs zerod's viewer token or its admin token.");
  return page;
}

std::string CookieName(absl::string_view token) {
  return absl::StrCat(kCookiePrefix, server::auth::TokenDigest(token).substr(0, 12));
}

// The token of "Authorization: Bearer <token>" (the scheme in any case), "" when there is none.
std::string BearerToken(const http::Request& request) {
  const std::string authorization = request.Header("authorization");
  constexpr absl::string_view kScheme = "bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kScheme)) return "";
  return std::string(
      absl::StripAsciiWhitespace(absl::string_view(authorization).substr(kScheme.size())));
}

// The values of the request's zerod_token_* cookies, decoded.
std::vector<std::string> CookieTokens(const http::Request& request) {
  std::vector<std::string> tokens;
  const std::string cookies = request.Header("cookie");
  for (absl::string_view cookie : absl::StrSplit(cookies, ';', absl::SkipWhitespace())) {
    cookie = absl::StripAsciiWhitespace(cookie);
    const size_t eq = cookie.find('=');
    if (eq == absl::string_view::npos || !absl::StartsWith(cookie.substr(0, eq), kCookiePrefix)) {
      continue;
    }
    absl::string_view value = cookie.substr(eq + 1);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    // Percent-encoded when it was set (LoggedIn), so it holds no '+' to mistake for a space.
    tokens.push_back(http::FormDecode(value));
    if (tokens.size() == kMaxCookies) break;
  }
  return tokens;
}

bool IsPage(const http::Request& request) {
  return request.path == "/" || request.path == "/index.html";
}

http::Response Refused(const http::Request& request, bool presented) {
  http::Response r{401, "text/plain; charset=utf-8",
                   presented ? absl::StrCat("the token presented is not accepted: ", kNeeds)
                             : std::string(kNeeds)};
  // RFC 6750: error="invalid_token" when a token came and was not good.
  r.headers.emplace_back("WWW-Authenticate", presented
                                                 ? "Bearer realm=\"zerod\", error=\"invalid_token\""
                                                 : "Bearer realm=\"zerod\"");
  if (IsPage(request)) {
    r.content_type = "text/html; charset=utf-8";
    r.body = LoginPage(presented);
    r.headers.emplace_back("Content-Security-Policy",
                           "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                           "frame-ancestors 'none'");
  }
  return r;
}

// Where a login on `request` continues: its path (encoded, so nothing in it can end a header or
// name another host) and the rest of its query when that is plain.
std::string AfterLogin(const http::Request& request) {
  std::string target = http::PercentEncode(request.path, "/");
  // "//host" would be another site's address.
  if (!absl::StartsWith(target, "/") || absl::StartsWith(target, "//")) target = "/";
  const std::string rest = http::QueryWithout(request.query, "token");
  const bool plain = !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) {
    return absl::ascii_isalnum(c) ||
           absl::string_view("-._~%&=+").find(c) != absl::string_view::npos;
  });
  if (plain) absl::StrAppend(&target, "?", rest);
  return target;
}

http::Response LoggedIn(const http::Request& request, absl::string_view token) {
  const std::string target = AfterLogin(request);
  http::Response r{303, "text/plain; charset=utf-8",
                   absl::StrCat("token accepted: see ", target, "\n")};
  r.headers.emplace_back("Location", target);
  // A session cookie (gone when the browser closes); no Secure attribute, since the listener is
  // plain HTTP and a browser would not send a Secure cookie back to it.
  r.headers.emplace_back("Set-Cookie",
                         absl::StrCat(CookieName(token), "=", http::PercentEncode(token),
                                      "; Path=/; HttpOnly; SameSite=Strict"));
  return r;
}

}  // namespace

http::Gate AccessGate(TokenCheck accepts) {
  if (!accepts) return nullptr;
  return [accepts =
              std::move(accepts)](const http::Request& request) -> std::optional<http::Response> {
    if (std::optional<std::string> login = http::QueryValue(request.query, "token")) {
      if (accepts(*login)) return LoggedIn(request, *login);
      return Refused(request, /*presented=*/!login->empty());
    }
    bool presented = false;
    if (const std::string bearer = BearerToken(request); !bearer.empty()) {
      if (accepts(bearer)) return std::nullopt;
      presented = true;
    }
    // A cookie that does not pass counts as nothing presented: it may be another zerod's on the
    // same host.
    for (const std::string& token : CookieTokens(request)) {
      if (accepts(token)) return std::nullopt;
    }
    return Refused(request, presented);
  };
}

}  // namespace zerod::status
