#include "server/metrics/text_format.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace zerod::metrics {
namespace {

bool IsNameChar(char c, bool first, bool colon_allowed) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (c == ':') return colon_allowed;
  return !first && c >= '0' && c <= '9';
}

std::string Escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, /*colon_allowed=*/true)) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, /*colon_allowed=*/false)) return false;
  }
  return true;
}

std::string EscapeHelp(std::string_view help) { return Escape(help, /*quote=*/false); }

std::string EscapeLabelValue(std::string_view value) { return Escape(value, /*quote=*/true); }

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Exact integers (counts, bytes, steps) as integers; 2^53 is where doubles stop being exact.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  // The shortest text that reads back as the same double.
  char buffer[64];
  char* end = std::to_chars(buffer, buffer + sizeof(buffer), value).ptr;
  return std::string(buffer, end);
}

void TextWriter::Header(std::string_view name, std::string_view help, std::string_view type) {
  // std::string appends: Debian's abseil takes absl::string_view, not std::string_view.
  text_.append("# HELP ").append(name).append(" ").append(EscapeHelp(help));
  text_.append("\n# TYPE ").append(name).append(" ").append(type).append("\n");
}

void TextWriter::Sample(std::string_view name, const Labels& labels, double value) {
  text_.append(name);
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      text_.append(i == 0 ? "" : ",").append(labels[i].first).append("=\"");
      text_.append(EscapeLabelValue(labels[i].second)).append("\"");
    }
    text_ += '}';
  }
  text_.append(" ").append(FormatValue(value)).append("\n");
}

}  // namespace zerod::metrics
