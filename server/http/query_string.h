#ifndef ZEROD_SERVER_HTTP_QUERY_STRING_H_
#define ZEROD_SERVER_HTTP_QUERY_STRING_H_

// Percent-encoding both ways, and the parameters of a query string ("a=1&id=x") as a browser's
// form sends them.

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace zerod::http {

// application/x-www-form-urlencoded decoding: '+' is a space, %XX a byte; a '%' not followed by
// two hex digits is kept as it is.
std::string FormDecode(absl::string_view in);

// `in` with every byte outside RFC 3986's unreserved characters (A-Z a-z 0-9 - . _ ~) and
// `keep` as %XX.
std::string PercentEncode(absl::string_view in, absl::string_view keep = "");

// The value of the first parameter `name` in `query`, decoded; nullopt when there is none
// ("name" alone, without '=', counts as absent).
std::optional<std::string> QueryValue(absl::string_view query, absl::string_view name);

// `query` without its parameters named `name`, the others as they were sent.
std::string QueryWithout(absl::string_view query, absl::string_view name);

}  // namespace zerod::http

#endif  // ZEROD_SERVER_HTTP_QUERY_STRING_H_
