#include "server/http/query_string.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace zerod::http {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string FormDecode(absl::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out += ' ';
    } else if (in[i] == '%' && i + 2 < in.size() && HexValue(in[i + 1]) >= 0 &&
               HexValue(in[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(in[i + 1]) * 16 + HexValue(in[i + 2]));
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

std::string PercentEncode(absl::string_view in, absl::string_view keep) {
  constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : in) {
    const bool unreserved = absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || keep.find(c) != absl::string_view::npos) {
      out += c;
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  return out;
}

std::optional<std::string> QueryValue(absl::string_view query, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(query, '&')) {
    const size_t eq = pair.find('=');
    if (eq != absl::string_view::npos && pair.substr(0, eq) == name) {
      return FormDecode(pair.substr(eq + 1));
    }
  }
  return std::nullopt;
}

std::string QueryWithout(absl::string_view query, absl::string_view name) {
  std::vector<absl::string_view> kept;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    if (pair.substr(0, pair.find('=')) != name) kept.push_back(pair);
  }
  return absl::StrJoin(kept, "&");
}

}  // namespace zerod::http
